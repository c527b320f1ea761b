//! The command line as a user meets it, through the binary: help, version, suggestions,
//! completions, exit codes, and inputs that must be refused quickly and clearly.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Run `gpumem`; a run that outlives a generous watchdog is killed and fails the test (it
/// would have hung or read without end).
fn gpumem(args: &[&str]) -> Out {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gpumem");
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("gpumem {args:?} still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A path named `name` in a directory of its own, removed with it when the test is done.
struct Tmp {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for Tmp {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.path
    }
}

impl AsRef<std::path::Path> for Tmp {
    fn as_ref(&self) -> &std::path::Path {
        &self.path
    }
}

fn tmp(name: &str) -> Tmp {
    let dir = tempfile::Builder::new()
        .prefix("gpumem-cli-")
        .tempdir()
        .unwrap();
    Tmp {
        path: dir.path().join(name),
        _dir: dir,
    }
}

#[test]
fn help_and_version_are_conventional() {
    let o = gpumem(&["--help"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    for cmd in ["estimate", "plan", "presets", "completions", "help"] {
        assert!(o.stdout.contains(cmd), "--help lists {cmd}:\n{}", o.stdout);
    }
    assert!(o.stdout.contains("Exit codes: 0 ok, 2 bad input"));
    let o = gpumem(&["--version"]);
    assert_eq!(o.code, 0);
    assert_eq!(
        o.stdout.trim(),
        format!("gpumem {}", env!("CARGO_PKG_VERSION"))
    );

    let o = gpumem(&["estimate", "--help"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    for flag in [
        "--scenario <FILE>",
        "--model <NAME>",
        "--hf-config <FILE>",
        "--mode <MODE>",
        "--batch <N>",
        "--seq <N>",
        "--new-tokens <N>",
        "--precision <RECIPE>",
        "--optimizer <NAME>",
        "--recompute <WHAT>",
        "--attention <KERNEL>",
        "--loss <LOSS>",
        "--finetune <HOW>",
        "--gpu <NAME>",
        "--allocator <MODE>",
        "--dp <N>",
        "--tp <N>",
        "--pp <N>",
        "--cp <N>",
        "--ep <N>",
        "--zero <STAGE>",
        "--fsdp <STRATEGY>",
        "--framework <NAME>",
        "--grad-accum <N>",
        "--schedule <NAME>",
        "--virtual-stages <N>",
        "--sp <on|off>",
        "--loss-parallel <on|off>",
        "--wrap <HOW>",
        "--offload <WHAT>",
        "--json",
    ] {
        assert!(
            o.stdout.contains(flag),
            "estimate --help: {flag}\n{}",
            o.stdout
        );
    }
    // What each does, its values and its default.
    for text in [
        "mixed-bf16",
        "[default: 2048]",
        "full_shard, shard_grad_op, no_shard or hybrid_shard",
        "layers",
        "titan",
        "expandable",
        "4 MiB",
    ] {
        assert!(
            o.stdout.contains(text),
            "estimate --help: {text}\n{}",
            o.stdout
        );
    }
    assert!(
        !o.stdout.contains("--gpus <COUNTS>"),
        "plan's flags are plan's"
    );

    let o = gpumem(&["plan", "--help"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    for flag in [
        "--gpus <COUNTS>",
        "--global-batch <N>",
        "--gpus-per-node <N>",
        "--top <N>",
        "--no-offload",
        "--host-memory-gb <GB>",
        "--model <NAME>",
        "--tp <N>",
        "8..128:8",
    ] {
        assert!(o.stdout.contains(flag), "plan --help: {flag}\n{}", o.stdout);
    }
    // `help SUBCOMMAND` as well.
    let o = gpumem(&["help", "plan"]);
    assert_eq!(o.code, 0);
    assert!(o.stdout.contains("--no-offload"));
    // Nothing given: the usage, on stderr, and 2.
    let o = gpumem(&[]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("Usage: gpumem"), "{}", o.stderr);
}

#[test]
fn a_reader_that_goes_away_is_no_error() {
    // `gpumem presets | head -0`: the pipe is closed before gpumem writes.
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .args(["presets", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

#[test]
fn a_misspelled_flag_gets_a_suggestion_and_exit_2() {
    let o = gpumem(&["estimate", "--model", "gpt2", "--precison", "bf16"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("'--precison'"), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("a similar argument exists: '--precision'"),
        "a suggestion: {}",
        o.stderr
    );
    let o = gpumem(&["estimat", "--model", "gpt2"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("'estimate'"), "{}", o.stderr);
    // A plan flag given to estimate is refused, not dropped.
    let o = gpumem(&["estimate", "--model", "gpt2", "--gpus", "8"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("'--gpus'"), "{}", o.stderr);
    // A value where none belongs, or none where one does.
    let o = gpumem(&["estimate", "--model"]);
    assert_eq!(o.code, 2);
    let o = gpumem(&["estimate", "--model", "gpt2", "--loss-parallel", "maybe"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("must be on or off"), "{}", o.stderr);
    // Two models: refused rather than one silently winning.
    let cfg = tmp("conflict.json");
    std::fs::write(&cfg, "{}").unwrap();
    let o = gpumem(&[
        "estimate",
        "--model",
        "gpt2",
        "--hf-config",
        cfg.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("cannot be used with"), "{}", o.stderr);
}

#[test]
fn presets_refuses_what_it_does_not_know() {
    let o = gpumem(&["presets", "--bogus"]);
    assert_eq!(o.code, 2, "{}", o.stdout);
    assert!(o.stderr.contains("'--bogus'"), "{}", o.stderr);
    let o = gpumem(&["presets"]);
    assert_eq!(o.code, 0);
    assert!(o.stdout.contains("llama3.1-8b"));
    let o = gpumem(&["presets", "--json"]);
    assert_eq!(o.code, 0);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert!(v.as_array().unwrap().len() > 5);
}

#[test]
fn completions_are_printed_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F _gpumem"),
        ("zsh", "#compdef gpumem"),
        ("fish", "complete -c gpumem"),
    ] {
        let o = gpumem(&["completions", shell]);
        assert_eq!(o.code, 0, "{shell}: {}", o.stderr);
        assert!(o.stdout.contains(marker), "{shell}:\n{}", o.stdout);
        assert!(o.stdout.contains("hf-config"), "{shell}: flags completed");
    }
    let o = gpumem(&["completions", "tcsh"]);
    assert_eq!(o.code, 2);
}

#[test]
fn a_byte_order_mark_is_accepted() {
    let scenario = tmp("bom-scenario.json");
    std::fs::write(
        &scenario,
        "\u{feff}{\"model\": {\"preset\": \"gpt2\"}, \"batch\": 2, \"seq\": 512}",
    )
    .unwrap();
    let o = gpumem(&["estimate", "--scenario", scenario.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("gpt2"));
    let config = tmp("bom-config.json");
    std::fs::write(
        &config,
        "\u{feff}{\"model_type\": \"llama\", \"hidden_size\": 512, \"intermediate_size\": 1024, \
         \"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"num_key_value_heads\": 8, \
         \"vocab_size\": 1000}",
    )
    .unwrap();
    let o = gpumem(&["estimate", "--hf-config", config.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

#[test]
fn files_that_are_not_small_regular_files_are_refused_quickly() {
    let fifo = tmp("fifo.json");
    let big = tmp("big.json");
    let cases: Vec<(String, &str)> = {
        let made = Command::new("mkfifo").arg(&*fifo).status().unwrap();
        assert!(made.success());
        let f = std::fs::File::create(&*big).unwrap();
        f.set_len((4 << 20) + 1).unwrap();
        vec![
            ("/dev/zero".into(), "is a character device"),
            (fifo.to_str().unwrap().into(), "is a FIFO"),
            (
                std::env::temp_dir().to_str().unwrap().into(),
                "is a directory",
            ),
            (big.to_str().unwrap().into(), "larger than 4 MiB"),
        ]
    };
    for flag in ["--scenario", "--hf-config"] {
        for (path, why) in &cases {
            let o = match flag {
                "--scenario" => gpumem(&["estimate", "--model", "gpt2", flag, path]),
                _ => gpumem(&["estimate", flag, path]),
            };
            assert_eq!(o.code, 2, "{flag} {path}: {}", o.stdout);
            assert!(
                o.stderr.contains(path.as_str()) && o.stderr.contains(why),
                "{flag} {path}: {}",
                o.stderr
            );
        }
    }
    // Just under the cap is read (and is then judged as JSON).
    let near = tmp("near.json");
    let mut text = String::from("{\"model\": {\"preset\": \"gpt2\", \"name\": \"");
    text.push_str(&"x".repeat((4 << 20) - 100));
    text.push_str("\"}, \"seq\": 512}");
    std::fs::write(&near, text).unwrap();
    let o = gpumem(&["estimate", "--scenario", near.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    // Not UTF-8.
    let bin = tmp("bin.json");
    std::fs::write(&bin, b"{\"model\": \"\xff\"}").unwrap();
    let o = gpumem(&["estimate", "--scenario", bin.to_str().unwrap()]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("not UTF-8"), "{}", o.stderr);
}

#[test]
fn overflowing_numbers_are_refused_in_words() {
    for (flag, bound) in [
        ("--dp", "at most 1048576 GPUs"),
        ("--grad-accum", "at most 1048576 micro-batches"),
        ("--batch", "at most 16777216 sequences"),
        ("--seq", "at most 134217728 tokens"),
        ("--zero", "ZeRO stages are 0 to 3"),
    ] {
        let o = gpumem(&["estimate", "--model", "gpt2", flag, "18446744073709551616"]);
        assert_eq!(o.code, 2, "{flag}");
        assert!(
            o.stderr
                .contains(&format!("18446744073709551616 is too large ({bound})")),
            "{flag}: {}",
            o.stderr
        );
        assert!(!o.stderr.contains("18446744073709551615"), "{}", o.stderr);
    }
    let o = gpumem(&[
        "plan",
        "--model",
        "gpt2",
        "--global-batch",
        "99999999999999999999999",
    ]);
    assert_eq!(o.code, 2);
    assert!(
        o.stderr
            .contains("is too large (at most 16777216 sequences)"),
        "{}",
        o.stderr
    );
    let o = gpumem(&["estimate", "--model", "gpt2", "--batch", "-3"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("'-3' is negative"), "{}", o.stderr);
}

/// The bounds the overflow messages state are the engine's: one past each is refused by the
/// engine, which names the same bound.
#[test]
fn the_bounds_in_the_messages_are_the_engines() {
    for (flag, field, past, bound) in [
        ("--dp", "parallel.dp", "1048577", "1048576"),
        ("--tp", "parallel.tp", "1048577", "1048576"),
        ("--grad-accum", "parallel.grad_accum", "1048577", "1048576"),
        ("--batch", "batch", "16777217", "16777216"),
        ("--seq", "seq", "134217729", "134217728"),
        ("--new-tokens", "new_tokens", "134217729", "134217728"),
    ] {
        let o = gpumem(&["estimate", "--model", "llama3.1-8b", flag, past]);
        assert_eq!(o.code, 2, "{flag} {past}: {}", o.stdout);
        assert!(
            o.stderr.contains(field) && o.stderr.contains(bound),
            "{flag} {past}: {}",
            o.stderr
        );
    }
}

#[test]
fn engine_errors_exit_2_and_name_the_field_not_the_file_when_a_flag_set_it() {
    let o = gpumem(&["estimate", "--model", "no-such-model"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("model"), "{}", o.stderr);
    let scenario = tmp("base.json");
    std::fs::write(
        &scenario,
        r#"{"model": {"preset": "llama3.1-8b"}, "seq": 4096, "parallel": {"pp": 2}}"#,
    )
    .unwrap();
    let path = scenario.to_str().unwrap();
    // Flags override the file's fields one by one, inside `parallel` too.
    let o = gpumem(&["estimate", "--scenario", path, "--tp", "2", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert!(v["notes"].to_string().contains("stage"), "pp 2 kept: {v}");
    let o = gpumem(&["estimate", "--scenario", path, "--tp", "3"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("parallel.tp"), "{}", o.stderr);
    assert!(
        !o.stderr.contains(path),
        "the flag's error, not the file's: {}",
        o.stderr
    );
    std::fs::write(
        &scenario,
        r#"{"model": {"preset": "llama3.1-8b"}, "batch": 0}"#,
    )
    .unwrap();
    let o = gpumem(&["estimate", "--scenario", path, "--seq", "512"]);
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.contains(&format!("{path}: batch")),
        "the file's error names the file: {}",
        o.stderr
    );
    let o = gpumem(&["estimate", "--seq", "512"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("no model"), "{}", o.stderr);
}

/// A flag the run would not use is refused by name, never silently ignored: what only
/// training uses in inference, --new-tokens in training, a setting of a parallelism the run
/// does not have, a setting another one overrides.
#[test]
fn flags_the_run_would_not_use_are_refused_by_name() {
    let refused: &[(&[&str], &str)] = &[
        (&["--new-tokens", "64"], "--new-tokens"),
        (
            &["--mode", "inference", "--optimizer", "sgd"],
            "--optimizer",
        ),
        (
            &["--mode", "inference", "--recompute", "full"],
            "--recompute",
        ),
        (
            &["--mode", "inference", "--grad-accum", "4"],
            "--grad-accum",
        ),
        (&["--sp", "off"], "--sp"),
        (&["--loss-parallel", "off"], "--loss-parallel"),
        (&["--cp-load-balance", "off"], "--cp-load-balance"),
        (&["--ep-impl", "hf"], "--ep-impl"),
        (
            &[
                "--tp",
                "2",
                "--framework",
                "megatron",
                "--loss-parallel",
                "off",
            ],
            "--loss-parallel",
        ),
        (
            &["--mode", "inference", "--framework", "megatron"],
            "--framework",
        ),
        (&["--schedule", "gpipe"], "--schedule"),
        (&["--wrap", "titan", "--dp", "4", "--zero", "1"], "--wrap"),
        (
            &["--pp", "2", "--virtual-stages", "4"],
            "parallel.virtual_stages",
        ),
        (
            &["--dp", "4", "--fsdp", "full_shard", "--zero", "1"],
            "parallel.fsdp",
        ),
        (
            &[
                "--dp",
                "4",
                "--fsdp",
                "full_shard",
                "--framework",
                "megatron",
            ],
            "parallel.fsdp",
        ),
    ];
    for (args, flag) in refused {
        let mut a = vec!["estimate", "--model", "llama3.1-8b"];
        a.extend_from_slice(args);
        let o = gpumem(&a);
        assert_eq!(o.code, 2, "{args:?}: {}", o.stdout);
        assert!(
            o.stderr.starts_with(&format!("error: {flag}: ")),
            "{args:?}: {}",
            o.stderr
        );
    }
    let taken: &[&[&str]] = &[
        &["--tp", "2", "--sp", "off", "--loss-parallel", "off"],
        &["--mode", "inference", "--new-tokens", "64"],
        &["--dp", "4", "--zero", "3", "--wrap", "titan"],
        &[
            "--pp",
            "2",
            "--schedule",
            "interleaved",
            "--virtual-stages",
            "4",
            "--grad-accum",
            "4",
        ],
        &["--cp", "2", "--cp-load-balance", "off"],
    ];
    for args in taken {
        let mut a = vec!["estimate", "--model", "llama3.1-8b"];
        a.extend_from_slice(args);
        let o = gpumem(&a);
        assert_eq!(o.code, 0, "{args:?}: {}", o.stderr);
    }
    let o = gpumem(&[
        "plan",
        "--model",
        "gpt2",
        "--seq",
        "512",
        "--gpus",
        "8",
        "--no-offload",
        "--host-memory-gb",
        "100",
    ]);
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.starts_with("error: --host-memory-gb: "),
        "{}",
        o.stderr
    );
}

/// A key twice in one object would lose one of its values: refused at FILE:LINE:COLUMN. An
/// empty file name is refused by its flag.
#[test]
fn a_key_given_twice_or_an_empty_file_name_is_refused() {
    let scenario = tmp("twice.json");
    std::fs::write(
        &scenario,
        "{\"model\": \"gpt2\", \"seq\": 512,\n \"batch\": 2, \"batch\": 4}",
    )
    .unwrap();
    let path = scenario.to_str().unwrap();
    let o = gpumem(&["estimate", "--scenario", path]);
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.starts_with(&format!("error: {path}:2:")) && o.stderr.contains("'batch'"),
        "{}",
        o.stderr
    );
    let config = tmp("twice-config.json");
    std::fs::write(
        &config,
        r#"{"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024,
            "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000,
            "text_config": {"a": 1, "a": 2}}"#,
    )
    .unwrap();
    let o = gpumem(&["estimate", "--hf-config", config.to_str().unwrap()]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("'a' is given twice"), "{}", o.stderr);
    for flag in ["--scenario", "--hf-config"] {
        let o = gpumem(&["estimate", "--model", "gpt2", flag, ""]);
        assert_eq!(o.code, 2);
        assert!(
            o.stderr.contains(flag) && o.stderr.contains("empty"),
            "{}",
            o.stderr
        );
    }
}

/// What a scenario file sets that its scenario does not use is refused, as the flags are
/// (a fuzzing run found both taken without a word), naming the file and the field; the
/// same settings where they are used are taken.
#[test]
fn a_scenario_file_setting_what_its_scenario_does_not_use_is_refused() {
    for (name, text, says) in [
        (
            "train-new-tokens.json",
            r#"{"model": "gpt2", "seq": 512, "mode": "train", "new_tokens": 5}"#,
            Some("new_tokens: counts in mode \"inference\" only"),
        ),
        (
            "schedule-no-pp.json",
            r#"{"model": "gpt2", "seq": 512, "parallel": {"schedule": "interleaved", "virtual_stages": 4}}"#,
            Some("parallel.schedule: needs pp above 1"),
        ),
        (
            "inference-new-tokens.json",
            r#"{"model": "gpt2", "mode": "inference", "seq": 512, "new_tokens": 5}"#,
            None,
        ),
        (
            "gpipe.json",
            r#"{"model": "llama3.1-8b", "parallel": {"pp": 2, "schedule": "gpipe", "grad_accum": 4}}"#,
            None,
        ),
    ] {
        let f = tmp(name);
        std::fs::write(&f, text).unwrap();
        let path = f.to_str().unwrap();
        let o = gpumem(&["estimate", "--scenario", path]);
        match says {
            Some(says) => {
                assert_eq!(o.code, 2, "{name}: {}", o.stdout);
                assert!(
                    o.stderr.contains(&format!("{path}: {says}")),
                    "{name}: {}",
                    o.stderr
                );
            }
            None => assert_eq!(o.code, 0, "{name}: {}", o.stderr),
        }
    }
}
