//! A small static server for the built site, with rebuild on change and live reload.
//!
//! Pages served here get a few lines of script that poll `/__gpumem/version`; a rebuild bumps
//! the version and the open pages reload. The built site itself carries no such script.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::{build_book, Paths, Result};

const RELOAD_SCRIPT: &str = r#"<script>(function(){var v=null;setInterval(function(){fetch("/__gpumem/version",{cache:"no-store"}).then(function(r){return r.text()}).then(function(t){if(v!==null&&t!==v){location.reload()}v=t}).catch(function(){})},500)})();</script>"#;

/// Serve `dir` on `addr` until the process ends. `version` is what the reload script polls;
/// `live_reload` adds that script to HTML pages.
pub fn serve_dir(
    listener: TcpListener,
    dir: PathBuf,
    version: Arc<AtomicU64>,
    live_reload: bool,
) -> Result<()> {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let dir = dir.clone();
        let version = version.clone();
        std::thread::spawn(move || {
            let _ = handle(stream, &dir, &version, live_reload);
        });
    }
    Ok(())
}

/// Bind, print the URL, watch the book's sources and rebuild on change.
pub fn run(p: Paths, addr: SocketAddr) -> Result<()> {
    let listener = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr()?;
    let version = Arc::new(AtomicU64::new(1));
    {
        let (dir, v) = (p.dest.clone(), version.clone());
        std::thread::spawn(move || serve_dir(listener, dir, v, true));
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

/// The file a URL path names inside `dir`, refusing anything that climbs out of it.
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

fn handle(mut stream: TcpStream, dir: &Path, version: &AtomicU64, live: bool) -> Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Drain the headers.
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("/");
    if method != "GET" && method != "HEAD" {
        return respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            b"",
            method,
        );
    }
    if target.starts_with("/__gpumem/version") {
        let v = version.load(Ordering::SeqCst).to_string();
        return respond(&mut stream, "200 OK", "text/plain", v.as_bytes(), method);
    }
    let file = resolve(dir, target).filter(|f| f.is_file());
    let (status, file) = match file {
        Some(f) => ("200 OK", f),
        None => ("404 Not Found", dir.join("404.html")),
    };
    let mut body = std::fs::read(&file).unwrap_or_else(|_| b"not found".to_vec());
    let ctype = content_type(&file);
    if live && ctype.starts_with("text/html") {
        let text = String::from_utf8_lossy(&body);
        let injected = match text.rfind("</body>") {
            Some(i) => format!("{}{RELOAD_SCRIPT}{}", &text[..i], &text[i..]),
            None => format!("{text}{RELOAD_SCRIPT}"),
        };
        body = injected.into_bytes();
    }
    respond(&mut stream, status, ctype, &body, method)
}

fn respond(s: &mut TcpStream, status: &str, ctype: &str, body: &[u8], method: &str) -> Result<()> {
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if method != "HEAD" {
        s.write_all(body)?;
    }
    s.flush()?;
    Ok(())
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
    }
}
