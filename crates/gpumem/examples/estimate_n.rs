//! One scenario estimated N times, for instruction counts per estimate
//! (`valgrind --tool=callgrind`, N = 1 and 11, the difference over ten):
//! `cargo run -p gpumem --release --example estimate_n -- '{"model": "llama3.2-1b"}' 11`.
//! With `--each FILE` (scenarios as JSON, one a line, or `{"scenario": …}` lines as in
//! tests/data), every estimate as JSON and then measure.py's process replayed
//! (`replay_process`), to compare two builds' figures.
fn main() {
    let mut args = std::env::args().skip(1);
    let first = args.next().expect("a scenario as JSON, or --each FILE");
    if first == "--each" {
        let text = std::fs::read_to_string(args.next().expect("a file")).expect("readable");
        let mut all = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line).expect("JSON");
            let v = v.get("scenario").cloned().unwrap_or(v);
            let s = gpumem::Scenario::from_value(&v).expect("a scenario");
            match gpumem::estimate(&s) {
                Ok(e) => println!("{}", serde_json::to_string(&e).expect("JSON")),
                Err(e) => println!("error: {e}"),
            }
            all.push(s);
        }
        for o in gpumem::alloc::stream::replay_process(&all) {
            println!("{o:?}");
        }
        return;
    }
    let n: usize = args.next().map_or(1, |x| x.parse().expect("a count"));
    let v: serde_json::Value = serde_json::from_str(&first).expect("JSON");
    let s = gpumem::Scenario::from_value(&v).expect("a scenario");
    let mut last = 0;
    for _ in 0..n {
        last = gpumem::estimate(std::hint::black_box(&s))
            .expect("an estimate")
            .peak_reserved_bytes;
    }
    println!("{last}");
}
