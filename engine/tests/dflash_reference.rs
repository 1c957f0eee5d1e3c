//! The CPU DFlash draft against the float64 reference written by
//! tests/fixtures/make_draft_fixtures.py (vLLM laguna_dflash semantics, independent of this code),
//! plus target taps against transformers' float64 layer outputs, plus loading/validation errors.
mod dflash_support;
use dflash_support::*;
use laguna_engine::model::{LogitRows, Model, StepInput};
use laguna_engine::spec::{BlockInput, ContextInput, CpuDraft, DraftConfig, DraftModel};

#[test]
fn target_taps_match_transformers_layer_outputs() {
    for (draft_dir, target_dir) in pairs_with_reference() {
        let (mut t, d) = load_pair(&draft_dir, &target_dir);
        let r = read_reference(&draft_dir);
        let prompt = &r["prompt_ids"].ids;
        t.set_taps(&d.cfg.target_layer_ids);
        let seq = t.new_seq().unwrap();
        let out = t
            .forward(&[StepInput {
                seq,
                tokens: prompt,
                start_pos: 0,
                logits: LogitRows::None,
            }])
            .unwrap();
        let e = rel_err(&out[0].taps, &r["taps"].f64s);
        assert!(e < 1e-4, "{}: taps rel err {e}", draft_dir.display());
        // chunked (incremental) taps equal the one-shot ones
        let seq2 = t.new_seq().unwrap();
        let mut inc = vec![];
        let mut pos = 0;
        for chunk in prompt.chunks(5) {
            let o = t
                .forward(&[StepInput {
                    seq: seq2,
                    tokens: chunk,
                    start_pos: pos,
                    logits: LogitRows::None,
                }])
                .unwrap();
            inc.extend_from_slice(&o[0].taps);
            pos += chunk.len();
        }
        assert!(max_abs_diff(&inc, &out[0].taps) < 1e-5);
    }
}

fn check_draft(
    d: &mut CpuDraft,
    r: &std::collections::HashMap<String, Tensor>,
    taps: &[f32],
    what: &str,
    ctx_tol: f64,
) -> f64 {
    let n = r["ctx_positions"].ids.len();
    let seq = d.new_seq().unwrap();
    d.write_context(&[ContextInput {
        seq,
        start_pos: 0,
        taps,
    }])
    .unwrap();
    assert_eq!(d.context_len(seq), n);
    let kv = d.context_kv(seq).unwrap();
    let row = d.cfg.num_kv_heads * d.cfg.head_dim;
    for l in 0..d.cfg.num_layers {
        let rk = &r["ctx_k"].f64s[l * n * row..(l + 1) * n * row];
        let rv = &r["ctx_v"].f64s[l * n * row..(l + 1) * n * row];
        let ek = rel_err(&kv.k[l], rk);
        let ev = rel_err(&kv.v[l], rv);
        assert!(
            ek < ctx_tol && ev < ctx_tol,
            "{what}: layer {l} context K err {ek}, V err {ev}"
        );
    }
    let mut worst = 0f64;
    for suffix in ["", "_k3"] {
        let ids = &r[&format!("block_ids{suffix}")].ids;
        let pos = &r[&format!("block_positions{suffix}")].ids;
        assert_eq!(pos[0] as usize, n);
        let out = d
            .propose(&[BlockInput {
                seq,
                tokens: ids,
                start_pos: n,
            }])
            .unwrap();
        assert_eq!(out[0].rows, ids.len());
        let expect = &r[&format!("logits{suffix}")].f64s;
        let maxabs = r["max_abs_logit"].f64s[0];
        let diff = out[0]
            .logits
            .iter()
            .zip(expect)
            .fold(0f64, |m, (a, b)| m.max((*a as f64 - b).abs()));
        assert!(
            diff <= 1e-3 * maxabs,
            "{what}{suffix}: max|Δlogit| {diff} > 1e-3 * {maxabs}"
        );
        worst = worst.max(diff / maxabs);
        // the cache is unchanged by propose
        assert_eq!(d.context_len(seq), n);
    }
    d.free_seq(seq);
    worst
}

#[test]
fn draft_forward_matches_float64_reference() {
    for (draft_dir, target_dir) in pairs_with_reference() {
        let (mut t, mut d) = load_pair(&draft_dir, &target_dir);
        let r = read_reference(&draft_dir);
        let name = draft_dir.file_name().unwrap().to_string_lossy().to_string();
        // 1) reference taps in (isolates the draft)
        let taps: Vec<f32> = r["taps"].f64s.iter().map(|&v| v as f32).collect();
        let e1 = check_draft(&mut d, &r, &taps, &format!("{name} (reference taps)"), 1e-4);
        // 2) the Rust target's taps in (the whole pipeline)
        t.set_taps(&d.cfg.target_layer_ids);
        let seq = t.new_seq().unwrap();
        let out = t
            .forward(&[StepInput {
                seq,
                tokens: &r["prompt_ids"].ids,
                start_pos: 0,
                logits: LogitRows::None,
            }])
            .unwrap();
        let e2 = check_draft(
            &mut d,
            &r,
            &out[0].taps,
            &format!("{name} (target taps)"),
            1e-3,
        );
        eprintln!(
            "{name}: max|Δlogit|/max|logit| = {e1:.2e} (reference taps), {e2:.2e} (target taps)"
        );
    }
}

#[test]
fn fixture_configs_resolve_like_vllm() {
    let mut saw_causal_window = false;
    let mut saw_noncausal = false;
    for (draft_dir, target_dir) in pairs_with_reference() {
        let (t, d) = load_pair(&draft_dir, &target_dir);
        let r = read_reference(&draft_dir);
        let c = &d.cfg;
        assert_eq!(c.hidden_size, t.cfg.hidden_size);
        if c.causal && c.window.is_some_and(|w| w < r["prompt_ids"].ids.len()) {
            saw_causal_window = true;
        }
        if !c.causal {
            saw_noncausal = true;
        }
        let raw = &c.raw;
        assert_eq!(c.rope.theta, raw["rope_theta"].as_f64().unwrap());
        let prf = raw
            .get("partial_rotary_factor")
            .and_then(|v| v.as_f64())
            .unwrap_or(1.0);
        assert_eq!(c.rope.rotary_dim, (c.head_dim as f64 * prf) as usize);
    }
    assert!(
        saw_causal_window && saw_noncausal,
        "need a causal+window<prompt draft and a non-causal draft"
    );
}

#[test]
fn pairing_errors_name_the_field() {
    let ps = pairs();
    // A draft paired with the wrong target: vocab, hidden size or layers differ.
    let (d0, _) = &ps[0];
    let c0 = DraftConfig::from_file(&d0.join("config.json")).unwrap();
    for (_, other_target) in &ps[1..] {
        let t = laguna_engine::cpu::CpuModel::load(other_target).unwrap();
        let compatible = c0.vocab_size == t.cfg.vocab_size
            && c0.hidden_size == t.cfg.hidden_size
            && c0.target_layer_ids.iter().all(|&l| l < t.cfg.num_layers)
            && c0.num_target_layers.is_none_or(|n| n == t.cfg.num_layers);
        if compatible {
            continue;
        }
        let e = CpuDraft::load(d0, &t)
            .err()
            .expect("mismatched pair must fail")
            .to_string();
        assert!(
            e.contains("draft_vocab_size")
                || e.contains("hidden_size")
                || e.contains("target_layer_ids")
                || e.contains("num_target_layers"),
            "{e}"
        );
    }
    // Tap beyond the target's layers.
    let (d, t) = &ps[0];
    let target = laguna_engine::cpu::CpuModel::load(t).unwrap();
    let mut raw: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).unwrap()).unwrap();
    raw["dflash_config"]["target_layer_ids"] = serde_json::json!([0, target.cfg.num_layers]);
    raw["dflash_config"]
        .as_object_mut()
        .unwrap()
        .remove("num_target_layers");
    let cfg = DraftConfig::from_value(raw.clone()).unwrap();
    let e = cfg.validate_target(&target.cfg).unwrap_err().to_string();
    assert!(
        e.contains("dflash_config.target_layer_ids") && e.contains("beyond"),
        "{e}"
    );
    // Vocab mismatch.
    raw["dflash_config"]["target_layer_ids"] = serde_json::json!([0]);
    raw["draft_vocab_size"] = serde_json::json!(target.cfg.vocab_size + 1);
    raw["vocab_size"] = serde_json::json!(target.cfg.vocab_size + 1);
    let e = DraftConfig::from_value(raw)
        .unwrap()
        .validate_target(&target.cfg)
        .unwrap_err()
        .to_string();
    assert!(e.contains("draft_vocab_size"), "{e}");
    // Missing tensor names the tensor.
    let dir = tempdir();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(d.join(f), dir.join(f)).unwrap();
    }
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != "layers.0.self_attn.g_proj.weight")
        .collect();
    safetensors::serialize_to_file(kept, None, &dir.join("model.safetensors")).unwrap();
    let e = CpuDraft::load(&dir, &target)
        .err()
        .expect("missing tensor")
        .to_string();
    assert!(e.contains("layers.0.self_attn.g_proj"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempdir() -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("dflash-test-{}-{}", std::process::id(), line!()));
    std::fs::create_dir_all(&p).unwrap();
    p
}
