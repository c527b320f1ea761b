//! Predicted vs measured: every calibration run through the `gpumem` binary.
//! Data: tests/data (copied from the shared H100 measurements; see tests/data/README.md).

use std::process::Command;

use serde_json::Value;

fn data(name: &str) -> String {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/");
    std::fs::read_to_string(format!("{p}{name}")).expect("tests/data present")
}

fn cli_estimate(scenario: &Value) -> Value {
    let f = tempfile::Builder::new()
        .prefix("gpumem-fid-")
        .suffix(".json")
        .tempfile()
        .unwrap();
    std::fs::write(f.path(), scenario.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["estimate", "--json", "--scenario"])
        .arg(f.path())
        .output()
        .expect("run gpumem");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON out")
}

#[test]
fn predictions_meet_the_fidelity_goals() {
    let mut errors = Vec::new();
    let mut report = String::new();
    for (i, line) in data("calibration-scenarios.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
    {
        let case: Value = serde_json::from_str(line).unwrap();
        let name = case["name"].as_str().unwrap();
        let exp = &case["expect"];
        let got = cli_estimate(&case["scenario"]);
        if let Some(p) = exp["params"].as_u64() {
            assert_eq!(got["params"].as_u64(), Some(p), "{name}: parameter count");
        }
        if let Some(kv) = exp["kv_cache_bytes"].as_u64() {
            assert_eq!(
                got["kv_cache_bytes"].as_u64(),
                Some(kv),
                "{name}: KV cache bytes"
            );
        }
        if exp["oom"].as_bool() == Some(true) {
            assert_eq!(
                got["fits"].as_bool(),
                Some(false),
                "{name}: measured OOM, predicted to fit"
            );
            continue;
        }
        assert_eq!(
            got["fits"].as_bool(),
            Some(true),
            "{name}: ran on the H100, predicted not to fit"
        );
        let measured = exp["peak_step"]
            .as_f64()
            .or(exp["peak_generate"].as_f64())
            .unwrap();
        // measure.py's figures start from a baseline that holds cuBLAS's workspaces, taken
        // by the process's first run (which counts them): the later runs are compared
        // without them (as `gpumem::validation` compares).
        let held = if i > 0 {
            got["cublas_workspace_bytes"].as_f64().unwrap()
        } else {
            0.0
        };
        let predicted = got["peak_bytes"].as_f64().unwrap() - held;
        let err = predicted / measured - 1.0;
        report.push_str(&format!("{name:58} {:+6.2} %\n", err * 100.0));
        errors.push(err.abs());
    }
    errors.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let median = errors[errors.len() / 2];
    let worst = *errors.last().unwrap();
    println!(
        "{report}{} runs: median |error| {:.2} %, worst {:.2} %",
        errors.len(),
        median * 100.0,
        worst * 100.0
    );
    assert!(errors.len() >= 30, "calibration set shrank");
    assert!(
        median <= 0.01,
        "median |error| {:.2} % > 1 %\n{report}",
        median * 100.0
    );
    assert!(
        worst <= 0.05,
        "worst |error| {:.2} % > 5 %\n{report}",
        worst * 100.0
    );
}

/// The raw measurement file agrees with the scenario file (same runs, same counts).
#[test]
fn raw_measurements_match_the_scenarios() {
    let raw: Vec<Value> = data("h100-calibration.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &Value| v["kind"] != "env")
        .collect();
    let scen = data("calibration-scenarios.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count();
    assert_eq!(raw.len(), scen);
}

#[test]
fn bad_input_exits_2_with_the_field_named() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gpumem"))
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&["estimate", "--model", "llama3.1-8b", "--batch", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("batch"));
    let o = run(&["estimate", "--model", "no-such-model"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("model.preset"));
    let f = tempfile::Builder::new()
        .prefix("gpumem-bad-")
        .suffix(".json")
        .tempfile()
        .unwrap();
    std::fs::write(
        f.path(),
        "{\"model\": {\"preset\": \"gpt2\"},\n \"seq\": NaN}",
    )
    .unwrap();
    let o = run(&["estimate", "--scenario", f.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(":2:"), "file:line in {err}");
    let o = run(&["estimate", "--model", "gpt2", "--gpu", "TPU-9000"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("gpu"));
}

#[test]
fn table_output_and_presets() {
    let o = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args([
            "estimate",
            "--model",
            "llama3.2-1b",
            "--batch",
            "1",
            "--seq",
            "2048",
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("verdict") && s.contains("fits"), "{s}");
    let o = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["presets", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "llama3.1-405b" && p["params"] == 405_853_388_800u64));
}

#[test]
fn hf_config_flag_reads_a_config_json() {
    let tmp = tempfile::Builder::new()
        .prefix("gpumem-cfg-")
        .suffix(".json")
        .tempfile()
        .unwrap();
    let f = tmp.path();
    // Qwen2.5-0.5B's published config.json (abridged; unknown keys are ignored).
    std::fs::write(
        f,
        r#"{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
            "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": true,
            "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "use_sliding_window": false}"#,
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args([
            "estimate",
            "--json",
            "--hf-config",
            f.to_str().unwrap(),
            "--seq",
            "512",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["params"], 494_032_768u64);
    std::fs::write(f, r#"{"model_type": "llama", "hidden_size": 64}"#).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["estimate", "--hf-config", f.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("model.hf_config.num_attention_heads"), "{err}");
    assert!(err.contains(f.to_str().unwrap()), "names the file: {err}");
}
