//! A chapter's choices on its widget: `levers=attention,recompute` (Activations), `loss`
//! (Logits), `finetune,rank,targets` (Fine-tuning). Each lever sets one knob of the page's
//! scenario; the widget shows what follows.

use yew::prelude::*;

use crate::controls::{radio_group, select};
use crate::{Init, Knobs};

/// The levers a widget may carry.
pub const LEVERS: &[&str] = &[
    "attention",
    "recompute",
    "loss",
    "finetune",
    "rank",
    "targets",
];

/// LoRA's method, rank and targets as the `finetune` knob carries them
/// (`qlora,rank=64,targets=all-linear`); `full` has neither.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuning {
    pub method: String,
    pub rank: String,
    pub targets: String,
}

impl Tuning {
    pub fn read(k: &Knobs) -> Tuning {
        let v = k.get_or_default("finetune");
        let mut parts = v.split(',');
        let mut t = Tuning {
            method: parts.next().unwrap_or("full").to_string(),
            rank: "16".into(),
            targets: "q_proj+v_proj".into(),
        };
        for p in parts {
            match p.split_once('=') {
                Some(("rank", r)) => t.rank = r.to_string(),
                Some(("targets", x)) => t.targets = x.to_string(),
                _ => {}
            }
        }
        t
    }

    /// The knob's value: the bare method when rank and targets are the defaults.
    pub fn knob(&self) -> String {
        if self.method == "full" || (self.rank == "16" && self.targets == "q_proj+v_proj") {
            self.method.clone()
        } else {
            format!(
                "{},rank={},targets={}",
                self.method, self.rank, self.targets
            )
        }
    }
}

const TARGETS: &[(&str, &str)] = &[
    ("q_proj+v_proj", "query and value"),
    ("q_proj+k_proj+v_proj+o_proj", "all attention"),
    ("all-linear", "every linear layer"),
];

/// The controls for the levers the widget's `levers` option names (none when it names none):
/// each sets one knob of `knobs` and hands the result to `on_change`.
pub fn levers(init: &Init, knobs: &Knobs, on_change: &Callback<Knobs>) -> Html {
    let Some(list) = init.option("levers") else {
        return html! {};
    };
    let k = knobs;
    let radio = |key: &'static str, label: &'static str, opts: &[(&str, &str)]| {
        let selected = k.get_or_default(key).to_string();
        let (k, cb) = (k.clone(), on_change.clone());
        let on_change = Callback::from(move |v: String| cb.emit(k.with(key, v)));
        radio_group(
            init.id(key),
            label,
            opts.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            selected,
            on_change,
        )
    };
    let tuning = Tuning::read(k);
    let tune = |f: fn(&mut Tuning, String)| {
        let (k, cb, t) = (k.clone(), on_change.clone(), tuning.clone());
        Callback::from(move |v: String| {
            let mut t = t.clone();
            f(&mut t, v);
            cb.emit(k.with("finetune", t.knob()));
        })
    };
    let lora = tuning.method != "full";
    let controls: Html = list
        .split(',')
        .map(str::trim)
        .map(|lever| match lever {
            "attention" => radio(
                "attention",
                "Attention kernel",
                &[("flash", "flash (SDPA)"), ("eager", "eager")],
            ),
            "recompute" => radio(
                "recompute",
                "Recomputation",
                &[
                    ("none", "none"),
                    ("selective", "selective"),
                    ("full", "full"),
                ],
            ),
            "loss" => radio(
                "loss",
                "Loss",
                &[
                    ("standard", "standard (fp32 logits)"),
                    ("fused", "fused, chunked"),
                ],
            ),
            "finetune" => radio_group(
                init.id("finetune"),
                "Fine-tuning",
                [
                    ("full", "full"),
                    ("lora", "LoRA"),
                    ("qlora", "QLoRA (NF4 base)"),
                ]
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
                tuning.method.clone(),
                tune(|t, v| t.method = v),
            ),
            "rank" if lora => select(
                init.id("rank"),
                "LoRA rank",
                ["4", "8", "16", "32", "64", "128", "256"]
                    .iter()
                    .map(|r| (r.to_string(), r.to_string()))
                    .chain(
                        (!["4", "8", "16", "32", "64", "128", "256"]
                            .contains(&tuning.rank.as_str()))
                        .then(|| (tuning.rank.clone(), tuning.rank.clone())),
                    )
                    .collect(),
                tuning.rank.clone(),
                tune(|t, v| t.rank = v),
            ),
            "targets" if lora => select(
                init.id("targets"),
                "Adapters on",
                TARGETS
                    .iter()
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .chain(
                        (!TARGETS.iter().any(|(a, _)| *a == tuning.targets))
                            .then(|| (tuning.targets.clone(), tuning.targets.replace('+', ", "))),
                    )
                    .collect(),
                tuning.targets.clone(),
                tune(|t, v| t.targets = v),
            ),
            _ => html! {},
        })
        .collect();
    html! { <div class="gm-controls gm-levers">{ controls }</div> }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_finetune_knob_round_trips() {
        let k = Knobs::default().with("finetune", "qlora,rank=64,targets=all-linear");
        let t = Tuning::read(&k);
        assert_eq!((t.method.as_str(), t.rank.as_str()), ("qlora", "64"));
        assert_eq!(t.knob(), "qlora,rank=64,targets=all-linear");
        assert_eq!(Tuning::read(&Knobs::default()).knob(), "full");
        let mut t = Tuning::read(&Knobs::default().with("finetune", "lora"));
        assert_eq!(t.knob(), "lora");
        t.rank = "8".into();
        let k = Knobs::default()
            .with("model", "llama3.1-8b")
            .with("finetune", t.knob());
        assert!(k.estimate().is_ok(), "{}", t.knob());
    }
}
