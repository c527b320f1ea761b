//! `cargo run --release -- serve`: build the site and serve it with live reload.
//! `cargo run --release -- build`: write the static site into target/site/.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use gpumem_site::{build, serve, Paths};

const USAGE: &str = "usage: gpumem-site <build|serve> [--dest DIR] [--port PORT]

  build   build the static site (widgets' wasm, bindings, KaTeX assets, the book)
          into target/site/ (or --dest DIR); deployable as is under any base path
  serve   build, then serve it on http://127.0.0.1:PORT/ (default 3000) and rebuild
          and reload the open pages when book/ changes";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpumem: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> gpumem_site::Result<()> {
    let mut args = std::env::args().skip(1);
    let cmd = args.next().unwrap_or_default();
    let mut dest = None;
    let mut port: u16 = 3000;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dest" => {
                dest = Some(PathBuf::from(
                    args.next().ok_or("--dest needs a directory")?,
                ))
            }
            "--port" => {
                let v = args.next().ok_or("--port needs a number")?;
                port = v
                    .parse()
                    .map_err(|_| format!("--port: '{v}' is not a port number"))?;
            }
            other => return Err(format!("unknown argument '{other}'\n\n{USAGE}").into()),
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let paths = Paths::new(root, dest);
    match cmd.as_str() {
        "build" | "serve" => {
            let r = build(&paths)?;
            println!(
                "gpumem: site in {} (widgets {:.1} s, book {:.2} s; wasm {} KB, {} KB gzipped)",
                paths.dest.display(),
                r.wasm.as_secs_f64(),
                r.book.as_secs_f64(),
                r.wasm_bytes / 1000,
                r.wasm_gzip_bytes / 1000
            );
            if cmd == "serve" {
                serve::run(paths, SocketAddr::from(([127, 0, 0, 1], port)))?;
            }
            Ok(())
        }
        "" | "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command '{other}'\n\n{USAGE}").into()),
    }
}
