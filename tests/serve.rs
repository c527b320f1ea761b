//! The dev server, over raw TCP: nothing outside the site directory is served, however the
//! path is spelled or linked; slow, oversized and excess clients are dropped; types are right.
//! (The site itself is not needed: each test serves a small directory of its own.)

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpumem_site::serve::{self, Options};

const SECRET: &str = "the secret outside the site";

/// A site directory with a page, a wasm file, a link that stays inside and links that lead
/// out, next to a secret file outside it.
fn fixture(name: &str) -> (PathBuf, PathBuf) {
    let base = std::env::temp_dir().join(format!("gpumem-serve-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let site = base.join("site");
    let outside = base.join("outside");
    std::fs::create_dir_all(site.join("sub")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), SECRET).unwrap();
    std::fs::write(site.join("index.html"), "<html><body>home</body></html>").unwrap();
    std::fs::write(site.join("sub/index.html"), "<html><body>sub</body></html>").unwrap();
    std::fs::write(site.join("404.html"), "<html><body>missing</body></html>").unwrap();
    std::fs::write(site.join("w.wasm"), b"\0asm\x01\0\0\0").unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), site.join("leak.txt")).unwrap();
    std::os::unix::fs::symlink(&outside, site.join("leakdir")).unwrap();
    std::os::unix::fs::symlink("../outside/secret.txt", site.join("sub/rel.txt")).unwrap();
    std::os::unix::fs::symlink(site.join("index.html"), site.join("alias.html")).unwrap();
    (base, site)
}

fn start(site: PathBuf, opts: Options) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        serve::serve_dir_with(listener, site, Arc::new(AtomicU64::new(7)), opts)
    });
    addr
}

/// Send raw bytes, read the whole answer (the server closes after one response).
fn raw(addr: &str, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(request);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn get(addr: &str, target: &str) -> String {
    raw(
        addr,
        format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    )
}

fn status(response: &str) -> &str {
    response.get(9..12).unwrap_or("")
}

#[test]
fn files_are_served_with_their_types_and_the_version() {
    let (base, site) = fixture("types");
    let addr = start(site, Options::default());
    let r = get(&addr, "/");
    assert_eq!(status(&r), "200", "{r}");
    assert!(
        r.contains("text/html; charset=utf-8") && r.contains("home"),
        "{r}"
    );
    let r = get(&addr, "/sub/");
    assert!(r.contains("sub"), "{r}");
    let r = get(&addr, "/w.wasm");
    assert_eq!(status(&r), "200", "{r}");
    assert!(
        r.to_ascii_lowercase()
            .contains("content-type: application/wasm"),
        "{r}"
    );
    let r = get(&addr, "/__gpumem/version");
    assert!(r.ends_with("\r\n\r\n7"), "{r}");
    // A link that stays inside the site is followed.
    let r = get(&addr, "/alias.html");
    assert_eq!(status(&r), "200", "{r}");
    assert!(r.contains("home"));
    // Missing: the site's 404 page, with 404.
    let r = get(&addr, "/nope.html");
    assert_eq!(status(&r), "404", "{r}");
    assert!(r.contains("missing"));
    // HEAD: the headers only. Anything else: 405, the body never read.
    let r = raw(&addr, b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status(&r), "200");
    assert!(!r.contains("home"), "{r}");
    let r = raw(
        &addr,
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n",
    );
    assert_eq!(status(&r), "405", "{r}");
    // Every response carries the strict Content-Security-Policy the site is built for.
    assert!(
        get(&addr, "/").contains("script-src 'self' 'wasm-unsafe-eval'"),
        "the policy"
    );
    // Pages served for live reload poll the version through a script from the server (not
    // inline, which the policy would refuse); other files, and plain serving, are left as
    // they are.
    let script = "<script src=\"/__gpumem/reload.js\"></script>";
    assert!(!get(&addr, "/").contains(script));
    assert_eq!(status(&get(&addr, "/__gpumem/reload.js")), "404");
    let live = start(
        base.join("site"),
        Options {
            live_reload: true,
            ..Options::default()
        },
    );
    let r = get(&live, "/");
    let at = r.find(script).expect("the reload script");
    assert!(at < r.find("</body>").unwrap(), "{r}");
    assert!(!r.contains("<script>"), "no inline script: {r}");
    assert!(!get(&live, "/w.wasm").contains(script));
    let js = get(&live, "/__gpumem/reload.js");
    assert!(js.contains("fetch(\"/__gpumem/version\""), "{js}");
    assert!(js
        .to_ascii_lowercase()
        .contains("content-type: text/javascript"));
    let _ = std::fs::remove_dir_all(base);
}

#[test]
fn nothing_outside_the_site_is_served_however_it_is_spelled_or_linked() {
    let (base, site) = fixture("traversal");
    let addr = start(site.clone(), Options::default());
    let targets = [
        "/../outside/secret.txt",
        "/sub/../../outside/secret.txt",
        "/%2e%2e/outside/secret.txt",
        "/%2E%2E/outside/secret.txt",
        "/.%2e/outside/secret.txt",
        "/%2e%2e%2foutside%2fsecret.txt",
        "/sub/..%2f..%2foutside%2fsecret.txt",
        "/sub%2f..%2f..%2foutside/secret.txt",
        "/..%5coutside%5csecret.txt",
        "/%252e%252e/outside/secret.txt",
        "/secret.txt%00.html",
        "//../outside/secret.txt",
        "http://x/../outside/secret.txt",
        "http://x/%2e%2e/outside/secret.txt",
        // Absolute paths stay under the site.
        &format!("/{}", base.join("outside/secret.txt").display()),
        &format!("//{}", base.join("outside/secret.txt").display()),
        // Links that lead out are not followed.
        "/leak.txt",
        "/leakdir/secret.txt",
        "/leakdir/",
        "/sub/rel.txt",
    ];
    for t in targets {
        let r = get(&addr, t);
        assert!(!r.contains(SECRET), "{t} leaked: {r}");
        assert!(
            ["400", "404"].contains(&status(&r)),
            "{t}: want 400 or 404, got {r}"
        );
    }
    // Also for `inside` itself, which the server uses.
    assert_eq!(serve::inside(&site, "/leak.txt"), None);
    assert_eq!(serve::inside(&site, "/leakdir/secret.txt"), None);
    assert!(serve::inside(&site, "/alias.html").is_some());
    let _ = std::fs::remove_dir_all(base);
}

#[test]
fn an_oversized_request_head_is_refused() {
    let (base, site) = fixture("head");
    let addr = start(site, Options::default());
    let t = Instant::now();
    // A 64 MiB request line: refused once the head passes its bound, not buffered.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(b"GET /");
    let chunk = vec![b'a'; 1 << 16];
    let mut sent = 0usize;
    while sent < 64 << 20 {
        if s.write_all(&chunk).is_err() {
            break;
        }
        sent += chunk.len();
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let r = String::from_utf8_lossy(&out);
    assert!(
        sent < 64 << 20 || r.starts_with("HTTP/1.1 4"),
        "the server read {sent} bytes and answered: {r}"
    );
    assert!(
        r.is_empty() || ["414", "431", "400"].contains(&status(&r)),
        "{r}"
    );
    // Too many or too long headers, likewise.
    let mut head = String::from("GET / HTTP/1.1\r\nHost: x\r\n");
    for i in 0..200 {
        head.push_str(&format!("X-{i}: {}\r\n", "v".repeat(200)));
    }
    head.push_str("\r\n");
    let r = raw(&addr, head.as_bytes());
    assert!(["431", "400", ""].contains(&status(&r)), "{r}");
    // The server still answers.
    assert_eq!(status(&get(&addr, "/")), "200");
    eprintln!("oversized head handled in {:?}", t.elapsed());
    let _ = std::fs::remove_dir_all(base);
}

#[test]
fn a_slow_client_is_dropped_at_the_header_timeout() {
    let (base, site) = fixture("slow");
    let addr = start(
        site,
        Options {
            header_timeout: Duration::from_secs(1),
            ..Options::default()
        },
    );
    // Slow loris: a header line every 200 ms, never the blank line.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    let t = Instant::now();
    let mut closed = false;
    for i in 0..150 {
        if s.write_all(format!("X-{i}: a\r\n").as_bytes()).is_err() {
            closed = true;
            break;
        }
        let mut b = [0u8; 256];
        match s.read(&mut b) {
            Ok(0) => {
                closed = true;
                break;
            }
            // hyper may say 408 before closing.
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
    }
    assert!(closed, "still connected after {:?}", t.elapsed());
    eprintln!("slow client dropped after {:?} (timeout 1 s)", t.elapsed());
    // A client that sends nothing at all, likewise.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(n) => assert!(n == 0 || b.starts_with(b"HTTP/1.1 408"), "{:?}", &b[..n]),
        Err(e) => assert!(
            e.kind() == std::io::ErrorKind::ConnectionReset,
            "an idle client was not dropped: {e}"
        ),
    }
    let _ = std::fs::remove_dir_all(base);
}

#[test]
fn connections_beyond_the_cap_are_turned_away_and_slots_come_back() {
    let (base, site) = fixture("cap");
    let addr = start(
        site,
        Options {
            max_connections: 3,
            header_timeout: Duration::from_secs(3),
            ..Options::default()
        },
    );
    // Three idle clients hold every slot.
    let idle: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    // (Read before writing: the answer comes at once, and no unread request makes the close
    // a reset that could swallow it.)
    let r = raw(&addr, b"");
    assert_eq!(status(&r), "503", "{r}");
    // Their timeout frees the slots.
    let t = Instant::now();
    loop {
        let r = get(&addr, "/");
        if status(&r) == "200" {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "slots never freed: {r}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(idle);
    let _ = std::fs::remove_dir_all(base);
}
