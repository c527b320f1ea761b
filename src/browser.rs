//! Headless Chromium through chromedriver (W3C WebDriver over HTTP), for the browser tests
//! and the timing benchmarks. Chromium runs with the network closed to everything but what
//! the page asks of 127.0.0.1, and a fresh profile.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::Result;

pub struct Chrome {
    driver: Child,
    base: String,
    agent: ureq::Agent,
    _profile: TempDir,
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A free port on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn program(env: &str, default: &str) -> String {
    std::env::var(env).unwrap_or_else(|_| default.to_string())
}

impl Chrome {
    /// Start chromedriver and a headless Chromium session (`CHROMEDRIVER` and `CHROME`
    /// override `/usr/bin/chromedriver` and `/usr/bin/chromium`).
    pub fn start() -> Result<Chrome> {
        let driver_bin = program("CHROMEDRIVER", "/usr/bin/chromedriver");
        let chrome_bin = program("CHROME", "/usr/bin/chromium");
        let port = free_port()?;
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("{driver_bin}: {e} (install Debian's chromium and chromium-driver)")
            })?;
        let profile =
            std::env::temp_dir().join(format!("gpumem-chrome-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&profile)?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let mut c = Chrome {
            driver,
            base: format!("http://127.0.0.1:{port}"),
            agent,
            _profile: TempDir(profile.clone()),
        };
        let t = Instant::now();
        while c.agent.get(format!("{}/status", c.base)).call().is_err() {
            if t.elapsed() > Duration::from_secs(20) {
                return Err("chromedriver did not start within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chrome_bin,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    "--disable-quic", "--window-size=1100,1400",
                    format!("--user-data-dir={}", profile.display()),
                ]
            },
            "goog:loggingPrefs": {"browser": "ALL"}
        }}});
        let v = c.call("POST", "/session", Some(caps))?;
        let id = v["sessionId"]
            .as_str()
            .ok_or_else(|| format!("no session: {v}"))?
            .to_string();
        c.base = format!("{}/session/{id}", c.base);
        Ok(c)
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut resp = match method {
            "GET" => self.agent.get(&url).call(),
            "DELETE" => self.agent.delete(&url).call(),
            _ => self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(body.unwrap_or(json!({})).to_string()),
        }
        .map_err(|e| format!("webdriver {method} {path}: {e}"))?;
        let text = resp.body_mut().read_to_string()?;
        let v: Value = serde_json::from_str(&text)?;
        if v["value"]["error"].is_string() {
            return Err(format!(
                "webdriver {method} {path}: {}: {}",
                v["value"]["error"], v["value"]["message"]
            )
            .into());
        }
        Ok(v["value"].clone())
    }

    pub fn goto(&self, url: &str) -> Result<()> {
        self.call("POST", "/url", Some(json!({ "url": url })))?;
        Ok(())
    }

    /// Run a script (`return …;`) in the page.
    pub fn eval(&self, script: &str, args: Value) -> Result<Value> {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
    }

    /// Run an async script: it calls `arguments[arguments.length - 1](result)`.
    pub fn eval_async(&self, script: &str, args: Value) -> Result<Value> {
        self.call(
            "POST",
            "/execute/async",
            Some(json!({"script": script, "args": args})),
        )
    }

    /// Poll `script` until it returns true.
    pub fn wait_for(&self, script: &str, timeout: Duration) -> Result<()> {
        let t = Instant::now();
        loop {
            if self.eval(script, json!([]))? == json!(true) {
                return Ok(());
            }
            if t.elapsed() > timeout {
                return Err(format!("timed out waiting for: {script}").into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The element a CSS selector finds first.
    pub fn find(&self, css: &str) -> Result<String> {
        let v = self.call(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        )?;
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(|x| x.as_str())
            .map(str::to_string)
            .ok_or_else(|| format!("no element for {css}").into())
    }

    /// Type keys into an element, as a user would (`\u{E014}` is ArrowRight).
    pub fn send_keys(&self, element: &str, keys: &str) -> Result<()> {
        self.call(
            "POST",
            &format!("/element/{element}/value"),
            Some(json!({ "text": keys })),
        )?;
        Ok(())
    }

    /// The element's role and accessible name as the browser's accessibility tree computes
    /// them (WebDriver "Get Computed Role" / "Get Computed Label").
    pub fn accessibility(&self, element: &str) -> Result<(String, String)> {
        let role = self.call("GET", &format!("/element/{element}/computedrole"), None)?;
        let label = self.call("GET", &format!("/element/{element}/computedlabel"), None)?;
        Ok((
            role.as_str().unwrap_or_default().to_string(),
            label.as_str().unwrap_or_default().to_string(),
        ))
    }

    /// Empty a text field, as a user selecting all and deleting would.
    pub fn clear(&self, element: &str) -> Result<()> {
        self.call("POST", &format!("/element/{element}/clear"), None)?;
        Ok(())
    }

    pub fn click(&self, element: &str) -> Result<()> {
        self.call("POST", &format!("/element/{element}/click"), None)?;
        Ok(())
    }

    /// The browser console since the last call.
    pub fn console(&self) -> Result<Vec<Value>> {
        let v = self.call("POST", "/se/log", Some(json!({"type": "browser"})))?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// A Chrome DevTools Protocol command (`Emulation.setDeviceMetricsOverride`, …).
    pub fn cdp(&self, cmd: &str, params: Value) -> Result<Value> {
        self.call(
            "POST",
            "/goog/cdp/execute",
            Some(json!({"cmd": cmd, "params": params})),
        )
    }

    /// A PNG of a rectangle of the page in CSS pixels, beyond the viewport if need be
    /// (through the DevTools protocol).
    pub fn screenshot_clip(&self, x: f64, y: f64, width: f64, height: f64) -> Result<Vec<u8>> {
        let v = self.cdp(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true,
                   "clip": {"x": x, "y": y, "width": width, "height": height, "scale": 1}}),
        )?;
        base64_decode(v["data"].as_str().unwrap_or("")).ok_or_else(|| "bad screenshot data".into())
    }

    /// A PNG of the viewport.
    pub fn screenshot(&self) -> Result<Vec<u8>> {
        let v = self.call("GET", "/screenshot", None)?;
        base64_decode(v.as_str().unwrap_or("")).ok_or_else(|| "bad screenshot data".into())
    }
}

impl Drop for Chrome {
    fn drop(&mut self) {
        let _ = self.call("DELETE", "", None);
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let bytes: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let data: Vec<u8> = chunk.iter().copied().filter(|&b| b != b'=').collect();
        let mut acc = 0u32;
        for &b in &data {
            acc = (acc << 6) | val(b)?;
        }
        acc <<= 6 * (4 - data.len() as u32);
        let n = data.len().saturating_sub(1);
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64() {
        assert_eq!(super::base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(super::base64_decode("aGk=").unwrap(), b"hi");
        assert_eq!(super::base64_decode("YWJj").unwrap(), b"abc");
        assert!(super::base64_decode("a$==").is_none());
    }
}
