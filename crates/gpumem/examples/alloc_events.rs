//! Writes the engine's event stream of each H100 calibration run to DIR/NN.trace, in the
//! format of tools/alloc/trace.py, so the two can be compared.
//!
//! cargo run --release -p gpumem --example alloc_events -- DIR
fn main() {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or("target/alloc-engine".into());
    std::fs::create_dir_all(&dir).unwrap();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/");
    let text = std::fs::read_to_string(format!("{root}calibration-scenarios.jsonl")).unwrap();
    for (i, l) in text.lines().enumerate() {
        let c: serde_json::Value = serde_json::from_str(l).unwrap();
        let s = gpumem::Scenario::from_value(&c["scenario"]).unwrap();
        if let Some((_, ev)) = gpumem::alloc::stream::events(&s) {
            std::fs::write(format!("{dir}/{i:02}.trace"), ev.join("\n") + "\n").unwrap();
        }
    }
}
