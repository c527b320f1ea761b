//! Print the config.json keys the engine keeps for each given config file (what the `arch`
//! knob carries; handy for writing presets): `cargo run --example compact -- FILE…`.
fn main() {
    for path in std::env::args().skip(1) {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let a = gpumem::hf::parse_hf_config(&v, "c").unwrap();
        let m = gpumem::hf::to_hf_config(&a);
        println!("{path}\n{}", serde_json::Value::Object(m));
    }
}
