//! Print predicted vs measured peaks for tests/data/calibration-scenarios.jsonl.
fn main() {
    let path = std::env::args()
        .nth(1)
        .unwrap_or("tests/data/calibration-scenarios.jsonl".into());
    let text = std::fs::read_to_string(path).expect("read");
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let e = gpumem::estimate(&gpumem::Scenario::from_value(&v["scenario"]).unwrap()).unwrap();
        let exp = &v["expect"];
        let m = exp["peak_step"].as_f64().or(exp["peak_generate"].as_f64());
        match m {
            Some(m) => println!(
                "{:55} pred {:8.0} meas {:8.0} err {:+6.1}%  {}",
                v["name"].as_str().unwrap(),
                e.peak_bytes as f64 / 1048576.0,
                m / 1048576.0,
                (e.peak_bytes as f64 / m - 1.0) * 100.0,
                e.peak_phase
            ),
            None => println!(
                "{:55} pred {:8.0} OOM expected; fits={}",
                v["name"].as_str().unwrap(),
                e.peak_bytes as f64 / 1048576.0,
                e.fits
            ),
        }
    }
}
