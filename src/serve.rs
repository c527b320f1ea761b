//! The dev server: the built site on 127.0.0.1, with rebuild on change and live reload.
//!
//! HTTP is hyper's (HTTP/1.1 on tokio). Every connection is bounded: at most
//! [`Options::max_connections`] at once (one more is answered 503 and closed), the request
//! head within [`Options::header_timeout`] and at most [`MAX_HEAD_BYTES`], the whole exchange
//! within [`Options::request_timeout`], one request per connection, and no request body read.
//! Only files inside the site directory are served: the URL path may not climb out of it, and
//! a symbolic link that leads out of it is not followed.
//!
//! Pages served here get a script (`/__gpumem/reload.js`) that polls `/__gpumem/version`; a
//! rebuild bumps the version and the open pages reload. The built site itself carries no
//! such script. Every response carries a strict Content-Security-Policy ([`CSP`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use crate::{build_book, Paths, Result};

/// What live reload adds to a page: a script from the server itself (no inline script, so
/// the policy below holds in development too).
const RELOAD_TAG: &str = r#"<script src="/__gpumem/reload.js"></script>"#;

/// The live-reload script: poll the version, reload when it changes.
const RELOAD_JS: &str = r#"(function(){var v=null;setInterval(function(){fetch("/__gpumem/version",{cache:"no-store"}).then(function(r){return r.text()}).then(function(t){if(v!==null&&t!==v){location.reload()}v=t}).catch(function(){})},500)})();
"#;

/// The Content-Security-Policy every response carries: scripts only from the site itself
/// (and the widgets' WebAssembly compiled), no plugins, no other base. The built site needs
/// nothing more, and serving it this way keeps it so.
pub const CSP: &str = "script-src 'self' 'wasm-unsafe-eval'; object-src 'none'; base-uri 'self'";

/// The longest request head (request line and headers) read, far above what a browser sends
/// (cookies included). A longer one is answered 414 or 431 and the connection closed.
pub const MAX_HEAD_BYTES: usize = 32 << 10;

/// How the server bounds its clients.
#[derive(Clone, Debug)]
pub struct Options {
    /// Add the live-reload script to HTML pages.
    pub live_reload: bool,
    /// Connections served at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// The request line and headers must arrive within this.
    pub header_timeout: Duration,
    /// The whole exchange, response sent included, must end within this.
    pub request_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            live_reload: false,
            max_connections: 64,
            header_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// Serve `dir` until the process ends. `version` is what the reload script polls;
/// `live_reload` adds that script to HTML pages.
pub fn serve_dir(
    listener: std::net::TcpListener,
    dir: PathBuf,
    version: Arc<AtomicU64>,
    live_reload: bool,
) -> Result<()> {
    let opts = Options {
        live_reload,
        ..Options::default()
    };
    serve_dir_with(listener, dir, version, opts)
}

/// [`serve_dir`] with explicit bounds.
pub fn serve_dir_with(
    listener: std::net::TcpListener,
    dir: PathBuf,
    version: Arc<AtomicU64>,
    opts: Options,
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .enable_all()
        .build()?;
    rt.block_on(accept_loop(listener, dir, version, opts))
}

struct State {
    dir: PathBuf,
    version: Arc<AtomicU64>,
    live_reload: bool,
}

async fn accept_loop(
    listener: std::net::TcpListener,
    dir: PathBuf,
    version: Arc<AtomicU64>,
    opts: Options,
) -> Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let slots = Arc::new(tokio::sync::Semaphore::new(opts.max_connections));
    let state = Arc::new(State {
        dir,
        version,
        live_reload: opts.live_reload,
    });
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            // Out of file descriptors or a connection reset before it was accepted: wait a
            // little rather than spin.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            // Full: say so without waiting on the client, and close.
            let _ = stream.try_write(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\nConnection: close\r\n\r\n",
            );
            continue;
        };
        let (state, opts) = (state.clone(), opts.clone());
        tokio::spawn(async move {
            connection(stream, state, opts).await;
            drop(permit);
        });
    }
}

/// One connection, one request, within the timeouts.
async fn connection(stream: tokio::net::TcpStream, state: Arc<State>, opts: Options) {
    let head_read = Arc::new(AtomicBool::new(false));
    let service = {
        let head_read = head_read.clone();
        hyper::service::service_fn(move |req| {
            head_read.store(true, Ordering::SeqCst);
            respond(req, state.clone())
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    // The head must come within header_timeout, whether or not a first byte ever does.
    tokio::select! {
        _ = &mut conn => return,
        _ = tokio::time::sleep(opts.header_timeout) => {}
    }
    if !head_read.load(Ordering::SeqCst) {
        return;
    }
    let rest = opts.request_timeout.saturating_sub(opts.header_timeout);
    let _ = tokio::time::timeout(rest, conn).await;
}

async fn respond(
    req: Request<Incoming>,
    state: Arc<State>,
) -> std::result::Result<Response<Full<Bytes>>, Infallible> {
    let plain = |status: StatusCode, body: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    // A request body is never read: only GET and HEAD are served.
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    let path = req.uri().path().to_string();
    if path == "/__gpumem/version" {
        let v = state.version.load(Ordering::SeqCst).to_string();
        return Ok(with_headers(
            Response::new(Full::new(Bytes::from(v))),
            "text/plain",
        ));
    }
    if path == "/__gpumem/reload.js" && state.live_reload {
        return Ok(with_headers(
            Response::new(Full::new(Bytes::from_static(RELOAD_JS.as_bytes()))),
            "text/javascript; charset=utf-8",
        ));
    }
    let found = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || page(&state, &path)).await
    };
    Ok(match found {
        Ok(Some((status, ctype, body))) => {
            let mut r = Response::new(Full::new(Bytes::from(body)));
            *r.status_mut() = status;
            with_headers(r, ctype)
        }
        Ok(None) => plain(StatusCode::NOT_FOUND, "not found\n"),
        Err(_) => plain(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n"),
    })
}

fn with_headers(mut r: Response<Full<Bytes>>, ctype: &'static str) -> Response<Full<Bytes>> {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(ctype),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(CSP),
    );
    r
}

/// The status, type and bytes for a URL path: its file, or the site's 404 page.
fn page(state: &State, url_path: &str) -> Option<(StatusCode, &'static str, Vec<u8>)> {
    let (status, file) = match inside(&state.dir, url_path) {
        Some(f) => (StatusCode::OK, f),
        None => (StatusCode::NOT_FOUND, inside(&state.dir, "/404.html")?),
    };
    let mut body = std::fs::read(&file).ok()?;
    let ctype = content_type(&file);
    if state.live_reload && ctype.starts_with("text/html") {
        let text = String::from_utf8_lossy(&body);
        let injected = match text.rfind("</body>") {
            Some(i) => format!("{}{RELOAD_TAG}{}", &text[..i], &text[i..]),
            None => format!("{text}{RELOAD_TAG}"),
        };
        body = injected.into_bytes();
    }
    Some((status, ctype, body))
}

/// The regular file a URL path names inside `dir`, once every symbolic link on the way is
/// resolved; `None` when the path climbs out, a link leads out, or there is no such file.
pub fn inside(dir: &Path, url_path: &str) -> Option<PathBuf> {
    let root = dir.canonicalize().ok()?;
    let mut real = resolve(&root, url_path)?.canonicalize().ok()?;
    if real.is_dir() {
        real = real.join("index.html").canonicalize().ok()?;
    }
    (real.starts_with(&root) && real.is_file()).then_some(real)
}

/// Bind, print the URL, watch the book's sources and rebuild on change.
pub fn run(p: Paths, addr: SocketAddr) -> Result<()> {
    let listener =
        std::net::TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr()?;
    let version = Arc::new(AtomicU64::new(1));
    {
        let (dir, v) = (p.dest.clone(), version.clone());
        std::thread::spawn(move || {
            if let Err(e) = serve_dir(listener, dir, v, true) {
                eprintln!("gpumem: the server stopped: {e}");
            }
        });
    }
    println!("gpumem: serving the book at http://{local}/ (Ctrl-C to stop)");
    println!("gpumem: watching book/, book.toml and widgets/*.css; edits rebuild and reload");
    let mut seen = snapshot(&p.root);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = snapshot(&p.root);
        if now == seen {
            continue;
        }
        seen = now;
        match build_book(&p) {
            Ok(t) => {
                version.fetch_add(1, Ordering::SeqCst);
                println!("gpumem: rebuilt in {:.2} s", t.as_secs_f64());
            }
            // The previous site stays served; the message names file and line.
            Err(e) => eprintln!("gpumem: build failed, still serving the last good site:\n{e}"),
        }
    }
}

/// Modification times of everything the book build reads besides Rust code.
fn snapshot(root: &Path) -> Vec<(PathBuf, SystemTime)> {
    let mut out = Vec::new();
    let mut stack = vec![root.join("book"), root.join("widgets")];
    let toml = root.join("book.toml");
    if let Ok(m) = std::fs::metadata(&toml).and_then(|m| m.modified()) {
        out.push((toml, m));
    }
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let path = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                if !path.ends_with("src") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|x| x != "rs") {
                if let Ok(m) = e.metadata().and_then(|m| m.modified()) {
                    out.push((path, m));
                }
            }
        }
    }
    out.sort();
    out
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "wasm" => "application/wasm",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "woff" => "font/woff",
        "ttf" => "font/ttf",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// `%xx` decoding of a URL path; `None` for malformed escapes or non-UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The path a URL path names inside `dir`, lexically: anything that climbs (`..`, encoded or
/// not), a backslash or a NUL is refused. Symbolic links are [`inside`]'s business.
pub fn resolve(dir: &Path, url_path: &str) -> Option<PathBuf> {
    let path = url_path.split(['?', '#']).next().unwrap_or("");
    let decoded = percent_decode(path)?;
    let mut out = dir.to_path_buf();
    for part in decoded.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            p if p.contains('\\') || p.contains('\0') => return None,
            p => out.push(p),
        }
    }
    if out.is_dir() {
        out.push("index.html");
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_site() {
        let d = Path::new("/site");
        assert_eq!(
            resolve(d, "/a/b.html?x#y"),
            Some(PathBuf::from("/site/a/b.html"))
        );
        assert_eq!(
            resolve(d, "/a%20b.css"),
            Some(PathBuf::from("/site/a b.css"))
        );
        assert_eq!(resolve(d, "/../etc/passwd"), None);
        assert_eq!(resolve(d, "/%2e%2e/etc/passwd"), None);
        assert_eq!(resolve(d, "/a/%2e%2e%2f%2e%2e/x"), None);
        assert_eq!(resolve(d, "/%zz"), None);
        assert_eq!(resolve(d, "/a\\..\\b"), None);
        assert_eq!(resolve(d, "/a%00.html"), None);
        // An absolute path in the URL stays under the site.
        assert_eq!(
            resolve(d, "//etc/passwd"),
            Some(PathBuf::from("/site/etc/passwd"))
        );
    }
}
