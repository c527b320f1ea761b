//! Each widget rendered as the book build renders it: its text comes from the engine and its
//! accessibility hooks are in the markup.

#![cfg(not(target_arch = "wasm32"))]

use gpumem_widgets::format::gib;
use gpumem_widgets::{render, Init, Knobs};

fn init(widget: &str, knobs: &[(&str, &str)], options: &[(&str, &str)]) -> Init {
    Init {
        widget: widget.into(),
        uid: "t".into(),
        page: "t".into(),
        knobs: Knobs(
            knobs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        options: options
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        local: false,
    }
}

const SMALL: &[(&str, &str)] = &[
    ("model", "llama3.2-1b"),
    ("batch", "4"),
    ("seq", "2k"),
    ("precision", "bf16"),
];

fn est(knobs: &[(&str, &str)]) -> gpumem::Estimate {
    init("value", knobs, &[]).knobs.estimate().unwrap()
}

#[test]
fn breakdown_labels_every_slice_with_the_engine_figures() {
    let html = render(&init("breakdown", SMALL, &[])).unwrap();
    let e = est(SMALL);
    assert!(html.contains(r#"data-widget="breakdown""#));
    assert!(html.contains(r#"role="img""#) && html.contains(r#"aria-live="polite""#));
    assert!(
        html.contains(&format!("Logits — {}", gib(e.components["logits"] as f64))),
        "{html}"
    );
    assert!(html.contains(&format!(
        "Activations — {}",
        gib(e.components["activations"] as f64)
    )));
    assert!(html.contains("1.24B parameters × 2 B (bf16)"), "{html}");
    assert!(html.contains("vocabulary (128,256)"));
    // The capacity is one of the labels, spread with them (never drawn over the axis).
    assert!(html.contains("H100-80GB capacity — "), "{html}");
    assert!(html.contains("✓") && html.contains("free"));
    assert!(html.contains(r#"role="toolbar""#) && html.contains("Save SVG"));
}

#[test]
fn timeline_names_every_op_and_marks_the_peak_the_estimate_reports() {
    let html = render(&init("timeline", SMALL, &[])).unwrap();
    let e = est(SMALL);
    assert!(
        html.contains(&format!("peak {}", gib(e.peak_bytes as f64))),
        "{html}"
    );
    let k = init("timeline", SMALL, &[]).knobs;
    let t = k.timeline();
    let t = t.as_ref().as_ref().unwrap();
    let peak = &t.points[t.peak];
    // The peak's column and op carry the estimate's phase in their title, and take Tab.
    let title = gpumem_widgets::timeline::label(peak);
    assert!(title.starts_with(&e.peak_phase), "{title}");
    let escaped = gpumem_widgets::format::escape_attr(&title);
    assert!(
        html.contains(&format!("<title>{escaped}</title>")),
        "{html}"
    );
    // A column of the whole step names the stretch of points it stands for (a reader saw
    // "layers 20–21" on a column over layers 12–21).
    assert!(html.contains(" · the highest from "), "{html}");
    // The peak's op takes Tab.
    let peak_op = html
        .split("<rect ")
        .map(|g| g.split('>').next().unwrap_or(""))
        .find(|g| g.contains(r#"class="gm-hit gm-op gm-peak-op""#))
        .expect("the peak's op");
    assert!(peak_op.contains(r#"tabindex="0""#), "{peak_op}");
    // Stacked by part, every column focusable, one in the tab order per chart.
    assert!(
        html.contains(r#"class="gm-f-activations""#) && html.contains(r#"class="gm-f-logits""#)
    );
    assert_eq!(html.matches(r#"tabindex="0""#).count(), 2, "{html}");
    assert!(html.matches(r#"tabindex="-1""#).count() > 100);
    assert!(html.contains(r#"aria-live="polite""#));
    // The caption's bookkeeping is the charts': what stays resident, and where the gradients
    // are at the peak.
    let resident = (e.weights_bytes + e.master_weights_bytes + e.optimizer_states_bytes) as f64;
    assert!(
        html.contains(&format!(
            "the weights and optimizer states stay resident, {}",
            gib(resident)
        )),
        "{html}"
    );
    assert!(html.contains("are not allocated yet at the peak"), "{html}");
    // With gradient accumulation they exist at the peak (the micro-batches after the first).
    let mut acc = SMALL.to_vec();
    acc.push(("grad-accum", "4"));
    let html = render(&init("timeline", &acc, &[])).unwrap();
    assert!(html.contains("are all alive at the peak"), "{html}");
    assert!(html.contains("micro-batch 4 of 4"), "{html}");
    // A pipeline's stages are each their own step: the widget says so.
    let mut pp = SMALL.to_vec();
    pp.extend([("pp", "2"), ("grad-accum", "2")]);
    let html = render(&init("timeline", &pp, &[])).unwrap();
    assert!(html.contains("stage by stage in the 5D panel"), "{html}");
}

#[test]
fn sweep_finds_exactly_where_it_stops_fitting() {
    use gpumem_widgets::sweep::{column_of, columns, first_over, samples};
    let html = render(&init(
        "sweep",
        SMALL,
        &[
            ("axis", "seq"),
            ("from", "1k"),
            ("to", "64k"),
            ("scale", "log"),
        ],
    ))
    .unwrap();
    let k = init("sweep", SMALL, &[]).knobs;
    let cols = columns(&k, "seq", &samples(1024, 65536, true));
    assert_eq!(cols.len(), 7);
    let i = cols
        .iter()
        .position(|c| !c.2)
        .expect("a 1B model at batch 4 stops fitting by 64K");
    assert!(cols[..i].iter().all(|c| c.2));
    let first = first_over(&k, "seq", cols[i - 1].0, cols[i].clone());
    assert!(!first.2 && column_of(&k, "seq", first.0 - 1).unwrap().2);
    assert!(
        html.contains(&format!(
            "Stops fitting at seq {} tokens",
            gpumem_widgets::format::count(first.0)
        )),
        "{html}"
    );
    for w in cols.windows(2) {
        assert!(w[1].3 >= w[0].3, "memory grows with the sequence");
    }
    let batch = render(&init("sweep", SMALL, &[("axis", "batch")])).unwrap();
    assert!(batch.contains("Memory against batch"));
    // The page's scenario refused (GPT-2 large holds 1,024 positions): the engine's reason,
    // not points drawn against a GPU of 0 GiB (a reader's review).
    let refused = render(&init(
        "sweep",
        &[("model", "gpt2-large"), ("seq", "2k")],
        &[("axis", "seq")],
    ))
    .unwrap();
    assert!(refused.contains("Cannot estimate: seq"), "{refused}");
    assert!(!refused.contains("0 GiB"), "{refused}");
    // A linear axis by default; its levers when asked for.
    let lin = render(&init(
        "sweep",
        SMALL,
        &[("axis", "seq"), ("levers", "attention,recompute")],
    ))
    .unwrap();
    assert!(
        lin.contains(r#"aria-checked="true" tabindex="0" class="gm-pill">linear"#),
        "{lin}"
    );
    assert!(lin.contains("Attention kernel") && lin.contains("Recomputation"));
}

/// gpt2 has learned positions for 1,024 tokens: the default sequence range (512 to 128K)
/// ends where the model does, on either axis, instead of being sampled where every point
/// is refused.
#[test]
fn a_sweep_ends_where_the_model_does() {
    use gpumem_widgets::sweep::last_taken;
    let gpt2 = [
        ("model", "gpt2"),
        ("batch", "4"),
        ("seq", "1k"),
        ("precision", "bf16"),
    ];
    let k = init("sweep", &gpt2, &[]).knobs;
    assert_eq!(last_taken(&k, "seq", 512, 131072), 1024);
    // A range the model takes whole, or one it refuses from the start, is left as asked.
    assert_eq!(last_taken(&k, "seq", 512, 1000), 1000);
    assert_eq!(last_taken(&k, "seq", 2048, 4096), 4096);
    let small = init("sweep", SMALL, &[]).knobs;
    assert_eq!(last_taken(&small, "seq", 512, 131072), 131072);
    for scale in ["linear", "log"] {
        let html = render(&init("sweep", &gpt2, &[("axis", "seq"), ("scale", scale)])).unwrap();
        assert!(html.contains("against seq, from 512 ("), "{html}");
        assert!(html.contains(") to 1K ("), "{scale}: {html}");
        assert!(!html.contains("128K"), "{scale}: {html}");
    }
    // Linear: evenly spaced samples between the two, not one point.
    let lin = render(&init("sweep", &gpt2, &[("axis", "seq")])).unwrap();
    assert!(
        lin.matches("<polygon class=\"gm-f-weights\"").count() == 1,
        "{lin}"
    );
    assert!(lin.contains(">768<") || lin.contains(">768 "), "{lin}");
}

/// A step far below the GPU is drawn to its own height: gpt2's 2 to 3 GiB on an 80 GB
/// device would otherwise be a hairline under the capacity line. The capacity is then
/// named above the chart (▲, as for what goes beyond it) without a line; a step near or
/// over the capacity keeps the line.
#[test]
fn a_sweep_far_below_the_gpu_is_drawn_to_its_own_height() {
    let capline = |html: &str| -> (String, String) {
        let tag = html
            .split("<line ")
            .map(|t| &t[..t.find('>').unwrap()])
            .find(|t| t.contains(r#"class="gm-capline""#))
            .expect("a capacity line");
        let attr = |a: &str| {
            let i = tag.find(&format!("{a}=\"")).unwrap() + a.len() + 2;
            tag[i..i + tag[i..].find('"').unwrap()].to_string()
        };
        (attr("x1"), attr("x2"))
    };
    let small = [
        ("model", "gpt2"),
        ("batch", "1"),
        ("seq", "512"),
        ("precision", "bf16"),
    ];
    let html = render(&init("sweep", &small, &[("axis", "seq")])).unwrap();
    let e = est(&small);
    assert!(e.peak_bytes * 4 < e.capacity_bytes);
    let (x1, x2) = capline(&html);
    assert_eq!(x1, x2, "no capacity line inside a zoomed chart: {html}");
    assert!(
        html.contains(&format!("H100-80GB {} ▲", gib(e.capacity_bytes as f64))),
        "{html}"
    );
    assert!(
        !html.contains(">80 GiB<") && html.contains(">1 GiB<"),
        "{html}"
    );
    let html = render(&init("sweep", SMALL, &[("axis", "seq")])).unwrap();
    let (x1, x2) = capline(&html);
    assert_ne!(x1, x2, "{html}");
    assert!(!html.contains(" ▲<") && html.contains(">75 GiB<"), "{html}");
}

#[test]
fn value_and_formula_show_the_engine_numbers() {
    let e = est(SMALL);
    let v = render(&init("value", SMALL, &[("quantity", "activations")])).unwrap();
    assert!(v.contains(&gib(e.components["activations"] as f64)), "{v}");
    let p = render(&init(
        "value",
        SMALL,
        &[("quantity", "params"), ("format", "count")],
    ))
    .unwrap();
    assert!(p.contains(&gpumem_widgets::format::count(e.params)), "{p}");
    let f = render(&init("formula", SMALL, &[("quantity", "weights")])).unwrap();
    assert!(
        f.contains("<var>M</var><sub>weights</sub> = 1.24B × 2 B (bf16) = "),
        "{f}"
    );
    assert!(f.contains(r#"aria-live="polite""#));
    let d = render(&init("formula", SMALL, &[("quantity", "device")])).unwrap();
    assert!(d.contains(&gib(e.device_bytes as f64)));
    let host = gpumem_widgets::host_html(&init("value", SMALL, &[("quantity", "peak")])).unwrap();
    assert!(
        host.starts_with("<span class=\"gm-host\""),
        "inline widgets sit in a sentence"
    );
}

#[test]
fn a_scenario_the_engine_refuses_renders_an_alert_not_a_panic() {
    for w in ["breakdown", "timeline", "formula"] {
        let html = render(&init(
            w,
            &[("model", "llama3.1-8b"), ("tp", "3")],
            &[("quantity", "weights")],
        ))
        .unwrap();
        assert!(html.contains("Cannot estimate"), "{w}: {html}");
    }
}

#[test]
fn zero_shards_the_engine_states_and_names_each_slice() {
    let k: &[(&str, &str)] = &[
        ("params", "7000000000"),
        ("precision", "mixed-bf16"),
        ("dp", "8"),
        ("zero-stage", "3"),
    ];
    let html = render(&init("zero", k, &[])).unwrap();
    let one = init(
        "value",
        &[("params", "7000000000"), ("precision", "mixed-bf16")],
        &[],
    )
    .knobs
    .estimate()
    .unwrap();
    let sharded = init("value", k, &[]).knobs.estimate().unwrap();
    assert!(html.contains(&gib(one.model_states_bytes as f64)), "{html}");
    assert!(
        html.contains(&format!(
            "{} per GPU",
            gib(sharded.model_states_bytes as f64)
        )),
        "{html}"
    );
    assert!(
        html.contains("Weights / 8 (sharded)") && html.contains("Optimizer states / 8 (sharded)")
    );
    assert!(html.contains("Weights = 7B × 2 B = "), "{html}");
    assert!(html.contains("Total = 7B × 16 B = "), "{html}");
    assert!(html.contains("7B parameters · 8 GPUs · ZeRO-3"), "{html}");
    // The chips carry the parts' colours.
    assert!(
        html.contains(
            r#"<li class="gm-chip"><span class="gm-swatch gm-c-master" aria-hidden="true">"#
        ),
        "{html}"
    );
    assert!(html.contains(r#"role="radiogroup""#) && html.contains(r#"aria-keyshortcuts="1""#));
    assert!(html.contains("H100-80GB") && html.contains("RTX-4090"));
    // Stage 1: weights and gradients stay whole; no badge for 7B on 8 GPUs.
    let s1 = render(&init(
        "zero",
        &[
            ("params", "7000000000"),
            ("precision", "mixed-bf16"),
            ("dp", "8"),
            ("zero-stage", "1"),
        ],
        &[],
    ))
    .unwrap();
    assert!(
        s1.contains("Weights (full)")
            && s1.contains("Gradients (full)")
            && s1.contains("Master weights / 8 (sharded)")
    );
    // 70B on one GPU does not fit any reference: the badge and the hatch.
    let big = render(&init(
        "zero",
        &[("params", "70000000000"), ("precision", "mixed-bf16")],
        &[],
    ))
    .unwrap();
    assert!(
        big.contains("DOESN&#x27;T FIT on A100-80GB") || big.contains("DOESN'T FIT on A100-80GB"),
        "names the largest reference GPU: {big}"
    );
    assert!(big.contains("· no ZeRO"), "{big}");
    assert!(big.contains("gm-hatch"));
    // A custom table: quantised inference.
    let custom = render(&init(
        "zero",
        &[("params", "7000000000")],
        &[
            ("segments", "INT4 weights:0.5:3,FP16 KV cache:1.5:3"),
            ("references", "RTX-4090"),
        ],
    ))
    .unwrap();
    // The lines add up as shown: 3.3 + 9.8 would not make 13.0, 3.26 + 9.78 make 13.04.
    assert!(
        custom.contains("INT4 weights = 7B × 0.50 B = 3.26 GiB"),
        "{custom}"
    );
    assert!(
        custom.contains("FP16 KV cache = 7B × 1.50 B = 9.78 GiB"),
        "{custom}"
    );
    assert!(custom.contains("Total = 7B × 2 B = 13.04 GiB"), "{custom}");
    assert!(gpumem_widgets::zero::parse_segments("x:1").is_err());
    assert!(gpumem_widgets::zero::parse_segments("x:1:4").is_err());
}

#[test]
fn budget_page_widgets_render_at_every_precision() {
    for p in ["fp32", "amp-bf16", "bf16", "mixed-bf16", "fp8"] {
        let k: &[(&str, &str)] = &[
            ("model", "llama3.1-8b"),
            ("batch", "8"),
            ("seq", "2k"),
            ("precision", p),
        ];
        for (w, q) in [
            ("allocator", ""),
            ("sweep", ""),
            ("timeline", ""),
            ("breakdown", ""),
            ("value", "activations"),
            ("value", "weights"),
            ("value", "params"),
            ("formula", "weights"),
            ("formula", "peak"),
            ("formula", "device"),
        ] {
            render(&init(w, k, &[("quantity", q)])).unwrap_or_else(|e| panic!("{w} {p}: {e}"));
        }
    }
}

#[test]
fn precision_shows_each_part_its_dtype_and_the_recipe() {
    let knobs = &[("model", "llama3.1-8b"), ("precision", "mixed-bf16")];
    let html = render(&init("precision", knobs, &[])).unwrap();
    let e = est(knobs);
    assert!(html.contains(r#"data-widget="precision""#));
    // The recipe radiogroup, Mixed BF16 checked.
    assert!(html.contains(r#"role="radiogroup""#));
    assert!(
        html.contains(r#"aria-checked="true" tabindex="0" class="gm-pill">Mixed BF16"#),
        "{html}"
    );
    // A row per part with its dtype selected and the engine's bytes.
    for (part, dtype) in [
        ("weights", "bf16"),
        ("master", "fp32"),
        ("grads", "bf16"),
        ("optimizer", "fp32"),
        ("activations", "bf16"),
        ("reduce", "bf16"),
    ] {
        let row = html
            .split(&format!(r#"data-part="{part}""#))
            .nth(1)
            .unwrap();
        let row = &row[..row.find("</tr>").unwrap()];
        assert!(
            row.contains(&format!(r#"<option value="{dtype}" selected="selected">"#)),
            "{part}: {row}"
        );
    }
    assert!(html.contains(&gib(e.master_weights_bytes as f64)));
    assert!(html.contains(&gib(e.optimizer_states_bytes as f64)));
    assert!(html.contains(&gib(e.device_bytes as f64)));
    assert!(html.contains(r#"aria-live="polite""#));

    // 8-bit Adam and QLoRA are recipes too; a custom mix checks none.
    let q = render(&init(
        "precision",
        &[("precision", "bf16"), ("finetune", "qlora")],
        &[],
    ))
    .unwrap();
    assert!(
        q.contains(r#"aria-checked="true" tabindex="0" class="gm-pill">QLoRA NF4"#),
        "{q}"
    );
    let c = render(&init(
        "precision",
        &[("precision", "mixed-bf16,grads=fp32")],
        &[],
    ))
    .unwrap();
    assert!(!c.contains(r#"aria-checked="true""#));
    assert!(c.contains("· custom ·"));
}

#[test]
fn parallelism_shows_every_stage_and_the_planner_table() {
    let knobs = &[
        ("model", "llama3.1-70b"),
        ("seq", "8k"),
        ("dp", "2"),
        ("tp", "8"),
        ("pp", "4"),
        ("grad-accum", "8"),
        ("precision", "mixed-bf16"),
        ("framework", "megatron"),
        ("zero-stage", "1"),
    ];
    let html = render(&init("parallelism", knobs, &[])).unwrap();
    let e = est(knobs);
    assert_eq!(e.stages.len(), 4);
    assert!(html.contains(r#"data-widget="parallelism""#));
    for i in 0..4 {
        assert!(html.contains(&format!(r#"data-stage="{i}""#)));
    }
    assert!(html.contains("64 GPUs"), "{html}");
    assert!(html.contains(&gib(e.device_bytes as f64)));
    // The planner's layouts of the same 64 GPUs, each with a button that applies it.
    assert!(html.contains("Layouts of 64 GPUs for a global batch of 16 sequences"));
    assert!(html.contains(r#"aria-label="Use layout 1""#));
    // The button of the layout shown says so to a screen reader (pressed), and only it.
    let pressed = html.matches(r#"aria-pressed="true""#).count();
    assert!(
        pressed <= 1 && html.contains(r#"aria-pressed="false""#),
        "{pressed}"
    );
    assert_eq!(
        pressed,
        html.matches("gm-current").count().min(1),
        "the row shown and the pressed button go together"
    );
    // Architecture fields, the paste box, the sharding radiogroup.
    assert!(html.contains(r#"id="t-layers""#) && html.contains(r#"value="80""#));
    assert!(html.contains("paste a config.json") && html.contains("<textarea"));
    assert!(html.contains(r#"role="radiogroup""#));
    assert!(html.contains(r#"role="img""#) && html.contains(r#"aria-live="polite""#));
}

#[test]
fn the_teaching_widgets_render_their_engine_figures_before_any_script() {
    let over = &[
        ("model", "llama3.1-8b"),
        ("batch", "4"),
        ("seq", "2k"),
        ("precision", "bf16"),
    ];
    // Remedies: every applicable one with its changes on a Use button, best first.
    let html = render(&init("remedies", over, &[])).unwrap();
    let e = est(over);
    assert!(html.contains(&format!("It does not fit: {}", gib(e.device_bytes as f64))));
    let full = est(&[
        ("model", "llama3.1-8b"),
        ("batch", "4"),
        ("seq", "2k"),
        ("precision", "bf16"),
        ("recompute", "full"),
    ]);
    // The saving as the difference of the two figures shown.
    let (now, after) = (e.device_bytes as f64, full.device_bytes as f64);
    let sum = gpumem_widgets::format::Sum::of(now);
    assert!(html.contains(&format!(
        "saves {}: the GPU needs {}",
        sum.show(sum.units(now) - sum.units(after)),
        gib(after)
    )));
    assert!(html.contains(r#"data-with="recompute=full""#), "{html}");
    // The two without a figure (expandable segments, a memory summary) are the chapter's prose.
    assert!(!html.contains("expandable_segments:True"));
    // An exercise: the question and the field; the answer only inside the closed solution.
    let html = render(&init(
        "exercise",
        over,
        &[
            ("ask", "peak"),
            ("question", "What <b>is</b> the peak?"),
            ("solution", "peak"),
        ],
    ))
    .unwrap();
    assert!(
        html.contains("What &lt;b&gt;is&lt;/b&gt; the peak?"),
        "markup is text: {html}"
    );
    let solution = html.find("<details").unwrap();
    let answer = html
        .find(&format!("Answer: {}.", gib(e.peak_bytes as f64)))
        .unwrap();
    assert!(answer > solution && !html.contains("<details open"));
    assert!(html.contains(r#"aria-live="polite""#));
    // A waterfall and a ledger.
    let html = render(&init("diff", over, &[("with", "recompute=full")])).unwrap();
    assert!(html.contains(&format!(
        r#"data-from="{}" data-to="{}""#,
        e.peak_bytes, full.peak_bytes
    )));
    // Its ends are the allocated peaks (the context is not in them, as it is in a total).
    assert_eq!(html.matches(">Allocated peak of ").count(), 2, "{html}");
    let html = render(&init("ledger", over, &[("of", "layer")])).unwrap();
    assert!(
        html.contains("down_proj") && html.contains("b·s·i<br>4 × 2,048 × 14,336"),
        "{html}"
    );
}

/// The zero widget's lines read each part as itself: GPT-2's 0.23 GiB of bf16 weights read
/// "0.3 GiB" on the whole-model side (rounded at the total's one decimal, then nudged to add
/// up) and "0.23 GiB" on the per-GPU side; and a ZeRO-3 shard over 1,024 GPUs, a few MiB,
/// read "0.00 GiB".
#[test]
fn zero_lines_read_each_part_as_itself() {
    let k: &[(&str, &str)] = &[
        ("params", "124439808"),
        ("precision", "mixed-bf16"),
        ("dp", "8"),
        ("zero-stage", "1"),
    ];
    let html = render(&init("zero", k, &[])).unwrap();
    assert!(
        html.contains("Weights = 124M × 2 B = 0.23 GiB → 0.23 GiB per GPU, not sharded"),
        "{html}"
    );
    let k: &[(&str, &str)] = &[
        ("params", "124439808"),
        ("precision", "mixed-bf16"),
        ("dp", "1024"),
        ("zero-stage", "3"),
    ];
    let html = render(&init("zero", k, &[])).unwrap();
    assert!(!html.contains("0.00 GiB"), "{html}");
    assert!(html.contains(" / 1024 = 0.0002 GiB per GPU"), "{html}");
}

/// The ZeRO widget's lines add up as shown, on one GPU and per GPU: a reader's sum of the
/// parts is the total printed (12B under mixed bf16, ZeRO-2 over 8, read 22.4 + 5.6 + 11.2
/// + 2.8 = 42.0 against "41.9 GiB per GPU").
#[test]
fn zero_lines_add_up_to_their_totals_as_shown() {
    // The figures before " GiB" in a line, in order.
    let gibs = |line: &str| -> Vec<f64> {
        line.split(" GiB")
            .filter_map(|before| before.rsplit(' ').next()?.replace(',', "").parse().ok())
            .collect()
    };
    let (mut checked, mut approx_seen) = (0, 0);
    for params in [
        "124439808",
        "7000000000",
        "12000000000",
        "70000000000",
        "405000000000",
    ] {
        for (dp, stage) in [("8", "0"), ("8", "1"), ("8", "2"), ("64", "3"), ("3", "2")] {
            let k: &[(&str, &str)] = &[
                ("params", params),
                ("precision", "mixed-bf16"),
                ("dp", dp),
                ("zero-stage", stage),
            ];
            let html = render(&init("zero", k, &[])).unwrap();
            let list = html.split(r#"class="gm-formula-lines">"#).nth(1).unwrap();
            let list = list.split("</ul>").next().unwrap();
            let lines: Vec<Vec<f64>> = list
                .split("<li>")
                .skip(1)
                .map(|l| gibs(&l.replace("<strong>", "")))
                .collect();
            let (parts, total) = lines.split_at(lines.len() - 1);
            let total = &total[0];
            // The total line: "Total = … = A GiB → B GiB per GPU", "≈" before a figure
            // its lines do not add up to as shown.
            let last = list.rsplit("<li>").next().unwrap();
            let approx = [last.contains(" B ≈ "), last.contains("→ ≈ ")];
            for col in 0..total.len() {
                let sum: f64 = parts.iter().map(|p| p[p.len().min(col + 1) - 1]).sum();
                if approx[col] {
                    assert!(
                        (sum - total[col]).abs() > 1e-6,
                        "{params} dp={dp} stage {stage}: ≈ where the lines add up"
                    );
                    approx_seen += 1;
                    continue;
                }
                assert!(
                    (sum - total[col]).abs() < 1e-6,
                    "{params} dp={dp} stage {stage}: {parts:?} add to {sum}, not {}",
                    total[col]
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 25);
    // Most add up; where four parts rounded on their own cannot (12B over 64: 0.3 + 0.7 +
    // 1.4 + 0.3 at one decimal or up to three), the total says so.
    assert!((1..5).contains(&approx_seen), "{approx_seen}");
}

/// The ledgers' arithmetic reads as shown: the loss's forward rows add up to the sum under
/// them (3.9 + 7.8 + 7.8 was captioned 19.6), and a layer's figure times its layers gives
/// their total (0.77 × 32 was captioned 24.5).
#[test]
fn ledger_sums_and_products_read_as_shown() {
    let figures = |html: &str, after: &str| -> Vec<f64> {
        html.split(after)
            .skip(1)
            .filter_map(|t| t.split(" GiB").next()?.trim().parse().ok())
            .collect()
    };
    // (Each of the loss's tensors at least 1 GiB: below, the rows read in MiB.)
    for (batch, seq) in [("4", "4096"), ("3", "2000"), ("8", "8192"), ("5", "1000")] {
        let k: &[(&str, &str)] = &[("model", "llama3.2-1b"), ("batch", batch), ("seq", seq)];
        let html = render(&init("ledger", k, &[("of", "loss")])).unwrap();
        let rows = figures(&html, r#"aria-hidden="true"></span> "#);
        assert_eq!(rows.len(), 6, "{html}");
        let said = figures(&html, "add up to ")[0];
        let approx = html.contains("add up to about ");
        let sum: f64 = rows[..3].iter().sum();
        assert!(
            approx || (sum - said).abs() < 1e-6,
            "b={batch} s={seq}: {rows:?} → {said}"
        );
        let k: &[(&str, &str)] = &[("model", "llama3.1-8b"), ("batch", batch), ("seq", seq)];
        let html = render(&init("ledger", k, &[("of", "layer")])).unwrap();
        let each = figures(&html, "One layer keeps ")[0];
        let all = figures(&html, " layers of this kind, ")[0];
        let rounded = (each * 32.0 * 10.0).round() / 10.0;
        assert!(
            (rounded - all).abs() < 1e-6,
            "b={batch} s={seq}: {each} × 32 → {all}"
        );
    }
}

/// The budget's legend adds up to the total it shows (15.0 + 29.9 + 0.0 + 24.6 + 6.8 + 0.1 +
/// 0.7 had read 77.1 against a total of 77.2), in the budget and the precision widgets.
#[test]
fn legends_add_up_to_the_total_shown() {
    let num = |t: &str| -> f64 { t.replace(',', "").parse().unwrap() };
    let figures = |html: &str, after: &str| -> Vec<f64> {
        html.split(after)
            .skip(1)
            .filter_map(|t| t.split(" GiB").next())
            .map(num)
            .collect()
    };
    let mut checked = 0;
    for (model, batch, seq) in [
        ("llama3.1-8b", "2", "2k"),
        ("llama3.1-8b", "1", "2k"),
        ("llama3.2-1b", "3", "4k"),
        ("qwen2.5-7b", "5", "1k"),
        ("gpt2", "7", "1k"),
        ("mixtral-8x7b", "1", "8k"),
    ] {
        for widget in ["allocator", "precision"] {
            let k: &[(&str, &str)] = &[("model", model), ("batch", batch), ("seq", seq)];
            let html = render(&init(widget, k, &[])).unwrap();
            let legend = html.split(r#"class="gm-legend""#).nth(1).expect("a legend");
            let parts = figures(legend, r#"<span class="gm-num">"#);
            let at = html.find(r#"data-value="total""#).expect("a total");
            let after = &html[at..][html[at..].find('>').unwrap() + 1..];
            let total = num(after.split(" GiB").next().unwrap());
            let sum: f64 = parts.iter().sum();
            assert!(!parts.is_empty());
            // Where no rounding up to two more decimals adds up (Mixtral's 350.77 GiB at 8k:
            // its parts make 350.9, 350.76 and 350.769), the parts read as they round alone.
            let e = init(widget, k, &[]).knobs.estimate().unwrap();
            let slices = gpumem_widgets::parts::of_estimate(&e);
            let exact =
                gpumem_widgets::allocator::sum_of(&slices, e.device_bytes as f64).eq() == "=";
            assert!(
                !exact || (sum - total).abs() < 1e-6,
                "{widget} {model} b={batch} s={seq}: {parts:?} → {total}"
            );
            checked += usize::from(exact);
        }
    }
    assert!(checked >= 10, "{checked}");
}
