//! A DFlash draft checkpoint (no `model.` prefix; see research/dflash.md §1.2-1.3): its config
//! against the target's, and the tensors its config implies.
use laguna_engine::config::{LagunaConfig, MlpKind};
use laguna_engine::model::schema::Expected;

/// `dflash_config.target_layer_ids` (empty when absent).
pub fn target_layer_ids(draft: &LagunaConfig) -> Vec<usize> {
    draft
        .raw
        .get("dflash_config")
        .and_then(|d| d.get("target_layer_ids"))
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64().map(|x| x as usize))
                .collect()
        })
        .unwrap_or_default()
}

/// Config consistency between draft and target; each entry names the key.
pub fn check_config(draft: &LagunaConfig, target: Option<&LagunaConfig>) -> Vec<String> {
    let mut p = vec![];
    let raw = &draft.raw;
    let dflash = raw.get("dflash_config");
    if dflash.is_none() {
        p.push("key `dflash_config` is missing: this is not a DFlash draft config".to_string());
    }
    let ids_raw = dflash.and_then(|d| d.get("target_layer_ids"));
    let ids = target_layer_ids(draft);
    match ids_raw.and_then(|v| v.as_array()) {
        None => p.push("key `dflash_config.target_layer_ids` is missing or not a list".into()),
        Some(a) if a.is_empty() => p.push("key `dflash_config.target_layer_ids` is empty".into()),
        Some(a) if a.len() != ids.len() => {
            p.push("key `dflash_config.target_layer_ids` must hold non-negative integers".into())
        }
        _ => {}
    }
    let Some(t) = target else {
        p.push("the target model's config.json is not available, so draft/target compatibility was not checked".into());
        return p;
    };
    for &id in &ids {
        if id >= t.num_layers {
            p.push(format!(
                "key `dflash_config.target_layer_ids` names layer {id}, but the target has num_hidden_layers = {} (ids must be < {})",
                t.num_layers, t.num_layers
            ));
        }
    }
    if let Some(n) = dflash
        .and_then(|d| d.get("num_target_layers"))
        .and_then(|v| v.as_u64())
    {
        if n as usize != t.num_layers {
            p.push(format!(
                "key `dflash_config.num_target_layers` is {n}, but the target has {} layers",
                t.num_layers
            ));
        }
    }
    match raw.get("draft_vocab_size").and_then(|v| v.as_u64()) {
        Some(v) if v as usize != t.vocab_size => p.push(format!(
            "key `draft_vocab_size` is {v}, but the target's vocab_size is {} (they must be equal)",
            t.vocab_size
        )),
        Some(_) => {}
        None => {
            if draft.vocab_size != t.vocab_size {
                p.push(format!(
                    "key `draft_vocab_size` is absent and `vocab_size` is {}, but the target's vocab_size is {}",
                    draft.vocab_size, t.vocab_size
                ));
            }
        }
    }
    if let Some(m) = dflash
        .and_then(|d| d.get("mask_token_id"))
        .and_then(|v| v.as_u64())
    {
        if m as usize >= t.vocab_size {
            p.push(format!(
                "key `dflash_config.mask_token_id` is {m}, outside the target vocabulary ({})",
                t.vocab_size
            ));
        }
    }
    p
}

/// Tensors of a DFlash Laguna draft.
pub fn inventory(draft: &LagunaConfig, target: Option<&LagunaConfig>) -> Vec<Expected> {
    let h = draft.hidden_size;
    let ht = target.map_or(h, |t| t.hidden_size);
    let hd = draft.head_dim;
    let kv = draft.num_kv_heads;
    let taps = target_layer_ids(draft).len().max(1);
    let t = |name: String, shape: Vec<usize>| Expected::Tensor { name, shape };
    let lin = |prefix: String, out: usize, inp: usize| Expected::Linear { prefix, out, inp };
    let mut v = vec![lin("fc".into(), h, taps * ht)];
    for i in 0..taps {
        v.push(t(format!("aux_hidden_norms.{i}.weight"), vec![ht]));
    }
    v.push(t("hidden_norm.weight".into(), vec![h]));
    v.push(t("norm.weight".into(), vec![h]));
    for (l, spec) in draft.layers.iter().enumerate() {
        let p = format!("layers.{l}");
        let heads = spec.num_heads;
        v.push(t(format!("{p}.input_layernorm.weight"), vec![h]));
        v.push(t(format!("{p}.post_attention_layernorm.weight"), vec![h]));
        v.push(lin(
            format!("{p}.self_attn.qkv_proj"),
            (heads + 2 * kv) * hd,
            h,
        ));
        v.push(lin(format!("{p}.self_attn.o_proj"), h, heads * hd));
        if draft.gate_width(l) > 0 {
            v.push(lin(format!("{p}.self_attn.g_proj"), draft.gate_width(l), h));
        }
        v.push(t(format!("{p}.self_attn.q_norm.weight"), vec![hd]));
        v.push(t(format!("{p}.self_attn.k_norm.weight"), vec![hd]));
        if spec.sinks {
            v.push(t(format!("{p}.self_attn.sink"), vec![heads]));
        }
        let inter = match spec.mlp {
            MlpKind::Dense => draft.intermediate_size,
            MlpKind::Sparse => draft.intermediate_size, // drafts are dense; a sparse flag is reported by the shape check
        };
        v.push(lin(format!("{p}.mlp.gate_proj"), inter, h));
        v.push(lin(format!("{p}.mlp.up_proj"), inter, h));
        v.push(lin(format!("{p}.mlp.down_proj"), h, inter));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn cfg(name: &str) -> LagunaConfig {
        let p = format!(
            "{}/../tests/fixtures/reference/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        LagunaConfig::from_file(Path::new(&p)).unwrap()
    }

    #[test]
    fn xs21_draft_has_58_tensors() {
        let d = cfg("laguna-xs-2.1-dflash.config.json");
        let t = cfg("laguna-xs-2.1-nvfp4.config.json");
        assert!(
            check_config(&d, Some(&t)).is_empty(),
            "{:?}",
            check_config(&d, Some(&t))
        );
        let inv = inventory(&d, Some(&t));
        assert_eq!(inv.len(), 58);
        assert!(inv.contains(&Expected::Linear {
            prefix: "fc".into(),
            out: 2048,
            inp: 10240
        }));
        assert!(inv.contains(&Expected::Linear {
            prefix: "layers.4.self_attn.qkv_proj".into(),
            out: 10240,
            inp: 2048
        }));
        assert!(inv.contains(&Expected::Linear {
            prefix: "layers.0.self_attn.g_proj".into(),
            out: 64,
            inp: 2048
        }));
        assert!(inv.contains(&Expected::Tensor {
            name: "aux_hidden_norms.4.weight".into(),
            shape: vec![2048]
        }));
    }

    #[test]
    fn bad_tap_and_vocab_are_named() {
        let t = cfg("laguna-xs-2.1-nvfp4.config.json");
        let mut raw = cfg("laguna-xs-2.1-dflash.config.json").raw;
        raw["dflash_config"]["target_layer_ids"] = serde_json::json!([1, 40]);
        raw["draft_vocab_size"] = serde_json::json!(1000);
        let d = LagunaConfig::from_value(raw).unwrap();
        let p = check_config(&d, Some(&t)).join("\n");
        assert!(
            p.contains("target_layer_ids") && p.contains("layer 40"),
            "{p}"
        );
        assert!(
            p.contains("draft_vocab_size") && p.contains("100352"),
            "{p}"
        );
    }
}
