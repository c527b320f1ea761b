//! `gpumem plan` and the model-parallel flags of `gpumem estimate`, through the binary.

use std::process::Command;

fn gpumem(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(args)
        .output()
        .expect("run gpumem");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn plan_prints_a_ranked_table_and_json() {
    let args = [
        "plan",
        "--model",
        "llama3.1-70b",
        "--seq",
        "8192",
        "--precision",
        "mixed-bf16",
        "--global-batch",
        "128",
        "--gpus",
        "16..64",
        "--no-offload",
        "--top",
        "3",
    ];
    let (ok, out, err) = gpumem(&args);
    assert!(ok, "{err}");
    assert!(out.contains("fewest GPUs with a layout that fits"), "{out}");
    assert!(out.contains("cost model:"), "{out}");
    let mut json = args.to_vec();
    json.push("--json");
    let (ok, out, _) = gpumem(&json);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["best"].as_array().unwrap().len(), 3);
    assert!(v["considered"].as_u64().unwrap() > v["fitting"].as_u64().unwrap());
}

#[test]
fn estimate_takes_layout_flags_and_plan_errors_name_the_flag() {
    let (ok, out, err) = gpumem(&[
        "estimate",
        "--model",
        "llama3.1-70b",
        "--seq",
        "8192",
        "--tp",
        "8",
        "--pp",
        "4",
        "--grad-accum",
        "8",
        "--framework",
        "megatron",
        "--zero",
        "1",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("stage 1 of 4"), "{out}");
    let (ok, _, err) = gpumem(&["estimate", "--model", "llama3.1-8b", "--tp", "3"]);
    assert!(!ok);
    assert!(err.contains("parallel.tp"), "{err}");
    let (ok, _, err) = gpumem(&["plan", "--model", "llama3.1-8b", "--gpus", "x"]);
    assert!(!ok);
    assert!(err.contains("gpus"), "{err}");
    let (ok, _, err) = gpumem(&["estimate", "--model", "llama3.1-8b", "--gpus", "8"]);
    assert!(!ok);
    assert!(err.contains("unexpected argument '--gpus'"), "{err}");
}

/// The README's transcripts are what the binary prints today: each `$ gpumem …` block's
/// lines are the command's output, or its first lines (a long table may be cut short).
#[test]
fn the_readme_shows_what_the_commands_print() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    let text = std::fs::read_to_string(path).expect("README.md");
    let lines: Vec<&str> = text.lines().collect();
    let mut checked = 0;
    for (i, l) in lines.iter().enumerate() {
        let Some(cmd) = l.strip_prefix("$ gpumem ") else {
            continue;
        };
        let shown: Vec<&str> = lines[i + 1..]
            .iter()
            .take_while(|l| !l.starts_with("```"))
            .copied()
            .collect();
        let args: Vec<&str> = cmd.split_whitespace().collect();
        let (ok, out, err) = gpumem(&args);
        assert!(ok, "README.md:{}: {err}", i + 1);
        let got: Vec<&str> = out.lines().collect();
        assert!(shown.len() > 3, "README.md:{}: no output shown", i + 1);
        for (j, want) in shown.iter().enumerate() {
            assert_eq!(
                got.get(j).copied().unwrap_or("<end of output>").trim_end(),
                want.trim_end(),
                "README.md:{}: line {} of `gpumem {cmd}`",
                i + 1,
                j + 1
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 3, "the README's transcripts");
}
