//! Bytes one step reads from device memory, from the configs alone (docs/design/gb10.md): the
//! byte side of `laguna bench --device-profile gb10`'s projection. A bandwidth-bound step on GB10
//! takes about these bytes / the read bandwidth, plus its latency that moves no bytes.
//!
//! What is counted, each weight read once a pass (the GEMVs stream every weight row once for all
//! the pass's rows):
//! * attention: every layer's q|k|v|g and o_proj, BF16;
//! * dense MLPs: gate, up and down, BF16; router: E x hidden, BF16;
//! * shared experts and routed experts: NVFP4 when `quantization_config.format` is
//!   nvfp4-pack-quantized (codes n·k/2 + E4M3 scales n·k/16 bytes; the two f32 global scales are
//!   not counted, as in the CUDA loader's `decode_weight_bytes`), else BF16;
//! * routed experts of a pass of r rows: the expected number of distinct experts the rows pick
//!   per layer under uniform, independent routing, U(r) = E·(1 − (1 − K/E)^r) (each row picks
//!   K of E, so an expert is missed by one row with probability 1 − K/E). U(1) = K. Real routing
//!   of neighbouring tokens is correlated, so the real union is at most this on average;
//! * lm_head (BF16, once a pass: the argmax is fused into its GEMV) and the rows' embedding rows;
//! * K/V (elements of `kv_elt` bytes): a full-attention layer reads the positions before the pass
//!   and the pass's own, ctx + r; a sliding layer of window w the union of its rows' windows,
//!   min(ctx + r, w + r − 1);
//! * a DFlash step (k drafts, r = k + 1 verified rows) adds the draft: its propose pass of k + 1
//!   rows (its layers' q|k|v|g, o_proj and dense MLPs, the shared lm_head again, the rows'
//!   embedding rows, its K/V by the same rule at its window) and the context write of the k + 1
//!   verified rows (fc over the taps, and each draft layer's k and v rows of q|k|v|g).
//!
//! Not counted: RMSNorm weights, rope tables, biases, scales, activations (they stay in L2).
//!
//! That is the ideal ([`Reads::Ideal`]): every byte once a pass. [`Reads::Launched`] counts
//! what the CUDA kernels of a pass below `gemm_min_rows` (decode, the DFlash verify and propose)
//! request, before any reuse in L2 (docs/design/dflash.md, "where the verify's bytes go"):
//! * the split-KV decode attention runs a block per (row, K/V head, split), so each row reads its
//!   own keys: a row at position p reads p + 1 positions of a full layer, min(p + 1, w) of a
//!   sliding one, summed over the pass's rows instead of their union;
//! * the tensor-core GEMV (BF16 Linears with K % 32 == 0: attention, dense MLPs, lm_head, the
//!   draft's) requests its weights once per 8 rows (a block per weight tile and 8-row tile); the
//!   SIMT GEMV (NVFP4 or K % 32 != 0, and the router) once for up to 8 rows, then once per 16.
//!   A weight tile's row tiles are neighbours in the grid (`select::linear::gemv_grid`), so the
//!   repeats come while the tile is in L2 and DRAM sees it about once;
//! * the expert kernels group the rows' slots by expert and read each chosen expert once (the
//!   union, as in the ideal); so does a shared expert folded into the expert stack (same shape
//!   and storage as the routed ones), an unfolded one is three GEMVs.
use crate::config::{AttnKind, LagunaConfig, MlpKind};
use crate::spec::config::DraftConfig;

/// Which bytes a step counts: each once a pass, or as the CUDA kernels request them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    Ideal,
    Launched,
}

/// One pass's reads, by part (bytes; `routed_experts` is an expectation).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepBytes {
    pub attention: u64,
    pub dense_mlp: u64,
    pub shared_experts: u64,
    pub router: u64,
    pub lm_head: u64,
    pub embed_rows: u64,
    /// Expected distinct experts a layer's rows pick, summed over the MoE layers.
    pub experts_read: f64,
    pub routed_experts: f64,
    pub kv: u64,
    /// DFlash: the draft's propose pass (weights + embedding rows + its lm_head read).
    pub draft_weights: u64,
    pub draft_kv: u64,
    /// DFlash: the context write of the verified rows (fc + the k/v rows of each draft layer).
    pub draft_context: u64,
}

impl StepBytes {
    /// The target's weights besides the routed experts and the embedding rows: what the CUDA
    /// loader counts as `decode_weight_bytes` minus its top-K routed experts.
    pub fn dense_weights(&self) -> u64 {
        self.attention + self.dense_mlp + self.shared_experts + self.router + self.lm_head
    }

    pub fn total(&self) -> f64 {
        (self.dense_weights() + self.embed_rows + self.kv) as f64
            + self.routed_experts
            + (self.draft_weights + self.draft_kv + self.draft_context) as f64
    }

    /// A one-row decode step of one sequence with `ctx` positions before it.
    pub fn decode(cfg: &LagunaConfig, ctx: usize, kv_elt: u64) -> StepBytes {
        target_pass(cfg, 1, ctx, kv_elt, Reads::Ideal)
    }

    /// A DFlash step of one sequence with k drafts: propose (k + 1 rows), verify (k + 1 rows),
    /// context write (k + 1 rows), `ctx` committed positions before it; each byte once a pass.
    pub fn dflash(
        cfg: &LagunaConfig,
        draft: &DraftConfig,
        k: usize,
        ctx: usize,
        kv_elt: u64,
    ) -> StepBytes {
        Self::dflash_reads(cfg, draft, k, ctx, kv_elt, Reads::Ideal)
    }

    /// [`StepBytes::dflash`] counted as `reads` says: `Reads::Launched` is what the CUDA step
    /// (cuda/draft/fused_step.rs: propose, verify, context) requests, with K/V once per row and the BF16
    /// weights once per 8 rows.
    pub fn dflash_reads(
        cfg: &LagunaConfig,
        draft: &DraftConfig,
        k: usize,
        ctx: usize,
        kv_elt: u64,
        reads: Reads,
    ) -> StepBytes {
        let r = k + 1;
        let mut s = target_pass(cfg, r, ctx, kv_elt, reads);
        let h = draft.hidden_size as u64;
        let (hd, kvw) = (
            draft.head_dim as u64,
            (draft.num_kv_heads * draft.head_dim) as u64,
        );
        // The propose pass runs every draft layer over the block's r rows and the lm_head over
        // its k mask rows; the context write, fc and each layer's k and v rows over r rows.
        let lin = |out: u64, inp: u64, rows: usize| linear(reads, false, out, inp, rows);
        let mut layers = 0u64;
        for l in 0..draft.num_layers {
            let qw = draft.num_heads[l] as u64 * hd;
            let gw = draft.gate_width(l) as u64;
            let im = draft.intermediate_size as u64;
            layers += lin(qw + 2 * kvw + gw, h, r) + lin(h, qw, r);
            layers += 2 * lin(im, h, r) + lin(h, im, r);
        }
        let lm_head = lin(cfg.vocab_size as u64, cfg.hidden_size as u64, k);
        s.draft_weights = layers + lm_head + r as u64 * h * 2;
        let kv_row = 2 * kvw * kv_elt;
        s.draft_kv = draft.num_layers as u64 * kv_read(reads, draft.window, ctx, r) * kv_row;
        let taps_in = (draft.num_taps() * cfg.hidden_size) as u64;
        s.draft_context = lin(h, taps_in, r) + draft.num_layers as u64 * lin(2 * kvw, h, r);
        s
    }
}

fn bf16(out: u64, inp: u64) -> u64 {
    out * inp * 2
}

/// Weight passes of a GEMV over `rows` rows as launched: the tensor-core GEMV (BF16, K % 32 ==
/// 0) one per 8 rows, the SIMT GEMV one for up to 8 rows, then one per 16.
fn gemv_passes(fp4: bool, inp: u64, rows: usize) -> u64 {
    if !fp4 && inp.is_multiple_of(32) {
        rows.div_ceil(8) as u64
    } else if rows <= 8 {
        1
    } else {
        rows.div_ceil(16) as u64
    }
}

/// A Linear's weight bytes over a pass of `rows` rows (NVFP4 or BF16).
fn linear(reads: Reads, fp4: bool, out: u64, inp: u64, rows: usize) -> u64 {
    let once = if fp4 { nvfp4(out, inp) } else { bf16(out, inp) };
    match reads {
        Reads::Ideal => once,
        Reads::Launched => once * gemv_passes(fp4, inp, rows),
    }
}

/// The router's weights: always the SIMT GEMV (f32 precision for the top-k).
fn router(reads: Reads, out: u64, inp: u64, rows: usize) -> u64 {
    match reads {
        Reads::Ideal => bf16(out, inp),
        Reads::Launched => bf16(out, inp) * gemv_passes(true, inp, rows),
    }
}

/// K/V positions a layer's pass of r rows after `ctx` positions reads: their union, or (as
/// launched) each row its own.
fn kv_read(reads: Reads, window: Option<usize>, ctx: usize, r: usize) -> u64 {
    match reads {
        Reads::Ideal => kv_positions(window, ctx, r),
        Reads::Launched => (0..r).map(|i| kv_positions(window, ctx + i, 1)).sum(),
    }
}

fn nvfp4(out: u64, inp: u64) -> u64 {
    out * inp / 2 + out * inp / 16
}

/// Expected distinct experts r independent uniform rows pick, each K of E.
pub fn expected_union(experts: usize, top_k: usize, rows: usize) -> f64 {
    if experts == 0 {
        return 0.0;
    }
    let miss = 1.0 - top_k as f64 / experts as f64;
    experts as f64 * (1.0 - miss.powi(rows as i32))
}

/// K/V positions a layer's pass of r rows reads: all of ctx + r, or the union of the rows'
/// windows of w keys.
fn kv_positions(window: Option<usize>, ctx: usize, r: usize) -> u64 {
    let all = ctx + r;
    match window {
        Some(w) if w > 0 => all.min(w + r - 1) as u64,
        _ => all as u64,
    }
}

/// Whether the experts (routed and shared) are NVFP4 (poolside's NVFP4 build; everything else
/// there is BF16).
pub fn experts_nvfp4(cfg: &LagunaConfig) -> bool {
    cfg.quantization
        .as_ref()
        .is_some_and(|q| q.get("format").and_then(|f| f.as_str()) == Some("nvfp4-pack-quantized"))
}

fn target_pass(cfg: &LagunaConfig, r: usize, ctx: usize, kv_elt: u64, reads: Reads) -> StepBytes {
    let h = cfg.hidden_size as u64;
    let hd = cfg.head_dim as u64;
    let kvw = (cfg.num_kv_heads * cfg.head_dim) as u64;
    let fp4 = experts_nvfp4(cfg);
    let lin = |fp4: bool, out: u64, inp: u64| linear(reads, fp4, out, inp, r);
    let expert = |inter: u64| 2 * lin(fp4, inter, h) + lin(fp4, h, inter);
    // Each chosen expert once for its rows (grouped), as in the ideal.
    let grouped = |inter: u64| {
        2 * linear(Reads::Ideal, fp4, inter, h, 1) + linear(Reads::Ideal, fp4, h, inter, 1)
    };
    let folded = cfg.shared_expert_intermediate_size == cfg.moe_intermediate_size;
    let union = expected_union(cfg.num_experts, cfg.top_k, r);
    let kv_row = 2 * kvw * kv_elt;
    let mut s = StepBytes {
        lm_head: lin(false, cfg.vocab_size as u64, h),
        embed_rows: r as u64 * h * 2,
        ..Default::default()
    };
    for (i, l) in cfg.layers.iter().enumerate() {
        let qw = l.num_heads as u64 * hd;
        s.attention += lin(false, qw + 2 * kvw + cfg.gate_width(i) as u64, h) + lin(false, h, qw);
        let window = match l.attn {
            AttnKind::Sliding => cfg.sliding_window,
            _ => None,
        };
        s.kv += kv_read(reads, window, ctx, r) * kv_row;
        match l.mlp {
            MlpKind::Dense => {
                let im = cfg.intermediate_size as u64;
                s.dense_mlp += 2 * lin(false, im, h) + lin(false, h, im);
            }
            MlpKind::Sparse => {
                s.router += router(reads, cfg.num_experts as u64, h, r);
                let si = cfg.shared_expert_intermediate_size as u64;
                if si > 0 {
                    s.shared_experts += if folded { grouped(si) } else { expert(si) };
                }
                s.experts_read += union;
                s.routed_experts += union * grouped(cfg.moe_intermediate_size as u64) as f64;
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(rel: &str) -> LagunaConfig {
        LagunaConfig::from_file(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel))
            .unwrap()
    }

    fn draft(rel: &str) -> DraftConfig {
        DraftConfig::from_file(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).unwrap()
    }

    const XS: &str = "../tests/fixtures/reference/laguna-xs-2.1-nvfp4.config.json";
    const XS_DRAFT: &str = "../tests/fixtures/reference/laguna-xs-2.1-dflash.config.json";

    #[test]
    fn union_of_uniform_routing() {
        assert_eq!(expected_union(256, 8, 1), 8.0);
        // Two rows: 8 + 8 − 8·8/256 expected overlaps.
        assert!((expected_union(256, 8, 2) - (16.0 - 0.25)).abs() < 1e-12);
        // Many rows cover every expert.
        assert!((expected_union(256, 8, 10_000) - 256.0).abs() < 1e-9);
        assert_eq!(expected_union(0, 0, 3), 0.0);
    }

    /// The NVFP4 fixture (tests/fixtures/models/nvfp4-experts), by hand: hidden 64, head_dim 16,
    /// 2 K/V heads, per-head gate, heads [4, 8, 8, 8], layer 0 dense (intermediate 96), layers
    /// 1..3 sparse (8 experts, top 3, moe and shared intermediate 32, NVFP4), vocab 448, window 8,
    /// layer 0 full attention.
    #[test]
    fn fixture_decode_by_hand() {
        let c = cfg("../tests/fixtures/models/nvfp4-experts/config.json");
        let s = StepBytes::decode(&c, 20, 2);
        // q|k|v|g rows: 4 heads: 64 + 32 + 32 + 4 = 132; 8 heads: 128 + 64 + 8 = 200.
        let attn = 2 * (132 * 64 + 64 * 64) + 3 * 2 * (200 * 64 + 64 * 128);
        assert_eq!(s.attention, attn);
        assert_eq!(s.dense_mlp, 3 * 96 * 64 * 2);
        assert_eq!(s.router, 3 * 8 * 64 * 2);
        // An NVFP4 expert: 3 Linears of 32 x 64 = 2048 weights, 1024 code bytes + 128 scale bytes.
        assert_eq!(s.shared_experts, 3 * 3 * (1024 + 128));
        assert_eq!(s.routed_experts, (3 * 3 * 3 * (1024 + 128)) as f64);
        assert_eq!(s.lm_head, 448 * 64 * 2);
        assert_eq!(s.embed_rows, 128);
        // K/V row: 2 x 2 heads x 16 x 2 B = 128 B; full layer 21 positions, sliding ones 8.
        assert_eq!(s.kv, (21 + 3 * 8) * 128);
        assert_eq!(s.draft_weights + s.draft_kv + s.draft_context, 0);
    }

    /// A BF16-expert fixture with its draft (tests/fixtures/drafts/swa-yarn-perhead-causal-w8):
    /// a DFlash step at k = 3 (4 rows), by hand.
    #[test]
    fn fixture_dflash_by_hand() {
        let c = cfg("../tests/fixtures/models/swa-yarn-perhead/config.json");
        let d = draft("../tests/fixtures/drafts/swa-yarn-perhead-causal-w8/config.json");
        let s = StepBytes::dflash(&c, &d, 3, 10, 2);
        // 8 experts, top 2, 4 rows: 8 (1 − (3/4)^4) = 8 · 175/256 experts a layer, 3 layers.
        let u = 8.0 * 175.0 / 256.0;
        assert!((s.experts_read - 3.0 * u).abs() < 1e-12);
        assert!((s.routed_experts - 3.0 * u * (3 * 32 * 64 * 2) as f64).abs() < 1e-6);
        assert_eq!(s.shared_experts, 3 * 3 * 32 * 64 * 2);
        assert_eq!(s.embed_rows, 4 * 128);
        // Layers full, sliding, sliding, full: 14 positions, or min(14, 8 + 3) = 11.
        assert_eq!(s.kv, (14 + 11 + 11 + 14) * 128);
        // Draft: 2 layers of 4 heads (q|k|v|g 64 + 64 + 4 rows), MLP 96, lm_head 384 x 64.
        let layer = 132 * 64 * 2 + 64 * 64 * 2 + 3 * 96 * 64 * 2;
        assert_eq!(s.draft_weights, 2 * layer + 384 * 64 * 2 + 4 * 128);
        assert_eq!(s.draft_kv, 2 * 11 * 128);
        // fc: 2 taps of 64 -> 64; k and v rows: 64 x 64 a layer.
        assert_eq!(s.draft_context, 64 * 128 * 2 + 2 * 64 * 64 * 2);
    }

    /// The same step as the CUDA kernels request it, by hand: K/V once per row; at k = 3 (4
    /// rows) every GEMV one pass; at k = 9 (10 rows) the tensor-core GEMVs (all of this
    /// fixture's BF16 Linears: K = 64 or 128) two passes, the SIMT router one.
    #[test]
    fn fixture_dflash_as_launched_by_hand() {
        let c = cfg("../tests/fixtures/models/swa-yarn-perhead/config.json");
        let d = draft("../tests/fixtures/drafts/swa-yarn-perhead-causal-w8/config.json");
        let ideal = StepBytes::dflash(&c, &d, 3, 10, 2);
        let s = StepBytes::dflash_reads(&c, &d, 3, 10, 2, Reads::Launched);
        // Rows at positions 10..13 read 11, 12, 13, 14 keys of a full layer, 8 of a sliding one.
        assert_eq!(s.kv, (2 * (11 + 12 + 13 + 14) + 2 * 4 * 8) * 128);
        assert_eq!(s.draft_kv, 2 * 4 * 8 * 128);
        assert_eq!(
            (
                s.attention,
                s.dense_mlp,
                s.router,
                s.lm_head,
                s.shared_experts
            ),
            (
                ideal.attention,
                ideal.dense_mlp,
                ideal.router,
                ideal.lm_head,
                ideal.shared_experts
            )
        );
        assert_eq!(s.routed_experts, ideal.routed_experts);
        assert_eq!(
            (s.draft_weights, s.draft_context),
            (ideal.draft_weights, ideal.draft_context)
        );

        let ideal = StepBytes::dflash(&c, &d, 9, 10, 2);
        let s = StepBytes::dflash_reads(&c, &d, 9, 10, 2, Reads::Launched);
        assert_eq!(s.attention, 2 * ideal.attention);
        assert_eq!(s.lm_head, 2 * ideal.lm_head);
        assert_eq!(s.router, ideal.router);
        // Shared expert (intermediate 32 = the routed ones') folded into the stack: once; the
        // routed experts: the union of 10 rows, 8 (1 - (3/4)^10) a layer, once each.
        assert_eq!(s.shared_experts, ideal.shared_experts);
        assert!((s.experts_read - 3.0 * 8.0 * (1.0 - 0.75f64.powi(10))).abs() < 1e-12);
        assert_eq!(s.routed_experts, ideal.routed_experts);
        // Draft: layers over 10 rows and fc, k/v over 10 rows: two passes; lm_head over 9 mask
        // rows: two; the embedding rows once.
        let layer = 132 * 64 * 2 + 64 * 64 * 2 + 3 * 96 * 64 * 2;
        assert_eq!(s.draft_weights, 2 * (2 * layer + 384 * 64 * 2) + 10 * 128);
        assert_eq!(s.draft_context, 2 * (64 * 128 * 2 + 2 * 64 * 64 * 2));
        // Rows at positions 10..19: full layers 11 + .. + 20 = 155 keys, sliding 10 x 8.
        assert_eq!(s.kv, (2 * 155 + 2 * 10 * 8) * 128);
        // A decode step as launched is the ideal one.
        let one = target_pass(&c, 1, 10, 2, Reads::Launched);
        assert_eq!(one, StepBytes::decode(&c, 10, 2));
    }

    /// Laguna-XS 2.1 NVFP4 at a 2K context, by hand: the ~4.19 GB a decode step reads.
    #[test]
    fn xs21_decode_at_2k() {
        let c = cfg(XS);
        let s = StepBytes::decode(&c, 2048, 2);
        // 10 layers of 48 heads: q 6144 + k, v 2 x 1024 + gate 48 rows of 2048, o 2048 x 6144;
        // 30 layers of 64 heads: 8192 + 2048 + 64 rows, o 2048 x 8192. BF16.
        let a48 = (6144 + 2048 + 48) * 2048 * 2 + 2048 * 6144 * 2;
        let a64 = (8192 + 2048 + 64) * 2048 * 2 + 2048 * 8192 * 2;
        assert_eq!(s.attention, 10 * a48 + 30 * a64);
        assert_eq!(s.attention, 2_861_957_120);
        assert_eq!(s.dense_mlp, 3 * 8192 * 2048 * 2); // layer 0
        assert_eq!(s.router, 39 * 256 * 2048 * 2);
        // An NVFP4 expert: 3 x 512 x 2048 weights x 9/16 B = 1,769,472 B.
        assert_eq!(s.shared_experts, 39 * 1_769_472);
        assert_eq!(s.routed_experts, (39 * 8 * 1_769_472) as f64);
        assert_eq!(s.lm_head, 100_352 * 2048 * 2);
        // BF16 K/V, 4 KiB a position and layer: 10 full layers x 2049, 30 sliding x 512.
        assert_eq!(s.kv, (10 * 2049 + 30 * 512) * 4096);
        let gb = s.total() / 1e9;
        assert!((gb - 4.19).abs() < 0.01, "{gb} GB");
        // FP8 K/V halves only the K/V.
        let f = StepBytes::decode(&c, 2048, 1);
        assert_eq!(s.total() - f.total(), (s.kv / 2) as f64);
    }

    /// XS-2.1 with its DFlash draft at k = 15 (16 rows) at 2K, by hand.
    #[test]
    fn xs21_dflash_k15() {
        let c = cfg(XS);
        let d = draft(XS_DRAFT);
        let s = StepBytes::dflash(&c, &d, 15, 2048, 2);
        let u = 256.0 * (1.0 - (31.0f64 / 32.0).powi(16));
        assert!((u - 102.0).abs() < 0.5);
        assert!((s.routed_experts - 39.0 * u * 1_769_472.0).abs() < 1.0);
        assert_eq!(s.kv, (10 * 2064 + 30 * 527) * 4096);
        // Draft layers: 64 heads, per-head gate, dense MLP 8192; the shared lm_head; 16 rows.
        let layer = (8192 + 2048 + 64) * 2048 * 2 + 2048 * 8192 * 2 + 3 * 8192 * 2048 * 2;
        assert_eq!(s.draft_weights, 5 * layer + 100_352 * 2048 * 2 + 16 * 4096);
        assert_eq!(s.draft_kv, 5 * 527 * 4096);
        assert_eq!(s.draft_context, 2048 * 5 * 2048 * 2 + 5 * 2048 * 2048 * 2);
        // The verify pass shares every non-expert weight with a decode step.
        let dec = StepBytes::decode(&c, 2048, 2);
        assert_eq!(s.dense_weights(), dec.dense_weights());
    }

    /// XS-2.1 at k = 6 (7 rows) as launched, by hand: the weights as in the ideal (7 rows are
    /// one 8-row GEMV pass), the K/V once per row: 7 x 2049 + 21 positions of a full layer
    /// instead of 2055, 7 x 512 of a sliding one instead of 518; at 32K a full layer reads
    /// 7 x 32769 + 21.
    #[test]
    fn xs21_dflash_k6_as_launched() {
        let c = cfg(XS);
        let d = draft(XS_DRAFT);
        for ctx in [2048usize, 32768] {
            let ideal = StepBytes::dflash(&c, &d, 6, ctx, 2);
            let s = StepBytes::dflash_reads(&c, &d, 6, ctx, 2, Reads::Launched);
            let full = 7 * (ctx as u64 + 1) + 21;
            assert_eq!(s.kv, (10 * full + 30 * 7 * 512) * 4096);
            assert_eq!(ideal.kv, (10 * (ctx as u64 + 7) + 30 * 518) * 4096);
            assert_eq!(s.draft_kv, 5 * 7 * 512 * 4096);
            assert_eq!(ideal.draft_kv, 5 * 518 * 4096);
            assert_eq!(s.dense_weights(), ideal.dense_weights());
            assert_eq!(s.routed_experts, ideal.routed_experts);
            assert_eq!(s.draft_weights, ideal.draft_weights);
            assert_eq!(s.draft_context, ideal.draft_context);
        }
    }
}
