//! Ledgers: the tensors behind a figure, one by one, from the same replay as the estimate.
//! [`layer`] lists what autograd saves in one decoder layer; [`loss`] the logits' tensors the
//! LM head and the loss allocate (the logits, their fp32 upcast, the log-softmax and their
//! gradients).

use crate::arch::Architecture;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Builder, Ctx};
use crate::mem::Cat;
use crate::scenario::{Model, Scenario};
use crate::step::Stretches;
use crate::tape::{self, Grads};

/// One tensor of a ledger.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The op that made it (or, for a gradient, whose backward did).
    pub op: &'static str,
    /// What it is: the ops that save it ("q_proj, k_proj, v_proj"), or its role in the loss
    /// ledger ("grad of input", "output").
    pub role: String,
    pub dtype: Option<DType>,
    pub bytes: f64,
    pub cat: Cat,
    /// Its elements factorised into the model's dimensions ("b·s·h"), with the sizes
    /// ("1 × 2048 × 4096"); empty when no product of them matches.
    pub shape: (&'static str, String),
    /// Allocated during the backward (the loss ledger).
    pub backward: bool,
}

fn arch(s: &Scenario) -> Result<&Architecture> {
    match &s.model {
        Model::Arch { arch, .. } => Ok(arch),
        Model::Params(_) => Err(Error::new(
            "model",
            "a bare parameter count has no layers to list: name a model or give its config",
        )),
    }
}

/// What autograd keeps for one decoder layer's backward (the model's most frequent kind of
/// layer), as the step replays it without recomputation, and the kind's layer count.
pub fn layer(s: &Scenario) -> Result<(Vec<Row>, u64)> {
    let a = arch(s)?;
    let ctx = Ctx::new(s, a, true);
    let kinds = a.kinds();
    let mut count = vec![0u64; kinds.len()];
    for (i, n) in a.runs(0, a.layers) {
        count[i] += n;
    }
    let k = (0..kinds.len()).max_by_key(|&i| count[i]).unwrap_or(0);
    let Some(&kind) = kinds.get(k) else {
        return Ok((Vec::new(), 0));
    };
    let mut b = Builder::new(&ctx);
    let h = a.hidden as f64;
    let resid = if ctx.autocast { DType::F32 } else { ctx.c };
    let x = b.input(ctx.tsp * h, resid, true);
    b.decoder_layer(x, kind);
    let dims = dims(&ctx);
    let rows = b
        .tape
        .saved()
        .into_iter()
        .map(|t| Row {
            op: if t.input { "layer input" } else { t.made_by },
            role: t.saved_by.join(", "),
            dtype: Some(t.dtype),
            bytes: t.bytes,
            cat: t.cat,
            shape: shape(t.bytes / t.dtype.bytes(), &dims),
            backward: false,
        })
        .collect();
    Ok((rows, count[k]))
}

/// Every tensor of the logits the LM head and the loss allocate, forward then backward, in
/// order (none under a fused loss, which never makes them whole).
pub fn loss(s: &Scenario) -> Result<Vec<Row>> {
    let a = arch(s)?;
    let ctx = Ctx::new(s, a, true);
    let st = Stretches::traced(&ctx, tape::Mode::Normal, Grads::New);
    let dims = dims(&ctx);
    let Some(t) = st.traces.as_deref() else {
        return Ok(Vec::new());
    };
    let mut rows = Vec::new();
    for (events, backward) in [
        (&t.head.fwd, false),
        (&t.loss.fwd, false),
        (&t.loss.bwd, true),
        (&t.head.bwd, true),
    ] {
        for e in events
            .iter()
            .filter(|e| e.bytes > 0.0 && e.role != "workspace")
        {
            // The logits and what the loss makes of them (their gradients count as logits).
            if e.cat != Cat::Logits {
                continue;
            }
            let elems = e.dtype.map_or(0.0, |d| e.bytes / d.bytes());
            rows.push(Row {
                op: e.at.what,
                role: if e.role == "grad of input" && !e.tensor.is_empty() {
                    format!("grad of {}", e.tensor)
                } else {
                    e.role.to_string()
                },
                dtype: e.dtype,
                bytes: e.bytes,
                cat: e.cat,
                shape: shape(elems, &dims),
                backward,
            });
        }
    }
    Ok(rows)
}

/// The model's dimensions a tensor's elements factorise into, by their usual letters.
fn dims(ctx: &Ctx<'_>) -> Vec<(&'static str, f64)> {
    let a = ctx.arch;
    let tp = ctx.tp.max(1.0);
    let mut v = vec![
        ("b", ctx.batch),
        ("s", ctx.seq),
        ("h", a.hidden as f64),
        ("i", (a.intermediate as f64 / tp).ceil()),
        ("V", a.vocab as f64),
        ("n_h", (a.heads as f64 / tp).floor()),
        ("d_h", a.head_dim as f64),
        ("n_kv", (a.kv_heads as f64 / tp).floor().max(1.0)),
    ];
    if let Some(m) = &a.moe {
        v.push(("E", m.experts as f64));
        v.push(("k", m.top_k as f64));
    }
    v
}

/// Shapes tried, most telling first: each a list of dimension letters.
const SHAPES: &[&[&str]] = &[
    &["b", "s", "h"],
    &["b", "s", "i"],
    &["b", "s", "V"],
    &["b", "s", "n_kv", "d_h"],
    &["b", "s", "n_h", "d_h"],
    &["b", "n_h", "s"],
    &["b", "n_h", "s", "s"],
    &["b", "s"],
    &["b", "s", "E"],
    &["b", "s", "k"],
    &["b", "s", "k", "h"],
    &["h", "h"],
    &["i", "h"],
    &["V", "h"],
    &["n_kv", "d_h", "h"],
    &["h"],
];

/// `elems` as a product of the model's dimensions, when one of [`SHAPES`] gives it exactly.
fn shape(elems: f64, dims: &[(&'static str, f64)]) -> (&'static str, String) {
    let size = |l: &str| dims.iter().find(|d| d.0 == l).map(|d| d.1);
    for sh in SHAPES {
        let sizes: Option<Vec<f64>> = sh.iter().map(|l| size(l)).collect();
        let Some(sizes) = sizes else { continue };
        if sizes.iter().product::<f64>() == elems && elems > 0.0 {
            let text = sizes
                .iter()
                .map(|x| crate::num::thousands(*x as u64))
                .collect::<Vec<_>>()
                .join(" × ");
            return (symbol(sh), text);
        }
    }
    ("", String::new())
}

/// A shape's letters as a product: "b·s·h".
fn symbol(sh: &[&str]) -> &'static str {
    match sh {
        ["b", "s", "h"] => "b·s·h",
        ["b", "s", "i"] => "b·s·i",
        ["b", "s", "V"] => "b·s·V",
        ["b", "s", "n_kv", "d_h"] => "b·s·n_kv·d_h",
        ["b", "s", "n_h", "d_h"] => "b·s·n_h·d_h",
        ["b", "n_h", "s"] => "b·n_h·s",
        ["b", "n_h", "s", "s"] => "b·n_h·s·s",
        ["b", "s"] => "b·s",
        ["b", "s", "E"] => "b·s·E",
        ["b", "s", "k"] => "b·s·k",
        ["b", "s", "k", "h"] => "b·s·k·h",
        ["h", "h"] => "h·h",
        ["i", "h"] => "i·h",
        ["V", "h"] => "V·h",
        ["n_kv", "d_h", "h"] => "n_kv·d_h·h",
        _ => "h",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(knobs: &[(&str, &str)]) -> Scenario {
        crate::knobs::scenario(knobs.iter().copied()).unwrap()
    }

    /// The logits' gradient has one name: the ledger's, and the op timeline's where the
    /// loss's backward makes it and where the LM head's backward frees it (it had been
    /// "input" in the one and "lm_head" in the other).
    #[test]
    fn the_logits_gradient_has_one_name_in_the_ledger_and_the_timeline() {
        for model in ["llama3.1-8b", "gpt2", "gemma-2-9b"] {
            let s = scenario(&[
                ("model", model),
                ("batch", "1"),
                ("seq", "1k"),
                ("precision", "bf16"),
            ]);
            let rows = loss(&s).unwrap();
            let grad = rows
                .iter()
                .find(|r| r.role.starts_with("grad of ") && r.dtype == Some(DType::Bf16))
                .unwrap_or_else(|| panic!("{model}: {rows:?}"));
            let name = &grad.role["grad of ".len()..];
            assert_ne!(name, "input", "{model}");
            let points = crate::timeline::op_timeline(&s).unwrap().points;
            let made = points
                .iter()
                .find(|p| {
                    p.role == "grad of input" && p.at.what == grad.op && p.bytes == grad.bytes
                })
                .unwrap_or_else(|| panic!("{model}: {} made nowhere", grad.op));
            let freed = points
                .iter()
                .find(|p| p.role == "grad of output" && p.bytes == -grad.bytes)
                .unwrap_or_else(|| panic!("{model}: freed nowhere"));
            assert_eq!((made.tensor, freed.tensor), (name, name), "{model}");
        }
    }

    /// The layer's ledger adds up to what one layer keeps through the forward.
    #[test]
    fn a_layers_saved_tensors_add_up_to_what_it_keeps() {
        let s = scenario(&[("model", "llama3.1-8b"), ("batch", "1"), ("seq", "2k")]);
        let (rows, n) = layer(&s).unwrap();
        assert_eq!(n, 32);
        // What the replay keeps after one layer's forward: these tensors and its output, its
        // input (the size of its output) gone unless a saved tensor is it.
        let a = arch(&s).unwrap();
        let st = Stretches::new(&Ctx::new(&s, a, true), tape::Mode::Normal, Grads::New);
        let kept: f64 = rows
            .iter()
            .filter(|r| r.op != "layer input")
            .map(|r| r.bytes)
            .sum();
        let l0 = &st.layers[0];
        let input = if l0.input_kept { 0.0 } else { l0.out_bytes };
        assert_eq!(kept + l0.out_bytes - input, l0.fwd.delta.total());
        let up = rows.iter().find(|r| r.role == "down_proj").unwrap();
        assert_eq!(up.shape.0, "b·s·i");
        assert_eq!(up.shape.1, "1 × 2,048 × 14,336");
        assert!(rows.iter().all(|r| r.bytes > 0.0));
        assert!(layer(&crate::knobs::scenario([("params", "7e9")]).unwrap()).is_err());
    }

    #[test]
    fn the_loss_lists_the_fp32_upcast_and_its_gradients() {
        let s = scenario(&[("model", "llama3.2-1b"), ("batch", "4"), ("seq", "2k")]);
        let rows = loss(&s).unwrap();
        let bsv = 4.0 * 2048.0 * 128256.0;
        let fp32: Vec<&Row> = rows
            .iter()
            .filter(|r| r.dtype == Some(DType::F32) && r.bytes == bsv * 4.0)
            .collect();
        // The upcast and the log-softmax forward; their two gradients backward.
        assert!(fp32.iter().filter(|r| !r.backward).count() >= 2, "{rows:?}");
        assert!(fp32.iter().filter(|r| r.backward).count() >= 2, "{rows:?}");
        assert!(rows
            .iter()
            .any(|r| r.dtype == Some(DType::Bf16) && r.bytes == bsv * 2.0));
        assert!(fp32.iter().all(|r| r.shape.0 == "b·s·V"));
    }
}
