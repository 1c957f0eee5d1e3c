//! `config.json` of a `DFlashLagunaForCausalLM` draft, resolved the way vLLM 0.25.1 resolves it
//! (`laguna_dflash.py`, `v1/spec_decode/dflash.py`, vLLM's own `LagunaConfig`).
//!
//! * Decoder-layer fields (heads, head_dim, gating, sliding_window, rope, norms) are read with the
//!   target's [`LagunaConfig`] parser, so a key means the same thing in both.
//! * Rope: vLLM's `LagunaConfig` is flat: a top-level `rope_theta` (default 500000), NeoX over
//!   `head_dim * partial_rotary_factor` dims (1.0 unless set), no YaRN unless `rope_parameters` asks
//!   for it. SWA layers of a flat config reuse that rope (dflash.md §7).
//! * `dflash_config.causal` (default false, as the V1 proposer reads it) decides causality for every
//!   draft layer; `sliding_window` applies at compute time when `layer_types` are sliding.
use crate::config::{AttnKind, Gating, LagunaConfig, MlpKind, RopeSpec};
use crate::error::{EngineError, Result};
use serde_json::Value;
use std::path::Path;

pub const DRAFT_ARCH: &str = "DFlashLagunaForCausalLM";

#[derive(Debug, Clone)]
pub struct DraftConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    /// Query heads per draft layer (uniform in published drafts; per-layer lists are honoured).
    pub num_heads: Vec<usize>,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub gating: Gating,
    /// Learned attention sinks on the (sliding) draft layers (`swa_attention_sink_enabled`).
    pub sinks: bool,
    /// Compute-time attention window (keys at positions in (p - w, p]); None for full attention.
    pub window: Option<usize>,
    pub causal: bool,
    pub rope: RopeSpec,
    /// `draft_vocab_size`, which must equal the target's vocabulary.
    pub vocab_size: usize,
    /// `dflash_config.block_size`: the trained block length; k must be < block_size.
    pub block_size: usize,
    pub mask_token_id: u32,
    /// 0-based target layers whose output (pre final norm) is tapped, ascending.
    pub target_layer_ids: Vec<usize>,
    /// `dflash_config.num_target_layers` when given.
    pub num_target_layers: Option<usize>,
    pub raw: Value,
}

fn err(key: &str, msg: impl Into<String>) -> EngineError {
    EngineError::key(key, msg)
}

impl DraftConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| EngineError::io(path, e))?;
        let raw: Value = serde_json::from_str(&text).map_err(|e| EngineError::Config {
            path: path.display().to_string(),
            msg: format!("not valid JSON: {e}"),
        })?;
        Self::from_value(raw).map_err(|e| match e {
            EngineError::ConfigKey { key, msg } => EngineError::Config {
                path: path.display().to_string(),
                msg: format!("key `{key}`: {msg}"),
            },
            other => other,
        })
    }

    pub fn from_json_str(text: &str) -> Result<Self> {
        let raw: Value = serde_json::from_str(text).map_err(|e| EngineError::Config {
            path: "config.json".into(),
            msg: format!("not valid JSON: {e}"),
        })?;
        Self::from_value(raw)
    }

    pub fn from_value(raw: Value) -> Result<Self> {
        let map = raw
            .as_object()
            .ok_or_else(|| err("<root>", "config.json must be a JSON object"))?;
        if let Some(a) = map.get("architectures").and_then(Value::as_array) {
            if !a.iter().any(|v| v.as_str() == Some(DRAFT_ARCH)) {
                return Err(err(
                    "architectures",
                    format!(
                        "expected [\"{DRAFT_ARCH}\"] for a DFlash draft, found {}",
                        Value::Array(a.clone())
                    ),
                ));
            }
        }
        check_layer_types(map)?;
        // vLLM's own LagunaConfig defaults rope_theta to 500000 (flat); transformers' default is a
        // nested per-layer-type rope. Pin the vLLM default before handing the map to the parser.
        let mut fixed = map.clone();
        // The draft's own model_type spelling does not matter (vLLM picks the class by architecture).
        fixed.remove("model_type");
        if !fixed.contains_key("rope_parameters")
            && !fixed.contains_key("rope_scaling")
            && !fixed.contains_key("rope_theta")
        {
            fixed.insert("rope_theta".into(), Value::from(500000.0));
        }
        let base = LagunaConfig::from_value(Value::Object(fixed))?;
        if base.layers.iter().any(|l| l.mlp != MlpKind::Dense) {
            return Err(err(
                "mlp_layer_types",
                "every draft layer must use a dense MLP (set mlp_layer_types to \"dense\" or list all layers in mlp_only_layers)",
            ));
        }
        let first = &base.layers[0];
        // vLLM's LagunaConfig has no default window (transformers' 512 does not apply): sliding
        // layers without `sliding_window` attend without a window.
        let window = match (
            first.attn,
            map.get("sliding_window").filter(|v| !v.is_null()),
        ) {
            (AttnKind::Sliding, Some(_)) => base.sliding_window,
            _ => None,
        };
        let dflash = match map.get("dflash_config") {
            Some(Value::Object(m)) => m,
            Some(v) => return Err(err("dflash_config", format!("expected an object, found {v}"))),
            None => return Err(err("dflash_config", "a DFlash draft config requires `dflash_config` (block_size, mask_token_id, target_layer_ids)")),
        };
        let get_usize = |key: &str| -> Result<Option<usize>> {
            match dflash.get(key).filter(|v| !v.is_null()) {
                None => Ok(None),
                Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
                    err(
                        &format!("dflash_config.{key}"),
                        format!("expected a non-negative integer, found {v}"),
                    )
                }),
            }
        };
        let block_size = match get_usize("block_size")? {
            Some(b) => b,
            None => match map.get("block_size").and_then(Value::as_u64) {
                Some(b) => b as usize,
                None => {
                    return Err(err(
                        "dflash_config.block_size",
                        "required (the trained block length, e.g. 16)",
                    ))
                }
            },
        };
        if block_size < 2 {
            return Err(err(
                "dflash_config.block_size",
                format!("must be at least 2, found {block_size}"),
            ));
        }
        let mask_token_id = get_usize("mask_token_id")?
            .ok_or_else(|| err("dflash_config.mask_token_id", "required"))?
            as u32;
        let target_layer_ids = target_layer_ids(dflash)?;
        let causal = match dflash.get("causal").filter(|v| !v.is_null()) {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(err(
                    "dflash_config.causal",
                    format!("expected true or false, found {v}"),
                ))
            }
        };
        let vocab_size = draft_vocab_size(map)?;
        if vocab_size != base.vocab_size {
            return Err(err(
                "draft_vocab_size",
                format!("{vocab_size} differs from vocab_size {}", base.vocab_size),
            ));
        }
        if (mask_token_id as usize) >= vocab_size {
            return Err(err(
                "dflash_config.mask_token_id",
                format!("{mask_token_id} is outside the vocabulary (size {vocab_size})"),
            ));
        }
        let heads: Vec<usize> = base.layers.iter().map(|l| l.num_heads).collect();
        Ok(DraftConfig {
            hidden_size: base.hidden_size,
            intermediate_size: base.intermediate_size,
            num_layers: base.num_layers,
            num_heads: heads,
            num_kv_heads: base.num_kv_heads,
            head_dim: base.head_dim,
            rms_norm_eps: base.rms_norm_eps,
            gating: base.gating,
            sinks: first.sinks,
            window,
            causal,
            rope: first.rope.clone(),
            vocab_size,
            block_size,
            mask_token_id,
            target_layer_ids,
            num_target_layers: get_usize("num_target_layers")?,
            raw,
        })
    }

    /// Pairing checks against the target (vLLM's and the shapes the shared modules force).
    pub fn validate_target(&self, target: &LagunaConfig) -> Result<()> {
        if self.vocab_size != target.vocab_size {
            return Err(err(
                "draft_vocab_size",
                format!("{} does not match the target vocabulary size {} (the draft shares the target lm_head)", self.vocab_size, target.vocab_size),
            ));
        }
        if self.hidden_size != target.hidden_size {
            return Err(err(
                "hidden_size",
                format!("draft hidden_size {} differs from the target's {} (the draft embeds with the target's embed_tokens)", self.hidden_size, target.hidden_size),
            ));
        }
        if let Some(&l) = self
            .target_layer_ids
            .iter()
            .find(|&&l| l >= target.num_layers)
        {
            return Err(err(
                "dflash_config.target_layer_ids",
                format!(
                    "tap layer {l} is beyond the target's {} layers (valid: 0..={})",
                    target.num_layers,
                    target.num_layers - 1
                ),
            ));
        }
        if let Some(n) = self.num_target_layers {
            if n != target.num_layers {
                return Err(err(
                    "dflash_config.num_target_layers",
                    format!(
                        "the draft was built for a {n}-layer target but the target has {} layers",
                        target.num_layers
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks a requested number of speculative tokens: 1 <= k < block_size.
    pub fn check_k(&self, k: usize) -> Result<()> {
        if k == 0 || k >= self.block_size {
            return Err(EngineError::Request(format!(
                "num_speculative_tokens must be between 1 and block_size - 1 = {} for this draft, got {k}",
                self.block_size - 1
            )));
        }
        Ok(())
    }

    pub fn num_taps(&self) -> usize {
        self.target_layer_ids.len()
    }

    /// Width of one gate projection output (0 without gating).
    pub fn gate_width(&self, layer: usize) -> usize {
        match self.gating {
            Gating::None => 0,
            Gating::PerHead => self.num_heads[layer],
            Gating::PerElement => self.num_heads[layer] * self.head_dim,
        }
    }
}

/// `layer_types`: required, and uniform (vLLM requires explicit, uniform layer types).
fn check_layer_types(map: &serde_json::Map<String, Value>) -> Result<()> {
    // vLLM requires explicit, uniform layer types.
    let layer_types: Vec<String> = match map.get("layer_types") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| err("layer_types", format!("expected strings, found {v}")))
            })
            .collect::<Result<_>>()?,
        Some(v) => {
            return Err(err(
                "layer_types",
                format!("expected a list of strings, found {v}"),
            ))
        }
        None => {
            return Err(err(
                "layer_types",
                "a Laguna DFlash draft config requires `layer_types` (vLLM raises without it)",
            ))
        }
    };
    if let Some(first) = layer_types.first() {
        if layer_types.iter().any(|t| t != first) {
            return Err(err(
                "layer_types",
                format!("a Laguna DFlash draft needs uniform layer types, found {layer_types:?}"),
            ));
        }
    }
    Ok(())
}

/// `dflash_config.target_layer_ids`: required, non-empty, no layer twice; sorted ascending.
fn target_layer_ids(dflash: &serde_json::Map<String, Value>) -> Result<Vec<usize>> {
    let mut target_layer_ids: Vec<usize> = match dflash.get("target_layer_ids") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_u64().map(|x| x as usize).ok_or_else(|| {
                    err(
                        "dflash_config.target_layer_ids",
                        format!("expected integers, found {v}"),
                    )
                })
            })
            .collect::<Result<_>>()?,
        Some(v) => {
            return Err(err(
                "dflash_config.target_layer_ids",
                format!("expected a list of integers, found {v}"),
            ))
        }
        None => {
            return Err(err(
                "dflash_config.target_layer_ids",
                "required (0-based target layers to tap)",
            ))
        }
    };
    if target_layer_ids.is_empty() {
        return Err(err(
            "dflash_config.target_layer_ids",
            "must not be empty (vLLM raises)",
        ));
    }
    // vLLM collects aux hidden states as the target's forward reaches each layer, so the
    // concatenation (and aux_hidden_norms.i) follows ascending layer order whatever the list order.
    target_layer_ids.sort_unstable();
    if target_layer_ids.windows(2).any(|w| w[0] == w[1]) {
        return Err(err(
            "dflash_config.target_layer_ids",
            format!("lists a layer twice: {target_layer_ids:?}"),
        ));
    }
    Ok(target_layer_ids)
}

/// `draft_vocab_size`: required (the draft shares the target's lm_head).
fn draft_vocab_size(map: &serde_json::Map<String, Value>) -> Result<usize> {
    Ok(match map.get("draft_vocab_size").filter(|v| !v.is_null()) {
        Some(v) => v.as_u64().ok_or_else(|| {
            err(
                "draft_vocab_size",
                format!("expected a positive integer, found {v}"),
            )
        })? as usize,
        None => {
            return Err(err(
                "draft_vocab_size",
                "required: the draft shares the target lm_head (vLLM raises without it)",
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xs21() -> String {
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/reference/laguna-xs-2.1-dflash.config.json"))
            .unwrap_or_else(|_| {
                // Same content as /work/shared/reference/laguna-xs-2.1-dflash.config.json (trimmed).
                r#"{"architectures":["DFlashLagunaForCausalLM"],"model_type":"laguna","hidden_size":2048,"intermediate_size":8192,
                "num_hidden_layers":5,"num_attention_heads":64,"num_key_value_heads":8,"head_dim":128,"attention_bias":false,
                "gating":"per-head","rms_norm_eps":1e-06,"sliding_window":512,"layer_types":["sliding_attention","sliding_attention",
                "sliding_attention","sliding_attention","sliding_attention"],"mlp_layer_types":["dense","dense","dense","dense","dense"],
                "mlp_only_layers":[0,1,2,3,4],"rope_theta":500000.0,"max_position_embeddings":262144,"vocab_size":100352,
                "draft_vocab_size":100352,"dflash_config":{"block_size":16,"mask_token_id":12,"num_target_layers":40,
                "target_layer_ids":[1,13,25,33,39],"causal":true}}"#
                    .to_string()
            })
    }

    #[test]
    fn xs21_draft_config() {
        let c = DraftConfig::from_json_str(&xs21()).unwrap();
        assert_eq!(c.num_layers, 5);
        assert_eq!(c.num_heads, vec![64; 5]);
        assert_eq!(c.window, Some(512));
        assert!(c.causal);
        assert_eq!(c.rope.theta, 500000.0);
        assert_eq!(c.rope.rotary_dim, 128);
        assert_eq!(c.rope.attention_factor, 1.0);
        assert_eq!(c.gating, Gating::PerHead);
        assert_eq!(c.target_layer_ids, vec![1, 13, 25, 33, 39]);
        assert_eq!(c.mask_token_id, 12);
        assert_eq!(c.block_size, 16);
        assert!(c.check_k(15).is_ok() && c.check_k(16).is_err() && c.check_k(0).is_err());
    }

    #[test]
    fn errors_name_the_field() {
        let base: Value = serde_json::from_str(&xs21()).unwrap();
        let with = |f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
            let mut v = base.clone();
            f(v.as_object_mut().unwrap());
            DraftConfig::from_value(v).unwrap_err().to_string()
        };
        let e = with(&|m| {
            m.remove("draft_vocab_size");
        });
        assert!(e.contains("draft_vocab_size"), "{e}");
        let e = with(&|m| {
            m.insert("draft_vocab_size".into(), Value::from(5));
        });
        assert!(e.contains("draft_vocab_size"), "{e}");
        let e = with(&|m| {
            m.remove("layer_types");
        });
        assert!(e.contains("layer_types"), "{e}");
        let e = with(&|m| {
            m["layer_types"][0] = Value::from("full_attention");
        });
        assert!(e.contains("layer_types") && e.contains("uniform"), "{e}");
        let e = with(&|m| {
            m["dflash_config"]["target_layer_ids"] = serde_json::json!([]);
        });
        assert!(e.contains("target_layer_ids"), "{e}");
        let e = with(&|m| {
            m["dflash_config"]["target_layer_ids"] = serde_json::json!([3, 1, 3]);
        });
        assert!(e.contains("target_layer_ids"), "{e}");
        let mut v = base.clone();
        v["dflash_config"]["target_layer_ids"] = serde_json::json!([39, 1, 25, 13, 33]);
        assert_eq!(
            DraftConfig::from_value(v).unwrap().target_layer_ids,
            vec![1, 13, 25, 33, 39]
        );
        let e = with(&|m| {
            m["dflash_config"]
                .as_object_mut()
                .unwrap()
                .remove("mask_token_id");
        });
        assert!(e.contains("mask_token_id"), "{e}");
        let e = with(&|m| {
            m["dflash_config"]["block_size"] = Value::from(1);
        });
        assert!(e.contains("block_size"), "{e}");
        let e = with(&|m| {
            m.insert(
                "mlp_layer_types".into(),
                serde_json::json!(["dense", "sparse", "dense", "dense", "dense"]),
            );
        });
        assert!(e.contains("mlp_layer_types"), "{e}");

        // Pairing errors.
        let c = DraftConfig::from_value(base.clone()).unwrap();
        let tgt = |layers: usize, vocab: usize, hidden: usize| {
            LagunaConfig::from_json_str(&format!(
                r#"{{"model_type":"laguna","num_hidden_layers":{layers},"vocab_size":{vocab},"hidden_size":{hidden}}}"#
            ))
            .unwrap()
        };
        assert!(c.validate_target(&tgt(40, 100352, 2048)).is_ok());
        let e = c
            .validate_target(&tgt(39, 100352, 2048))
            .unwrap_err()
            .to_string();
        assert!(e.contains("target_layer_ids") && e.contains("39"), "{e}");
        let e = c
            .validate_target(&tgt(40, 1000, 2048))
            .unwrap_err()
            .to_string();
        assert!(e.contains("draft_vocab_size"), "{e}");
        let e = c
            .validate_target(&tgt(40, 100352, 1024))
            .unwrap_err()
            .to_string();
        assert!(e.contains("hidden_size"), "{e}");
    }

    #[test]
    fn window_only_when_configured() {
        let base: Value = serde_json::from_str(&xs21()).unwrap();
        let mut v = base.clone();
        v.as_object_mut().unwrap().remove("sliding_window");
        assert_eq!(DraftConfig::from_value(v).unwrap().window, None);
        let mut v = base;
        v["layer_types"] = serde_json::json!(vec!["full_attention"; 5]);
        assert_eq!(DraftConfig::from_value(v).unwrap().window, None);
    }

    #[test]
    fn rope_defaults_follow_vllm() {
        let base: Value = serde_json::from_str(&xs21()).unwrap();
        let mut v = base.clone();
        v.as_object_mut().unwrap().remove("rope_theta");
        let c = DraftConfig::from_value(v).unwrap();
        assert_eq!((c.rope.theta, c.rope.rotary_dim), (500000.0, 128));
        let mut v = base;
        v.as_object_mut()
            .unwrap()
            .insert("partial_rotary_factor".into(), Value::from(0.5));
        let c = DraftConfig::from_value(v).unwrap();
        assert_eq!(c.rope.rotary_dim, 64);
    }
}
