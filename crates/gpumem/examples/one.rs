fn main() {
    let text = std::fs::read_to_string(std::env::args().nth(1).unwrap()).unwrap();
    let e = gpumem::estimate_json(&text).unwrap();
    for p in &e.timeline {
        println!("{:40} {:10.0}", p.phase, p.bytes as f64 / 1048576.0);
    }
    println!(
        "peak {:.0} at {}",
        e.peak_bytes as f64 / 1048576.0,
        e.peak_phase
    );
    for (k, v) in &e.components {
        println!("  {k}: {:.0}", *v as f64 / 1048576.0);
    }
}
