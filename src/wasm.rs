//! The widgets as one wasm bundle: the target, the build, the bindings.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{cargo, Result};

pub const TARGET: &str = "wasm32-unknown-unknown";
const PACKAGE: &str = "gpumem-widgets";

/// Add the wasm target when it is missing: rust-toolchain.toml names it, but rustup does not
/// install it on its own where `RUSTUP_AUTO_INSTALL=0`.
pub fn ensure_target(root: &Path) -> Result<()> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .current_dir(root)
        .output();
    match out {
        Ok(o) if o.status.success() => {
            if String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.trim() == TARGET)
            {
                return Ok(());
            }
        }
        // No rustup: a toolchain installed otherwise must bring its own wasm target.
        _ => return Ok(()),
    }
    eprintln!("gpumem: adding the {TARGET} target (rustup target add {TARGET})");
    let st = Command::new("rustup")
        .args(["target", "add", TARGET])
        .current_dir(root)
        .status()
        .map_err(|e| format!("rustup target add {TARGET}: {e}"))?;
    if !st.success() {
        return Err(format!("rustup target add {TARGET} failed ({st})").into());
    }
    Ok(())
}

/// Build the widgets crate for wasm (profile `wasm`: size over speed) and return the module.
pub fn build(root: &Path, target_dir: &Path) -> Result<PathBuf> {
    let st = Command::new(cargo())
        .args([
            "build", "--quiet", "--lib", "-p", PACKAGE, "--target", TARGET,
        ])
        .args(["--profile", "wasm", "--target-dir"])
        .arg(target_dir)
        .current_dir(root)
        .status()
        .map_err(|e| format!("cargo build -p {PACKAGE}: {e}"))?;
    if !st.success() {
        return Err(format!("building the widgets for {TARGET} failed ({st})").into());
    }
    Ok(target_dir
        .join(TARGET)
        .join("wasm")
        .join("gpumem_widgets.wasm"))
}

/// Generate the JS bindings (an ES module) next to a slimmed module, into `out`.
pub fn bindgen(wasm: &Path, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out)?;
    wasm_bindgen_cli_support::Bindgen::new()
        .input_path(wasm)
        .web(true)
        .map_err(|e| format!("wasm-bindgen: {e}"))?
        .typescript(false)
        .remove_name_section(true)
        .remove_producers_section(true)
        .generate(out)
        .map_err(|e| format!("wasm-bindgen: {e}"))?;
    Ok(())
}
