//! One bookkeeping for every widget: the engine's components at the peak, grouped into the
//! parts the widgets show, with one name, one colour (`gm-c-KEY` / `gm-f-KEY` in
//! gpumem.css) and one place in the stack each. Every widget, legend, caption and formula
//! reads this table, so a kind of memory is named and grouped the same way everywhere.
//!
//! A component the table does not know (the engine gains one) lands in "Other", so that the
//! parts always add up to the estimate.

use gpumem::map::Components;
use gpumem::Estimate;

/// One part of a GPU's memory as the widgets show it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Part {
    /// CSS suffix and stable key.
    pub key: &'static str,
    /// Its name, capitalised as a legend shows it.
    pub label: &'static str,
    /// The engine's components it collects (`Estimate::components` keys).
    pub components: &'static [&'static str],
    /// One of the four model states (weights, master weights, optimizer states, gradients).
    pub model_state: bool,
}

const fn part(
    key: &'static str,
    label: &'static str,
    components: &'static [&'static str],
    model_state: bool,
) -> Part {
    Part {
        key,
        label,
        components,
        model_state,
    }
}

/// Every part, in stacking order (bottom up). The model states come first and together: the
/// master weights sit with the optimizer states they are updated with.
pub const PARTS: &[Part] = &[
    part("weights", "Weights", &["weights"], true),
    part("master", "Master weights", &["master_weights"], true),
    part("optimizer", "Optimizer states", &["optimizer_states"], true),
    part("gradients", "Gradients", &["gradients"], true),
    part("copies", "Weight copies", &["weight_copies"], false),
    part("gathered", "Gathered weights", &["gathered_params"], false),
    part("kv", "KV cache", &["kv_cache"], false),
    part("activations", "Activations", &["activations"], false),
    part("logits", "Logits", &["logits"], false),
    part("comm", "Communication buffers", &["comm_buffers"], false),
    part("temporaries", "Temporaries", &["temporaries"], false),
    part(
        "workspaces",
        "cuBLAS workspaces",
        &["cublas_workspaces"],
        false,
    ),
    part("other", "Other", &[], false),
    part("overhead", "CUDA context", &[], false),
];

/// The part a key names.
pub fn find(key: &str) -> Option<&'static Part> {
    PARTS.iter().find(|p| p.key == key)
}

/// The part an engine component belongs to ("Other" for one the table does not list).
pub fn of_component(component: &str) -> &'static Part {
    PARTS
        .iter()
        .find(|p| p.components.contains(&component))
        .unwrap_or_else(|| find("other").expect("the table has Other"))
}

/// A part with its bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    pub part: &'static Part,
    pub bytes: f64,
}

impl Slice {
    pub fn key(&self) -> &'static str {
        self.part.key
    }
    pub fn label(&self) -> &'static str {
        self.part.label
    }
}

/// Every part of a set of components (an estimate's, or one pipeline stage's), in stacking
/// order, with what lies outside PyTorch's allocator as `overhead`. Parts of zero
/// bytes are kept (legends may list them); the slices add up to the components plus the
/// overhead.
pub fn slices(components: &Components, overhead: f64) -> Vec<Slice> {
    let mut bytes = vec![0.0; PARTS.len()];
    for (k, v) in components.iter() {
        let p = of_component(k);
        let i = PARTS.iter().position(|x| x.key == p.key).unwrap_or(0);
        bytes[i] += *v as f64;
    }
    if let Some(i) = PARTS.iter().position(|x| x.key == "overhead") {
        bytes[i] = overhead;
    }
    PARTS
        .iter()
        .zip(bytes)
        .map(|(part, bytes)| Slice { part, bytes })
        .collect()
}

/// An estimate's slices at its peak: they add up to its device total.
pub fn of_estimate(e: &Estimate) -> Vec<Slice> {
    slices(
        &e.components,
        (e.cuda_context_bytes + e.allocator_reserve_bytes + e.managed_bytes) as f64,
    )
}

/// The parts a legend lists even when they are empty at the peak: the model states of a
/// training step (gradients often do not exist yet), the KV cache of inference.
pub fn always_listed(e: &Estimate) -> &'static [&'static str] {
    if e.trainable_params > 0 {
        &["weights", "optimizer", "gradients", "activations", "logits"]
    } else {
        &["weights", "kv", "activations"]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_engine_component_has_one_part_and_unknown_ones_land_in_other() {
        for c in [
            "weights",
            "master_weights",
            "optimizer_states",
            "gradients",
            "activations",
            "logits",
            "weight_copies",
            "gathered_params",
            "comm_buffers",
            "kv_cache",
            "temporaries",
            "cublas_workspaces",
        ] {
            let owners: Vec<_> = PARTS.iter().filter(|p| p.components.contains(&c)).collect();
            assert_eq!(owners.len(), 1, "{c}");
        }
        assert_eq!(of_component("a_future_component").key, "other");
        let keys: Vec<_> = PARTS.iter().map(|p| p.key).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len(), "keys are unique");
        // The CSS has a colour for every part.
        let css = include_str!("../gpumem.css");
        for k in keys {
            assert!(css.contains(&format!("--gm-{k}:")), "no colour for {k}");
        }
    }

    #[test]
    fn slices_add_up_whatever_the_components() {
        let mut c = Components::default();
        c.insert("weights".into(), 100);
        c.insert("master_weights".into(), 200);
        c.insert("something_new".into(), 7);
        let s = slices(&c, 5.0);
        assert_eq!(s.iter().map(|x| x.bytes).sum::<f64>(), 312.0);
        assert_eq!(s.iter().find(|x| x.key() == "other").unwrap().bytes, 7.0);
        assert_eq!(s.iter().find(|x| x.key() == "master").unwrap().bytes, 200.0);
    }
}
