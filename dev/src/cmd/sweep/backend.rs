//! The one place the sweep tells devices apart: loading a target (and draft) on the device under
//! test (through `engine::backend`), which rows that device promises bit for bit, and its
//! speculative-decoding identity check. Everything else in the sweep works on `dyn Model` /
//! `dyn DraftModel`.
use super::config_gen::Rand;
use anyhow::{Context, Result};
use laguna_engine::backend::{self, LoadOptions};
use laguna_engine::config::{AttnKind, LagunaConfig};
use laguna_engine::generate::{generate, GenerateRequest};
use laguna_engine::model::Model;
use laguna_engine::sample::SamplingParams;
use laguna_engine::sched::Loaded;
use laguna_engine::spec::{generate_spec, DraftModel};
use std::path::Path;

/// The device under test; the CPU engine is always the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cuda,
    /// The CPU engine standing in for the device (proves the harness itself).
    Cpu,
}

impl Device {
    pub fn parse(s: &str) -> Result<Device> {
        match s {
            "cuda" => Ok(Device::Cuda),
            "cpu" => Ok(Device::Cpu),
            o => anyhow::bail!("--device must be cuda or cpu, got {o}"),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Device::Cuda => "cuda",
            Device::Cpu => "cpu",
        }
    }
    /// The engine's device.
    fn engine(self) -> backend::Device {
        match self {
            Device::Cuda => backend::Device::Cuda(0),
            Device::Cpu => backend::Device::Cpu,
        }
    }
}

/// Whether the CUDA backend takes a case's shapes, decided from its configs alone (the loaders'
/// own shape checks, run before any upload), so CI can prove the generator only produces shapes
/// the device runs.
#[cfg(test)]
pub fn cuda_takes_shapes(
    target: &LagunaConfig,
    draft: Option<&laguna_engine::spec::DraftConfig>,
) -> Result<()> {
    laguna_engine::cuda::check_shapes(target)?;
    if let Some(d) = draft {
        laguna_engine::cuda::check_head_dim(d.head_dim, "draft ")?;
    }
    Ok(())
}

/// Backend options varied per case (how the device runs its passes; the CPU engine's K/V
/// budget bounds only its prefix cache).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceOpts {
    pub page_size: usize,
    /// Rows per device pass: small values force chunked prefill inside one forward.
    pub max_rows: usize,
    pub spec_k: usize,
    pub max_seqs: usize,
    /// None: the backend's default pool sizing (must always load).
    pub kv_pool_bytes: Option<usize>,
}

impl DeviceOpts {
    /// Random options for a case; `block` is the draft's block size when it has one (the rings
    /// then need spec_k >= block - 1, the largest k checked).
    pub fn random(r: &mut Rand, block: Option<usize>) -> DeviceOpts {
        DeviceOpts {
            page_size: r.pick(&[16, 64]),
            max_rows: if r.chance(0.5) {
                r.range(16, 64)
            } else {
                r.pick(&[256, 2048])
            },
            spec_k: match block {
                Some(b) => r.range(b - 1, 15.max(b - 1)),
                None => {
                    let k = r.range(1, 15);
                    r.pick(&[0, 0, k])
                }
            },
            max_seqs: r.range(2, 8),
            kv_pool_bytes: if r.chance(0.5) {
                None
            } else {
                Some(r.pick(&[64usize, 256, 1024]) << 20)
            },
        }
    }

    /// Raises an explicit K/V pool to what the case's sequences need (twice over): `max_seqs`
    /// sequences of `max_len` positions on the full-attention layers plus a ring of window +
    /// spec_k slots per sequence and sliding layer, BF16 K and V. A pool too small for the
    /// prompts is a wrong setting, not a finding; the default sizing is left as it is.
    pub fn fit_pool(&mut self, t: &LagunaConfig, max_len: usize) {
        let Some(b) = self.kv_pool_bytes else {
            return;
        };
        let row = 2 * t.num_kv_heads * t.head_dim * 2;
        let full = t.layers.iter().filter(|l| l.attn == AttnKind::Full).count();
        let sliding = t.num_layers - full;
        let pages = max_len.div_ceil(self.page_size) + 1;
        let ring = t.sliding_window.unwrap_or(0) + self.spec_k + 1;
        let need = self.max_seqs * (full * pages * self.page_size + sliding * ring) * row;
        self.kv_pool_bytes = Some(b.max(2 * need + (1 << 20)));
    }

    pub fn summary(&self) -> String {
        format!(
            "page {} rows {} spec_k {} seqs {} pool {}",
            self.page_size,
            self.max_rows,
            self.spec_k,
            self.max_seqs,
            self.kv_pool_bytes
                .map_or("default".to_string(), |b| format!("{}MiB", b >> 20))
        )
    }

    fn load_options(&self) -> LoadOptions {
        LoadOptions {
            page_size: Some(self.page_size),
            pass_rows: Some(self.max_rows),
            spare_rows: Some(self.spec_k),
            max_seqs: self.max_seqs,
            kv_cache_bytes: self.kv_pool_bytes,
            ..Default::default()
        }
    }
}

/// The CPU reference engine.
pub fn load_reference(dir: &Path) -> Result<Box<dyn Model>> {
    let l = backend::load(backend::Device::Cpu, &LoadOptions::default(), dir, None)
        .context("CPU reference load")?;
    Ok(l.into_scheduler().model)
}

/// Target (and draft with its k) on the device; with an explicit K/V pool the draft's rings come
/// out of it, as in `serve`.
pub fn load(
    dev: Device,
    dir: &Path,
    draft: Option<(&Path, usize)>,
    o: &DeviceOpts,
) -> Result<Loaded> {
    let opts = LoadOptions {
        num_speculative_tokens: draft.map(|d| d.1),
        ..o.load_options()
    };
    let l = backend::load(dev.engine(), &opts, dir, draft.map(|d| d.0))
        .with_context(|| format!("{} load", dev.name()))?;
    Ok(l.into_scheduler())
}

/// Whether the device promises bit-identical rows for one sequence's rows computed in several
/// forwards, each given as (the rows of its sequences in batch order, which one is ours). The CPU
/// engine always does. The CUDA backend does when every pass touching our rows, in every forward,
/// has the same kernel choice: what `cuda/layers.rs` decides by, per pass of at most `max_rows`
/// rows: at least `gemm_min_rows` rows (tensor-core GEMMs, flash attention), more than 64 rows
/// (split-KV attention with one split), and, with sliding-window rings, a sequence with more
/// rows than the ring's `spec_k` spare slots + 1 (the staged ring path). Where the load allows
/// cuBLAS (`LoadOptions::vendor_blas`), a GEMM pass's dense BF16 Linears run it, and cuBLAS picks
/// its algorithm by shape: GEMM passes then match only at the same row count. Keep this in step
/// with the backend's kernel choice.
pub fn bitwise_expected(
    dev: Device,
    o: &DeviceOpts,
    rings: bool,
    forwards: &[(&[usize], usize)],
) -> bool {
    if dev == Device::Cpu {
        return true;
    }
    let g = backend::GEMM_MIN_ROWS;
    let blas = o.load_options().vendor_blas;
    let r = o.max_rows.max(1);
    let mut classes = vec![];
    for &(seqs, ours) in forwards {
        // Row ranges of the sequences in the forward's row order.
        let mut spans = vec![];
        let mut at = 0;
        for &n in seqs {
            spans.push((at, at + n));
            at += n;
        }
        let total = at;
        let (o0, o1) = spans[ours];
        let mut start = 0;
        while start < total {
            let end = (start + r).min(total);
            if start < o1 && end > o0 {
                let m = end - start;
                let longest = spans
                    .iter()
                    .map(|&(a, b)| b.min(end).saturating_sub(a.max(start)))
                    .max()
                    .unwrap_or(0);
                let blas_rows = if m >= g && blas { m } else { 0 };
                classes.push((m >= g, m > 64, rings && longest > o.spec_k + 1, blas_rows));
            }
            start = end;
        }
    }
    classes.windows(2).all(|w| w[0] == w[1])
}

/// Greedy generation with the draft at this k is token-identical to greedy generation without
/// it. CUDA: `device_dflash::check_pair` (the device-resident loop, the driver with fused and
/// with generic steps, verify rows bitwise). CPU: the driver against plain `generate`.
pub fn spec_identity(
    dev: Device,
    tdir: &Path,
    ddir: &Path,
    prompt: &[u32],
    k: usize,
    gen: usize,
    o: &DeviceOpts,
) -> Result<(bool, String)> {
    match dev {
        Device::Cuda => {
            let r = crate::cmd::device_dflash::check_pair(
                ddir,
                tdir,
                prompt,
                k,
                gen,
                o.load_options(),
                false,
            )?;
            Ok((
                r.ok,
                format!(
                    "verify-bitwise {} device-loop {} driver {} accepted {}",
                    r.verify_bitwise, r.fast_same, r.generic_same, r.accepted
                ),
            ))
        }
        Device::Cpu => {
            let req = GenerateRequest {
                prompt: prompt.to_vec(),
                max_tokens: gen,
                sampling: SamplingParams::greedy(),
                ignore_eos: true,
                stop_token_ids: vec![],
            };
            let mut l = load(dev, tdir, Some((ddir, k)), o)?;
            let plain = generate(l.model.as_mut(), &req, false)?.completion;
            let mut d = l.dflash.take().unwrap().draft;
            let (spec, st) = generate_spec(
                l.model.as_mut(),
                d.as_mut() as &mut dyn DraftModel,
                &req,
                k,
                false,
                None,
            )?;
            Ok((
                spec.completion == plain,
                format!(
                    "driver {} accepted {}/{}",
                    spec.completion == plain,
                    st.num_accepted_tokens,
                    st.num_draft_tokens
                ),
            ))
        }
    }
}
