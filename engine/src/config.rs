//! `config.json` of a `model_type: laguna` checkpoint, resolved into a per-layer plan.
//!
//! Absent keys take transformers 5.23 `LagunaConfig` defaults. Where vLLM 0.25.1 reads a key that
//! transformers dropped (`norm_topk_prob`, `mlp_only_layers`/`decoder_sparse_step`, flat
//! `rope_parameters`, `swa_rope_parameters`, `swa_attention_sink_enabled`) we follow vLLM, because
//! vLLM is what serves the published checkpoints.
use crate::error::{EngineError, Result};
use serde_json::{Map, Value};
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKind {
    Full,
    Sliding,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpKind {
    Dense,
    Sparse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    None,
    PerHead,
    PerElement,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Default,
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        truncate: bool,
    },
}

/// Rotary embedding of one layer type: NeoX rotate-half over the first `rotary_dim` dims of a head.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    pub theta: f64,
    pub rotary_dim: usize,
    pub scaling: RopeScaling,
    /// Multiplies cos and sin (YaRN mscale); 1.0 for default rope.
    pub attention_factor: f64,
}

impl RopeSpec {
    /// Inverse frequencies, `rotary_dim / 2` of them, computed in f32 as transformers and vLLM do.
    pub fn inv_freq(&self) -> Vec<f32> {
        let dim = self.rotary_dim;
        let half = dim / 2;
        let base = self.theta as f32;
        let pos_freq: Vec<f32> = (0..half)
            .map(|i| base.powf((2 * i) as f32 / dim as f32))
            .collect();
        match &self.scaling {
            RopeScaling::Default => pos_freq.iter().map(|p| 1.0 / p).collect(),
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
            } => {
                let corr_dim = |rot: f64| {
                    (dim as f64
                        * (original_max_position_embeddings / (rot * 2.0 * std::f64::consts::PI))
                            .ln())
                        / (2.0 * self.theta.ln())
                };
                let (mut low, mut high) = (corr_dim(*beta_fast), corr_dim(*beta_slow));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0) as f32;
                let mut high = high.min(dim as f64 - 1.0) as f32;
                if low == high {
                    high += 0.001;
                }
                let factor = *factor as f32;
                (0..half)
                    .map(|i| {
                        let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrap_factor = 1.0 - ramp;
                        let ext = 1.0 / pos_freq[i];
                        let inter = 1.0 / (factor * pos_freq[i]);
                        inter * (1.0 - extrap_factor) + ext * extrap_factor
                    })
                    .collect()
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    pub attn: AttnKind,
    pub num_heads: usize,
    pub mlp: MlpKind,
    pub rope: RopeSpec,
    /// Learned attention sinks on this layer (vLLM: sliding layers when `swa_attention_sink_enabled`).
    pub sinks: bool,
}

#[derive(Debug, Clone)]
pub struct LagunaConfig {
    pub architectures: Vec<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub num_experts: usize,
    pub top_k: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f64,
    pub router_softcap: f64,
    pub sliding_window: Option<usize>,
    pub gating: Gating,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    pub layers: Vec<LayerSpec>,
    /// `quantization_config` as written (informational: tensors decide their own format).
    pub quantization: Option<Value>,
    /// The whole JSON, for keys other modules read (e.g. `dflash_config`).
    pub raw: Value,
}

fn err(key: &str, msg: impl Into<String>) -> EngineError {
    EngineError::key(key, msg)
}

struct Obj<'a>(&'a Map<String, Value>);

impl<'a> Obj<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }
    fn usize(&self, key: &str, default: usize) -> Result<usize> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .map(|x| x as usize)
                .ok_or_else(|| err(key, format!("expected a non-negative integer, found {v}"))),
        }
    }
    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| err(key, format!("expected a non-negative integer, found {v}"))),
        }
    }
    fn f64(&self, key: &str, default: f64) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| err(key, format!("expected a number, found {v}"))),
        }
    }
    fn bool(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| err(key, format!("expected true or false, found {v}"))),
        }
    }
    fn str_list(&self, key: &str) -> Result<Option<Vec<String>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| err(key, format!("expected strings, found {v}")))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => Err(err(key, format!("expected a list of strings, found {v}"))),
        }
    }
    fn usize_list(&self, key: &str) -> Result<Option<Vec<usize>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|x| x as usize)
                        .ok_or_else(|| err(key, format!("expected integers, found {v}")))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => Err(err(key, format!("expected a list of integers, found {v}"))),
        }
    }
    fn token_ids(&self, key: &str) -> Result<Vec<u32>> {
        match self.get(key) {
            None => Ok(vec![]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|x| x as u32)
                        .ok_or_else(|| err(key, format!("expected token ids, found {v}")))
                })
                .collect(),
            Some(v) => v
                .as_u64()
                .map(|x| vec![x as u32])
                .ok_or_else(|| err(key, format!("expected a token id or a list, found {v}"))),
        }
    }
}

impl LagunaConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| EngineError::io(path, e))?;
        Self::from_json_str(&text).map_err(|e| match e {
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
        let o = Obj(map);
        if let Some(mt) = o.get("model_type") {
            if mt.as_str() != Some("laguna") {
                return Err(err(
                    "model_type",
                    format!("expected \"laguna\", found {mt}"),
                ));
            }
        }
        let architectures = o.str_list("architectures")?.unwrap_or_default();
        let vocab_size = o.usize("vocab_size", 100352)?;
        let hidden_size = o.usize("hidden_size", 2048)?;
        let intermediate_size = o.usize("intermediate_size", 8192)?;
        let num_layers = o.usize("num_hidden_layers", 40)?;
        let num_heads_default = o.usize("num_attention_heads", 48)?;
        let num_kv_heads = o.usize("num_key_value_heads", 8)?;
        let head_dim = match o.opt_usize("head_dim")? {
            Some(h) => h,
            None => 128,
        };
        if num_layers == 0 {
            return Err(err("num_hidden_layers", "must be at least 1"));
        }
        if num_kv_heads == 0 || head_dim == 0 || hidden_size == 0 || vocab_size == 0 {
            return Err(err(
                "num_key_value_heads",
                "num_key_value_heads, head_dim, hidden_size and vocab_size must be positive",
            ));
        }
        refuse_unsupported(&o)?;

        // Per-layer attention kinds.
        let attn_kinds = attn_kinds(&o, num_layers)?;

        let heads = heads_per_layer(&o, num_layers, num_heads_default, num_kv_heads)?;

        // MLP kinds: mlp_layer_types, else vLLM's mlp_only_layers / decoder_sparse_step rule.
        let num_experts = o.usize("num_experts", 256)?;
        let mlp_kinds = mlp_kinds(&o, num_layers, num_experts)?;
        let top_k = o.usize("num_experts_per_tok", 8)?;
        if mlp_kinds.contains(&MlpKind::Sparse)
            && (num_experts == 0 || top_k == 0 || top_k > num_experts)
        {
            return Err(err(
                "num_experts_per_tok",
                format!("must be between 1 and num_experts ({num_experts})"),
            ));
        }

        let gating = gating(&o)?;

        let sliding_window =
            o.opt_usize("sliding_window")?
                .or(if attn_kinds.contains(&AttnKind::Sliding) {
                    Some(512)
                } else {
                    None
                });
        if attn_kinds.contains(&AttnKind::Sliding) && sliding_window == Some(0) {
            return Err(err(
                "sliding_window",
                "must be at least 1 when sliding_attention layers exist",
            ));
        }
        let sinks = o.bool("swa_attention_sink_enabled", false)?;

        let full_rope = resolve_rope(&o, AttnKind::Full, head_dim)?;
        let sliding_rope = resolve_rope(&o, AttnKind::Sliding, head_dim)?;

        let layers = (0..num_layers)
            .map(|i| LayerSpec {
                attn: attn_kinds[i],
                num_heads: heads[i],
                mlp: mlp_kinds[i],
                rope: if attn_kinds[i] == AttnKind::Full {
                    full_rope.clone()
                } else {
                    sliding_rope.clone()
                },
                sinks: sinks && attn_kinds[i] == AttnKind::Sliding,
            })
            .collect();

        let bos = o.token_ids("bos_token_id")?;
        let pad = o.token_ids("pad_token_id")?;
        let cfg = LagunaConfig {
            architectures,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_kv_heads,
            head_dim,
            max_position_embeddings: o.usize("max_position_embeddings", 131072)?,
            rms_norm_eps: o.f64("rms_norm_eps", 1e-6)?,
            num_experts,
            top_k,
            moe_intermediate_size: o.usize("moe_intermediate_size", 512)?,
            shared_expert_intermediate_size: o.usize("shared_expert_intermediate_size", 512)?,
            norm_topk_prob: o.bool("norm_topk_prob", true)?,
            routed_scaling_factor: o.f64("moe_routed_scaling_factor", 1.0)?,
            router_softcap: o.f64("moe_router_logit_softcapping", 0.0)?,
            sliding_window,
            gating,
            tie_word_embeddings: o.bool("tie_word_embeddings", false)?,
            bos_token_id: bos.first().copied(),
            eos_token_ids: o.token_ids("eos_token_id")?,
            pad_token_id: pad.first().copied(),
            layers,
            quantization: o.get("quantization_config").cloned(),
            raw: raw.clone(),
        };
        Ok(cfg)
    }

    /// Width of the gate projection output of a layer (0 without gating).
    pub fn gate_width(&self, layer: usize) -> usize {
        match self.gating {
            Gating::None => 0,
            Gating::PerHead => self.layers[layer].num_heads,
            Gating::PerElement => self.layers[layer].num_heads * self.head_dim,
        }
    }

    pub fn is_eos(&self, tok: u32) -> bool {
        self.eos_token_ids.contains(&tok)
    }
}

/// Rope parameters for one layer type, as vLLM resolves them: nested `rope_parameters[layer_type]`
/// (falling back to `full_attention`), else the flat dict; `swa_rope_parameters` for sliding layers
/// of a flat config; a top-level `partial_rotary_factor` or `rope_theta` fills what the dict lacks.
/// Refuse the keys whose values Laguna does not implement (biases, activations, routing).
fn refuse_unsupported(o: &Obj) -> Result<()> {
    for key in ["attention_bias", "qkv_bias"] {
        if o.bool(key, false)? {
            return Err(err(
                key,
                "attention biases are not supported by Laguna (expected false)",
            ));
        }
    }
    if let Some(act) = o.get("hidden_act") {
        if act.as_str() != Some("silu") {
            return Err(err(
                "hidden_act",
                format!("only \"silu\" is supported, found {act}"),
            ));
        }
    }
    if o.bool("moe_apply_router_weight_on_input", false)? {
        return Err(err(
            "moe_apply_router_weight_on_input",
            "true is not supported (transformers raises too); expected false",
        ));
    }
    if let Some(f) = o.get("moe_router_score_func") {
        if f.as_str() != Some("sigmoid") {
            return Err(err(
                "moe_router_score_func",
                format!("only \"sigmoid\" is supported, found {f}"),
            ));
        }
    }
    if let Some(false) = o.get("moe_router_use_sigmoid").and_then(Value::as_bool) {
        return Err(err(
            "moe_router_use_sigmoid",
            "only sigmoid routing is supported, found false",
        ));
    }
    Ok(())
}

/// Per-layer attention kinds (`layer_types`; every layer full without it).
fn attn_kinds(o: &Obj, num_layers: usize) -> Result<Vec<AttnKind>> {
    let layer_types = o
        .str_list("layer_types")?
        .unwrap_or_else(|| vec!["full_attention".into(); num_layers]);
    if layer_types.len() != num_layers {
        return Err(err(
            "layer_types",
            format!(
                "has {} entries but num_hidden_layers is {num_layers}",
                layer_types.len()
            ),
        ));
    }
    layer_types
        .iter()
        .map(|t| match t.as_str() {
            "full_attention" => Ok(AttnKind::Full),
            "sliding_attention" => Ok(AttnKind::Sliding),
            other => Err(err(
                "layer_types",
                format!(
                    "unknown layer type \"{other}\" (expected full_attention or sliding_attention)"
                ),
            )),
        })
        .collect::<Result<Vec<_>>>()
}

/// Query heads per layer (`num_attention_heads_per_layer`, else `num_attention_heads`), each a
/// positive multiple of the K/V heads.
fn heads_per_layer(
    o: &Obj,
    num_layers: usize,
    num_heads_default: usize,
    num_kv_heads: usize,
) -> Result<Vec<usize>> {
    let heads = o
        .usize_list("num_attention_heads_per_layer")?
        .unwrap_or_else(|| vec![num_heads_default; num_layers]);
    if heads.len() != num_layers {
        return Err(err(
            "num_attention_heads_per_layer",
            format!(
                "has {} entries but num_hidden_layers is {num_layers}",
                heads.len()
            ),
        ));
    }
    for (i, &h) in heads.iter().enumerate() {
        if h == 0 || h % num_kv_heads != 0 {
            return Err(err(
                "num_attention_heads_per_layer",
                format!("layer {i} has {h} heads, which is not a positive multiple of num_key_value_heads ({num_kv_heads})"),
            ));
        }
    }
    Ok(heads)
}

/// MLP kinds: mlp_layer_types, else vLLM's mlp_only_layers / decoder_sparse_step rule, else
/// layer 0 dense and the rest sparse.
fn mlp_kinds(o: &Obj, num_layers: usize, num_experts: usize) -> Result<Vec<MlpKind>> {
    let kinds: Vec<MlpKind> = match o.str_list("mlp_layer_types")? {
        Some(list) => {
            if list.len() != num_layers {
                return Err(err(
                    "mlp_layer_types",
                    format!(
                        "has {} entries but num_hidden_layers is {num_layers}",
                        list.len()
                    ),
                ));
            }
            list.iter()
                .map(|t| match t.as_str() {
                    "dense" => Ok(MlpKind::Dense),
                    "sparse" => Ok(MlpKind::Sparse),
                    other => Err(err(
                        "mlp_layer_types",
                        format!("unknown mlp type \"{other}\" (expected dense or sparse)"),
                    )),
                })
                .collect::<Result<_>>()?
        }
        None if o.get("mlp_only_layers").is_some() || o.get("decoder_sparse_step").is_some() => {
            let only = o.usize_list("mlp_only_layers")?.unwrap_or_default();
            let step = o.usize("decoder_sparse_step", 1)?;
            if step == 0 {
                return Err(err("decoder_sparse_step", "must be at least 1"));
            }
            (0..num_layers)
                .map(|i| {
                    if !only.contains(&i) && num_experts > 0 && (i + 1) % step == 0 {
                        MlpKind::Sparse
                    } else {
                        MlpKind::Dense
                    }
                })
                .collect()
        }
        None => (0..num_layers)
            .map(|i| {
                if i == 0 {
                    MlpKind::Dense
                } else {
                    MlpKind::Sparse
                }
            })
            .collect(),
    };
    Ok(kinds)
}

/// The attention output gate (`gating`).
fn gating(o: &Obj) -> Result<Gating> {
    Ok(match o.get("gating") {
        None => Gating::PerHead,
        Some(Value::Bool(true)) => Gating::PerHead,
        Some(Value::Bool(false)) => Gating::None,
        // transformers and vLLM: per-head only for `true` or exactly "per-head"; vLLM: `false` means no gate.
        Some(Value::String(s)) if s == "per-head" => Gating::PerHead,
        Some(Value::String(s)) if s == "per-element" => Gating::PerElement,
        Some(v) => {
            return Err(err(
                "gating",
                format!("expected true, false, \"per-head\" or \"per-element\", found {v}"),
            ))
        }
    })
}

fn resolve_rope(o: &Obj, kind: AttnKind, head_dim: usize) -> Result<RopeSpec> {
    let type_key = match kind {
        AttnKind::Full => "full_attention",
        AttnKind::Sliding => "sliding_attention",
    };
    let key = format!("rope_parameters.{type_key}");
    let top = o.get("rope_parameters").or_else(|| o.get("rope_scaling"));
    let default_params = |k: AttnKind| -> Map<String, Value> {
        let (theta, prf) = match k {
            AttnKind::Full => (500000.0, 0.5),
            AttnKind::Sliding => (10000.0, 1.0),
        };
        let mut m = Map::new();
        m.insert("rope_type".into(), Value::from("default"));
        m.insert("rope_theta".into(), Value::from(theta));
        m.insert("partial_rotary_factor".into(), Value::from(prf));
        m
    };
    let mut params: Map<String, Value> = match top {
        None => {
            // transformers' default nested rope, unless a flat top-level rope_theta is given (vLLM).
            if o.get("rope_theta").is_some() {
                Map::new()
            } else {
                default_params(kind)
            }
        }
        Some(Value::Object(m)) => {
            let nested = m.values().any(|v| v.is_object());
            if nested {
                match m.get(type_key).or_else(|| m.get("full_attention")) {
                    Some(Value::Object(p)) => p.clone(),
                    Some(v) => return Err(err(&key, format!("expected an object, found {v}"))),
                    None => default_params(kind),
                }
            } else {
                let swa = o.get("swa_rope_parameters");
                match (kind, swa) {
                    (AttnKind::Sliding, Some(Value::Object(s))) => s.clone(),
                    _ => m.clone(),
                }
            }
        }
        Some(v) => {
            return Err(err(
                "rope_parameters",
                format!("expected an object, found {v}"),
            ))
        }
    };
    if !params.contains_key("rope_theta") {
        if let Some(t) = o.get("rope_theta") {
            params.insert("rope_theta".into(), t.clone());
        }
    }
    if !params.contains_key("partial_rotary_factor") {
        if let Some(p) = o.get("partial_rotary_factor") {
            params.insert("partial_rotary_factor".into(), p.clone());
        }
    }
    let p = Obj(&params);
    let theta = p
        .f64("rope_theta", 10000.0)
        .map_err(|_| err(&key, "rope_theta must be a number"))?;
    let prf = p
        .f64("partial_rotary_factor", 1.0)
        .map_err(|_| err(&key, "partial_rotary_factor must be a number"))?;
    if !(prf > 0.0 && prf <= 1.0) {
        return Err(err(
            &format!("{key}.partial_rotary_factor"),
            format!("must be in (0, 1], found {prf}"),
        ));
    }
    let rotary_dim = (head_dim as f64 * prf) as usize;
    if rotary_dim == 0 || rotary_dim % 2 != 0 {
        return Err(err(
            &format!("{key}.partial_rotary_factor"),
            format!("gives a rotary dim of {rotary_dim}, which must be even and positive"),
        ));
    }
    let rope_type = params
        .get("rope_type")
        .or_else(|| params.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_string();
    let (scaling, attention_factor) = match rope_type.as_str() {
        "default" => (RopeScaling::Default, 1.0),
        "yarn" => {
            let orig = p
                .get("original_max_position_embeddings")
                .or_else(|| o.get("original_max_position_embeddings"))
                .and_then(Value::as_f64)
                .ok_or_else(|| {
                    err(
                        &format!("{key}.original_max_position_embeddings"),
                        "required for yarn rope",
                    )
                })?;
            let factor = match p.get("factor").and_then(Value::as_f64) {
                Some(f) => f,
                None => o.usize("max_position_embeddings", 131072)? as f64 / orig,
            };
            let mscale = |scale: f64, m: f64| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * m * scale.ln() + 1.0
                }
            };
            let af = match p.get("attention_factor").and_then(Value::as_f64) {
                Some(a) => a,
                None => {
                    let ms = p.get("mscale").and_then(Value::as_f64).unwrap_or(0.0);
                    let msa = p
                        .get("mscale_all_dim")
                        .and_then(Value::as_f64)
                        .unwrap_or(0.0);
                    if ms != 0.0 && msa != 0.0 {
                        mscale(factor, ms) / mscale(factor, msa)
                    } else {
                        mscale(factor, 1.0)
                    }
                }
            };
            let beta_fast = p
                .get("beta_fast")
                .and_then(Value::as_f64)
                .filter(|b| *b != 0.0)
                .unwrap_or(32.0);
            let beta_slow = p
                .get("beta_slow")
                .and_then(Value::as_f64)
                .filter(|b| *b != 0.0)
                .unwrap_or(1.0);
            let truncate = p.get("truncate").and_then(Value::as_bool).unwrap_or(true);
            (
                RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: orig,
                    beta_fast,
                    beta_slow,
                    truncate,
                },
                af,
            )
        }
        other => {
            return Err(err(
                &format!("{key}.rope_type"),
                format!("unsupported rope type \"{other}\" (supported: default, yarn)"),
            ));
        }
    };
    Ok(RopeSpec {
        theta,
        rotary_dim,
        scaling,
        attention_factor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xs21() -> LagunaConfig {
        let p = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/reference/laguna-xs-2.1-nvfp4.config.json"
        );
        LagunaConfig::from_file(Path::new(p)).unwrap()
    }

    #[test]
    fn xs21_layer_plan() {
        let c = xs21();
        assert_eq!(c.num_layers, 40);
        assert_eq!(
            c.layers.iter().filter(|l| l.attn == AttnKind::Full).count(),
            10
        );
        for (i, l) in c.layers.iter().enumerate() {
            assert_eq!(l.attn == AttnKind::Full, i % 4 == 0);
            assert_eq!(l.num_heads, if i % 4 == 0 { 48 } else { 64 });
            assert_eq!(l.mlp == MlpKind::Dense, i == 0);
        }
        assert_eq!(c.gating, Gating::PerHead);
        assert_eq!(c.routed_scaling_factor, 2.5);
        assert_eq!(c.eos_token_ids, vec![2, 24]);
        assert_eq!(c.sliding_window, Some(512));
    }

    #[test]
    fn xs21_yarn_inv_freq_matches_spec() {
        // Values from laguna-model.md §3.1 (computed independently there).
        let c = xs21();
        let r = &c.layers[0].rope;
        assert_eq!(r.rotary_dim, 64);
        assert!((r.attention_factor - 1.3465735902799727).abs() < 1e-15);
        let f = r.inv_freq();
        let expect = [
            (0, 1.0),
            (1, 0.6636012),
            (2, 0.4403666),
            (3, 0.2922278),
            (29, 2.138742e-7),
            (30, 1.419272e-7),
            (31, 9.418307e-8),
        ];
        for (i, v) in expect {
            assert!(
                ((f[i] as f64) - v).abs() / v < 1e-5,
                "inv_freq[{i}] = {} expected {v}",
                f[i]
            );
        }
        let s = &c.layers[1].rope;
        assert_eq!(s.rotary_dim, 128);
        assert_eq!(s.scaling, RopeScaling::Default);
        assert!((s.inv_freq()[1] as f64 - 10000f64.powf(-2.0 / 128.0)).abs() < 1e-7);
    }

    #[test]
    fn errors_name_the_key() {
        let bad =
            r#"{"model_type":"laguna","num_hidden_layers":2,"layer_types":["full_attention"]}"#;
        let e = LagunaConfig::from_json_str(bad).unwrap_err().to_string();
        assert!(e.contains("layer_types"), "{e}");
        let bad = r#"{"model_type":"laguna","num_hidden_layers":1,"rope_parameters":{"full_attention":{"rope_type":"llama3","rope_theta":1.0}}}"#;
        let e = LagunaConfig::from_json_str(bad).unwrap_err().to_string();
        assert!(e.contains("rope_type") && e.contains("llama3"), "{e}");
        let bad =
            r#"{"model_type":"laguna","num_hidden_layers":1,"moe_router_score_func":"softmax"}"#;
        let e = LagunaConfig::from_json_str(bad).unwrap_err().to_string();
        assert!(e.contains("moe_router_score_func"), "{e}");
        let bad = r#"{"model_type":"laguna","num_hidden_layers":2,"mlp_layer_types":["dense"]}"#;
        assert!(LagunaConfig::from_json_str(bad)
            .unwrap_err()
            .to_string()
            .contains("mlp_layer_types"));
        let bad = r#"{"model_type":"laguna","num_hidden_layers":1,"num_attention_heads_per_layer":[3],"num_key_value_heads":2}"#;
        assert!(LagunaConfig::from_json_str(bad)
            .unwrap_err()
            .to_string()
            .contains("num_attention_heads_per_layer"));
    }

    #[test]
    fn defaults_follow_transformers() {
        let c = LagunaConfig::from_json_str(r#"{"model_type":"laguna","num_hidden_layers":3}"#)
            .unwrap();
        assert!(c.layers.iter().all(|l| l.attn == AttnKind::Full));
        assert_eq!(c.layers[0].mlp, MlpKind::Dense);
        assert_eq!(c.layers[1].mlp, MlpKind::Sparse);
        assert_eq!(c.layers[0].rope.rotary_dim, 64);
        assert_eq!(c.layers[0].rope.theta, 500000.0);
        assert_eq!(c.routed_scaling_factor, 1.0);
        assert_eq!(c.gating, Gating::PerHead);
        assert_eq!(c.max_position_embeddings, 131072);
    }

    #[test]
    fn mlp_only_layers_fallback() {
        let c = LagunaConfig::from_json_str(r#"{"model_type":"laguna","num_hidden_layers":4,"mlp_only_layers":[2],"decoder_sparse_step":1}"#).unwrap();
        let kinds: Vec<_> = c.layers.iter().map(|l| l.mlp).collect();
        assert_eq!(
            kinds,
            vec![
                MlpKind::Sparse,
                MlpKind::Sparse,
                MlpKind::Dense,
                MlpKind::Sparse
            ]
        );
    }
}
