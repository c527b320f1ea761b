//! The engine against the CPU oracle's training peaks per family
//! (tests/data/oracle/families.jsonl, with families-detail.jsonl for what each layer keeps).
//!
//!   cargo run --release -p gpumem --example families [SUBSTRING]
//!
//! Per case: the oracle's peak, the engine's, the error, and the bytes one decoder layer keeps
//! after its forward (the oracle's median over layers; the engine's per layer kind).
use gpumem::graph::{Builder, Ctx};
use gpumem::scenario::Model;
use gpumem::tape::{Grads, Mode};
use serde_json::Value;

fn lines(path: &str) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect()
}

fn main() {
    let only = std::env::args().nth(1).unwrap_or_default();
    let cases = lines("tests/data/oracle/families.jsonl");
    let detail = lines("tests/data/oracle/families-detail.jsonl");
    let mut errs = Vec::new();
    for c in &cases {
        let name = c["name"].as_str().unwrap_or("");
        if !name.contains(&only) {
            continue;
        }
        let s = match gpumem::Scenario::from_value(&c["scenario"]) {
            Ok(s) => s,
            Err(e) => {
                println!("{name:60} refused: {e}");
                continue;
            }
        };
        let e = gpumem::estimate(&s).expect("estimate");
        let want = c["expect"]["peak_step"].as_f64().unwrap();
        let err = e.peak_bytes as f64 / want - 1.0;
        let valid = c["gpu_valid"].as_bool().unwrap_or(true);
        if valid {
            errs.push(err.abs());
        }
        let d = detail.iter().find(|d| d["name"] == c["name"]);
        let saved = d.and_then(|d| d["per_layer_saved"].as_f64()).unwrap_or(0.0);
        let mut kinds = String::new();
        if let Model::Arch { arch, .. } = &s.model {
            let ctx = Ctx::new(&s, arch, true);
            for k in arch.kinds() {
                let mut b = Builder::new(&ctx);
                let x = b.input(ctx.t * arch.hidden as f64, gpumem::dtype::DType::Bf16, true);
                b.decoder_layer(x, k);
                let p = b.tape.replay(Mode::Normal, Grads::New, None);
                kinds += &format!(
                    " {}{}{}:{:.0} (fwd peak {:.0}, bwd peak {:.0})",
                    if k.moe { "moe-" } else { "" },
                    format!("{:?}", k.attn).to_lowercase(),
                    if k.nope { "-nope" } else { "" },
                    p.fwd.delta.total() / 1048576.0,
                    p.fwd.peak.total() / 1048576.0,
                    p.bwd.peak.total() / 1048576.0
                );
            }
        }
        println!(
            "{name:58} oracle {:8.0} gpumem {:8.0} err {:+6.2}%{}  layer {:6.0} MiB ({})\n{:60}oracle at {}; gpumem at {}",
            want / 1048576.0,
            e.peak_bytes as f64 / 1048576.0,
            err * 100.0,
            if valid { "" } else { " (not GPU-valid)" },
            saved / 1048576.0,
            kinds.trim(),
            "",
            d.and_then(|d| d["peak_where"].as_str()).unwrap_or("?"),
            e.peak_phase,
        );
    }
    errs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if !errs.is_empty() {
        println!(
            "GPU-valid cases {}: median |error| {:.2}%, worst {:.2}%",
            errs.len(),
            errs[errs.len() / 2] * 100.0,
            errs[errs.len() - 1] * 100.0
        );
    }
}
