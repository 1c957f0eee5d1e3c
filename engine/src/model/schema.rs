//! The tensor inventory a Laguna config implies: every name with its shape. Loaders and
//! `laguna verify` both read it, so a checkpoint is judged by one definition.
use crate::config::{LagunaConfig, MlpKind};

#[derive(Debug, Clone, PartialEq)]
pub enum Expected {
    /// A Linear `[out, in]`: `<prefix>.weight` (BF16/F16/F32) or the NVFP4 triplet.
    Linear {
        prefix: String,
        out: usize,
        inp: usize,
    },
    /// A plain float tensor of this shape (norms, embeddings, router bias).
    Tensor { name: String, shape: Vec<usize> },
}

impl Expected {
    pub fn name(&self) -> String {
        match self {
            Expected::Linear { prefix, .. } => prefix.clone(),
            Expected::Tensor { name, .. } => name.clone(),
        }
    }
}

pub fn layer_prefix(i: usize) -> String {
    format!("model.layers.{i}")
}

/// Expected tensors of a target checkpoint.
pub fn inventory(cfg: &LagunaConfig) -> Vec<Expected> {
    let h = cfg.hidden_size;
    let hd = cfg.head_dim;
    let mut v = vec![Expected::Tensor {
        name: "model.embed_tokens.weight".into(),
        shape: vec![cfg.vocab_size, h],
    }];
    for (i, l) in cfg.layers.iter().enumerate() {
        let p = layer_prefix(i);
        let lin = |name: &str, out: usize, inp: usize| Expected::Linear {
            prefix: format!("{p}.{name}"),
            out,
            inp,
        };
        let t = |name: &str, shape: Vec<usize>| Expected::Tensor {
            name: format!("{p}.{name}"),
            shape,
        };
        v.push(t("input_layernorm.weight", vec![h]));
        v.push(t("post_attention_layernorm.weight", vec![h]));
        v.push(lin("self_attn.q_proj", l.num_heads * hd, h));
        v.push(lin("self_attn.k_proj", cfg.num_kv_heads * hd, h));
        v.push(lin("self_attn.v_proj", cfg.num_kv_heads * hd, h));
        v.push(lin("self_attn.o_proj", h, l.num_heads * hd));
        if cfg.gate_width(i) > 0 {
            v.push(lin("self_attn.g_proj", cfg.gate_width(i), h));
        }
        v.push(t("self_attn.q_norm.weight", vec![hd]));
        v.push(t("self_attn.k_norm.weight", vec![hd]));
        if l.sinks {
            v.push(t("self_attn.sink", vec![l.num_heads]));
        }
        match l.mlp {
            MlpKind::Dense => {
                v.push(lin("mlp.gate_proj", cfg.intermediate_size, h));
                v.push(lin("mlp.up_proj", cfg.intermediate_size, h));
                v.push(lin("mlp.down_proj", h, cfg.intermediate_size));
            }
            MlpKind::Sparse => {
                let m = cfg.moe_intermediate_size;
                v.push(lin("mlp.gate", cfg.num_experts, h));
                v.push(t(
                    "mlp.experts.e_score_correction_bias",
                    vec![cfg.num_experts],
                ));
                for e in 0..cfg.num_experts {
                    v.push(lin(&format!("mlp.experts.{e}.gate_proj"), m, h));
                    v.push(lin(&format!("mlp.experts.{e}.up_proj"), m, h));
                    v.push(lin(&format!("mlp.experts.{e}.down_proj"), h, m));
                }
                let s = cfg.shared_expert_intermediate_size;
                if s > 0 {
                    v.push(lin("mlp.shared_expert.gate_proj", s, h));
                    v.push(lin("mlp.shared_expert.up_proj", s, h));
                    v.push(lin("mlp.shared_expert.down_proj", h, s));
                }
            }
        }
    }
    v.push(Expected::Tensor {
        name: "model.norm.weight".into(),
        shape: vec![h],
    });
    if !cfg.tie_word_embeddings {
        v.push(Expected::Linear {
            prefix: "lm_head".into(),
            out: cfg.vocab_size,
            inp: h,
        });
    }
    v
}

/// Suffixes that belong to an expected Linear or tensor but carry no weights we use
/// (activation scales of W4A4, FP8 KV scales, rotary buffers).
pub fn is_auxiliary(name: &str) -> bool {
    name.ends_with(".input_global_scale")
        || name.ends_with(".k_scale")
        || name.ends_with(".v_scale")
        || name.ends_with(".q_scale")
        || name.ends_with("rotary_emb.inv_freq")
}
