//! `laguna generate --json` end to end: the binary reproduces the float64 references that
//! tests/fixtures/make_fixtures.py computed with transformers.
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models");
    let mut v: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("reference.safetensors").exists())
        .collect();
    v.sort();
    v
}

fn reference_ids(dir: &Path, name: &str) -> Vec<u32> {
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect()
}

fn laguna(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_laguna"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn generate_json_reproduces_reference_greedy() {
    let fx = fixtures();
    assert!(!fx.is_empty());
    for dir in fx {
        let prompt = reference_ids(&dir, "prompt_ids");
        let greedy = reference_ids(&dir, "greedy_ids");
        let ids: Vec<String> = prompt.iter().map(|t| t.to_string()).collect();
        let n = greedy.len().to_string();
        let out = laguna(&[
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            &ids.join(","),
            "--max-tokens",
            &n,
            "--ignore-eos",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(stdout.trim().lines().last().unwrap()).unwrap();
        let got: Vec<u32> = v["completion_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(got, greedy, "{}", dir.display());
        assert_eq!(v["prompt_ids"].as_array().unwrap().len(), prompt.len());
        assert_eq!(v["finish_reason"], "length");
        assert!(v["text"].is_string());
    }
}

#[test]
fn generate_stops_at_eos_without_ignore_eos() {
    // scripted-tool's greedy chain ends in </assistant> (24), an eos id of its config.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/scripted-tool");
    if !dir.exists() {
        return;
    }
    let out = laguna(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "hi",
        "--max-tokens",
        "64",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(stdout.trim().lines().last().unwrap()).unwrap();
    let ids = v["completion_ids"].as_array().unwrap();
    if v["finish_reason"] == "stop" {
        let last = ids.last().unwrap().as_u64().unwrap();
        assert!(last == 2 || last == 24, "stopped on {last}");
    } else {
        assert_eq!(ids.len(), 64);
    }
}

#[test]
fn bad_input_gets_a_clear_error() {
    let out = laguna(&[
        "generate",
        "--model",
        "/nonexistent/model",
        "--prompt-ids",
        "1,2",
        "--max-tokens",
        "2",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/model"), "{err}");

    let dir = fixtures().remove(0);
    let out = laguna(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "999999",
        "--max-tokens",
        "2",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("vocabulary"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--num-speculative-tokens auto`: adaptive k over step times measured before generating, and
/// the greedy output is still the target's float64 reference; junk k is refused by name.
#[test]
fn generate_with_auto_k_reproduces_reference_greedy() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let (dir, draft) = (
        root.join("models/swa-yarn-perhead"),
        root.join("drafts/swa-yarn-perhead-causal-w8"),
    );
    if !dir.join("reference.safetensors").exists() || !draft.join("config.json").exists() {
        return;
    }
    let prompt = reference_ids(&dir, "prompt_ids");
    let greedy = reference_ids(&dir, "greedy_ids");
    let ids: Vec<String> = prompt.iter().map(|t| t.to_string()).collect();
    let n = greedy.len().to_string();
    let args = |k: &'static str| {
        vec![
            "generate".to_string(),
            "--model".into(),
            dir.to_str().unwrap().into(),
            "--draft".into(),
            draft.to_str().unwrap().into(),
            "--num-speculative-tokens".into(),
            k.into(),
            "--prompt-ids".into(),
            ids.join(","),
            "--max-tokens".into(),
            n.clone(),
            "--ignore-eos".into(),
            "--json".into(),
        ]
    };
    let a = args("auto");
    let out = laguna(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // The pair's 128 positions fit measuring k <= 14 (StepCosts::fit): k = 15's 8 steps of 16
    // tokens need 130 beside a one-token prompt.
    assert!(err.contains("fits measuring k <= 14"), "{err}");
    assert!(
        err.contains("adaptive k: step ms at k = 0..=14 (of 15)"),
        "{err}"
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(stdout.trim().lines().last().unwrap()).unwrap();
    let got: Vec<u32> = v["completion_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(got, greedy);
    assert_eq!(v["spec"]["adaptive_k"], true, "{v}");
    assert_eq!(v["spec"]["num_speculative_tokens"], 15, "{v}");
    for bad in ["fast", "0"] {
        let a = args(bad);
        let out = laguna(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--num-speculative-tokens") && err.contains(bad),
            "{err}"
        );
    }
}
