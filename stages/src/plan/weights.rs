//! Weight bytes: read from the safetensors headers when the checkpoint is on disk, else computed
//! from the config (NVFP4 for routed and shared experts when `quantization_config` says
//! nvfp4-pack-quantized, as in poolside's NVFP4 build; BF16 for everything else).
use crate::verify::draft;
use crate::verify::header;
use laguna_engine::config::LagunaConfig;
use laguna_engine::model::schema::{inventory, Expected};
use laguna_engine::weights::store::checkpoint_files;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightsSource {
    Headers,
    Config,
}

/// Tensor data bytes of the checkpoint in `dir`: the shards the index lists, else the
/// `model*.safetensors` files (else every `*.safetensors`), so side files such as a test's
/// `reference.safetensors` are not counted as weights.
pub fn from_headers(dir: &Path) -> Result<u64, String> {
    let (mut files, index) = checkpoint_files(dir).map_err(|e| e.to_string())?;
    if index.is_none() {
        let is_model = |p: &std::path::PathBuf| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("model"))
        };
        if files.iter().any(is_model) {
            files.retain(is_model);
        }
    }
    let mut total = 0;
    for f in files {
        let h = header::read(&f).map_err(|p| format!("{}: {}", f.display(), p.join("; ")))?;
        total += h.data_bytes;
    }
    Ok(total)
}

/// Whether the config declares compressed-tensors NVFP4 weights.
pub fn is_nvfp4(cfg: &LagunaConfig) -> bool {
    cfg.quantization
        .as_ref()
        .is_some_and(|q| q.get("format").and_then(|f| f.as_str()) == Some("nvfp4-pack-quantized"))
}

/// Bytes of one NVFP4 Linear: packed codes, E4M3 block scales, weight and input global scales (F32).
pub fn nvfp4_linear_bytes(out: usize, inp: usize) -> u64 {
    (out * inp / 2 + out * inp / 16 + 4 + 4) as u64
}

fn expert_linear(prefix: &str) -> bool {
    prefix.contains(".mlp.experts.") || prefix.contains(".mlp.shared_expert.")
}

/// Target weights from the config alone.
pub fn target_from_config(cfg: &LagunaConfig) -> u64 {
    let nvfp4 = is_nvfp4(cfg);
    inventory(cfg)
        .iter()
        .map(|e| match e {
            Expected::Linear { prefix, out, inp } if nvfp4 && expert_linear(prefix) => {
                nvfp4_linear_bytes(*out, *inp)
            }
            Expected::Linear { out, inp, .. } => (out * inp * 2) as u64,
            Expected::Tensor { shape, .. } => shape.iter().product::<usize>() as u64 * 2,
        })
        .sum()
}

/// The largest tensor the config implies (bytes), by the same rules as `target_from_config`.
pub fn largest_tensor_from_config(cfg: &LagunaConfig) -> u64 {
    let nvfp4 = is_nvfp4(cfg);
    inventory(cfg)
        .iter()
        .map(|e| match e {
            Expected::Linear { prefix, out, inp } if nvfp4 && expert_linear(prefix) => {
                (out * inp / 2) as u64
            }
            Expected::Linear { out, inp, .. } => (out * inp * 2) as u64,
            Expected::Tensor { shape, .. } => shape.iter().product::<usize>() as u64 * 2,
        })
        .max()
        .unwrap_or(0)
}

/// Draft (BF16) weights from its config.
pub fn draft_from_config(draft_cfg: &LagunaConfig, target: &LagunaConfig) -> u64 {
    draft::inventory(draft_cfg, Some(target))
        .iter()
        .map(|e| match e {
            Expected::Linear { out, inp, .. } => (out * inp * 2) as u64,
            Expected::Tensor { shape, .. } => shape.iter().product::<usize>() as u64 * 2,
        })
        .sum()
}

/// Device bytes of the tile-interleaved copies the CUDA backend keeps of the BF16 Linears its
/// tensor-core GEMV reads (`linear_tc_bf16_tiled*`, engine/src/cuda/load.rs): per layer q|k|v|g as one
/// matrix and o_proj, the dense MLPs' gate, up and down, and lm_head, rows rounded up to 16; the
/// draft's attention and MLP Linears likewise.
pub fn gemv_copy_bytes(cfg: &LagunaConfig, draft: Option<&LagunaConfig>) -> u64 {
    use laguna_engine::config::MlpKind;
    let r16 = |n: usize| n.div_ceil(16) * 16;
    let layers = |c: &LagunaConfig| -> u64 {
        let (h, hd, kvw) = (c.hidden_size, c.head_dim, c.num_kv_heads * c.head_dim);
        c.layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let qw = l.num_heads * hd;
                let mut b = r16(qw + 2 * kvw + c.gate_width(i)) * h + r16(h) * qw;
                if l.mlp == MlpKind::Dense {
                    let im = c.intermediate_size;
                    b += 2 * r16(im) * h + r16(h) * im;
                }
                2 * b as u64
            })
            .sum()
    };
    let lm_head = 2 * (r16(cfg.vocab_size) * cfg.hidden_size) as u64;
    layers(cfg) + lm_head + draft.map_or(0, layers)
}
