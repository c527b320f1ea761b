//! KaTeX's stylesheet and fonts, served by the site itself. mdbook-katex renders the math at
//! build time with the KaTeX it embeds; the matching `katex` package comes from the npm
//! registry once, checked against a pinned SHA-512, and is cached under `target/`.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha512};

use crate::Result;

/// The KaTeX that mdbook-katex 0.10 renders with (the `katex` crate 0.4.6 embeds 0.16.4).
pub const VERSION: &str = "0.16.4";
const SHA512: &str = "5ae7512948fccb205e54323869830dc61c795618763e3a73430d4646efcb546a8be26d40c700f519c529d0831b74969fe73b23b63f2084fd0339045886ba0d93";

/// The cached `dist/` assets (katex.min.css, fonts/), fetched if missing.
pub fn assets(target_dir: &Path) -> Result<PathBuf> {
    let dir = target_dir.join(format!("katex-{VERSION}"));
    if dir.join("katex.min.css").is_file() {
        return Ok(dir);
    }
    let url = format!("https://registry.npmjs.org/katex/-/katex-{VERSION}.tgz");
    eprintln!("gpumem: fetching KaTeX {VERSION} from {url}");
    let tgz = fetch(&url)?;
    let got = hex(&Sha512::digest(&tgz));
    if got != SHA512 {
        return Err(format!("{url}: SHA-512 is {got}, expected {SHA512}; not using it").into());
    }
    unpack(&tgz, &dir)?;
    Ok(dir)
}

fn fetch(url: &str) -> Result<Vec<u8>> {
    // The platform's certificate store (SSL_CERT_FILE and friends), as curl and cargo use.
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_global(Some(std::time::Duration::from_secs(120)))
        .build()
        .into();
    let mut resp = agent.get(url).call().map_err(|e| format!("{url}: {e}"))?;
    let body = resp
        .body_mut()
        .with_config()
        .limit(20 << 20)
        .read_to_vec()
        .map_err(|e| format!("{url}: {e}"))?;
    Ok(body)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Extract `package/dist/katex.min.css` and `package/dist/fonts/*` into `dir`, atomically.
fn unpack(tgz: &[u8], dir: &Path) -> Result<()> {
    let tmp = dir.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(tmp.join("fonts"))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(tgz));
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.to_string_lossy().into_owned();
        let rel = if path == "package/dist/katex.min.css" {
            "katex.min.css".to_string()
        } else if let Some(font) = path.strip_prefix("package/dist/fonts/") {
            // Plain file names only: nothing in the archive writes outside `dir`.
            if font.is_empty() || font.contains(['/', '\\']) || font.starts_with('.') {
                continue;
            }
            format!("fonts/{font}")
        } else {
            continue;
        };
        let mut data = Vec::new();
        entry.read_to_end(&mut data)?;
        std::fs::write(tmp.join(rel), data)?;
    }
    if !tmp.join("katex.min.css").is_file() {
        return Err("the katex package has no dist/katex.min.css".into());
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(&tmp, dir)?;
    Ok(())
}
