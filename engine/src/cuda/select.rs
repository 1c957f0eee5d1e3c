//! Which kernel runs a job: one `select` per kernel family, deciding from the job's shape and the
//! device's properties alone (docs/design/kernels.md). Every family has one kernel per job; the
//! choices below are the ones a shape or a device forces (head_dim, batch rows, group sizes,
//! shared memory an SM, SM count, whether libcublas loaded).

/// What the selects read of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevProps {
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Shared memory an SM holds (bytes).
    pub smem_per_sm: u32,
    /// Shared memory a block may opt in to (bytes, static + dynamic).
    pub smem_per_block: u32,
}

/// The split-KV decode attention and the flash prefill attention.
pub mod attention {
    use super::DevProps;
    use crate::cuda::{ATC_QK3_SMEM, ATT_QS_SMEM};

    /// One layer's attention job.
    #[derive(Debug, Clone, Copy)]
    pub struct Shape {
        /// Rows of the pass.
        pub m: usize,
        pub nh: usize,
        pub nkv: usize,
        pub hd: usize,
        /// Sliding window (0: full attention).
        pub window: usize,
        /// Rotary half-dimension of the layer.
        pub half: usize,
        /// FP8 K/V cache (else BF16).
        pub fp8: bool,
        /// Every row of the pass is the only row of its sequence (a causal decode step).
        pub solo: bool,
        /// A staged ring pass (some sequence has more rows than the ring's spare slots + 1).
        pub staged: bool,
    }

    /// How a decode (split-KV) attention job runs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Form {
        /// `attention_decode_tc*`: tensor-core split-KV (full-attention layers).
        Tc,
        /// `attention_decode_gqa*`: a KV head's query group a block.
        Gqa,
        /// `attention_decode_head*`: one block a query head (any head_dim, any group).
        Head,
    }

    /// The decode attention of a layer: its form, and whether the q/k norm + RoPE + K/V write
    /// runs inside it (else `qk_norm_rope_store` runs first).
    #[derive(Debug, Clone, Copy)]
    pub struct Decode {
        pub form: Form,
        pub fused_qk: bool,
    }

    /// The query group (query heads a KV head), 0 when the heads do not divide.
    pub fn group(s: &Shape) -> usize {
        if s.nh % s.nkv == 0 {
            s.nh / s.nkv
        } else {
            0
        }
    }

    /// Whether the flash prefill kernel takes the layer's heads: any even head_dim up to 128
    /// (past a multiple of 16 it stages K/V by element pairs) and whole query groups.
    pub fn flash_takes(s: &Shape) -> bool {
        s.hd % 2 == 0 && s.hd <= 128 && group(s) > 0
    }

    /// The decode form and the q/k fusion of a split-KV job (a pass that does not run the flash
    /// prefill kernel). A staged pass the flash kernel cannot take reads the stage through the
    /// one-block-a-head form.
    pub fn select_decode(s: &Shape) -> Decode {
        let group = group(s);
        let gqa = !s.staged && s.hd % 8 == 0 && s.hd <= 128 && (1..=16).contains(&group);
        // Tensor cores for the full layers (slower on the sliding ones: their few keys).
        let tc = gqa && s.hd % 16 == 0 && s.window == 0;
        let form = if tc {
            Form::Tc
        } else if gqa {
            Form::Gqa
        } else {
            Form::Head
        };
        // The q/k norm + RoPE + new K/V write inside the attention launch when no row reads
        // another row's new key; on full layers only with tensor cores (the GQA form's extra warp
        // costs an SM a block there).
        let fused_qk = s.solo
            && match form {
                Form::Tc => s.half <= 64,
                Form::Gqa => s.window > 0 && group <= 8,
                Form::Head => false,
            };
        Decode { form, fused_qk }
    }

    /// The q/k norm + RoPE + K/V write kernel (when the attention does not fuse it).
    pub fn qk_kernel(fp8: bool) -> &'static str {
        if fp8 {
            "qk_norm_rope_store_fp8"
        } else {
            "qk_norm_rope_store"
        }
    }

    /// The decode attention kernel, its block size, for a grid of `blocks` blocks.
    pub fn decode_kernel(
        s: &Shape,
        d: Decode,
        blocks: usize,
        dev: &DevProps,
    ) -> (&'static str, u32) {
        let group = group(s) as u32;
        match (d.form, d.fused_qk, s.fp8) {
            // Three K/V stages a warp where an SM holds the block's shared memory and the grid
            // is at most one wave (the decode step's full layers); the same bits as two.
            (Form::Tc, true, false)
                if dev.smem_per_sm >= ATC_QK3_SMEM + 4 * 1024 && blocks <= dev.sms as usize =>
            {
                ("attention_decode_tc_qk_3stage", 128)
            }
            (Form::Tc, true, false) => ("attention_decode_tc_qk", 128),
            (Form::Tc, true, true) => ("attention_decode_tc_qk_fp8", 128),
            (Form::Tc, false, false) => ("attention_decode_tc", 128),
            (Form::Tc, false, true) => ("attention_decode_tc_fp8", 128),
            (Form::Gqa, true, false) => ("attention_decode_gqa_qk", 32 * (group + 1)),
            (Form::Gqa, true, true) => ("attention_decode_gqa_qk_fp8", 32 * (group + 1)),
            (Form::Gqa, false, false) => ("attention_decode_gqa", 32 * group),
            (Form::Gqa, false, true) => ("attention_decode_gqa_fp8", 32 * group),
            (Form::Head, _, fp8) => (
                if fp8 {
                    "attention_decode_head_fp8"
                } else {
                    "attention_decode_head"
                },
                if s.hd <= 128 { 128 } else { 256 },
            ),
        }
    }

    /// The merge of a decode job's `nsplit` > 1 splits: 16 split values a thread loaded at once,
    /// 64 past 16 splits; the tensor-core form's splits (TC_CHUNK keys) have their own.
    pub fn merge_kernel(form: Form, nsplit: usize) -> &'static str {
        match (form == Form::Tc, nsplit > 16) {
            (true, true) => "attention_decode_tc_merge64",
            (true, false) => "attention_decode_tc_merge16",
            (false, true) => "attention_decode_merge64",
            (false, false) => "attention_decode_merge16",
        }
    }

    /// The flash prefill kernel: Q fragments in shared memory where an SM holds three such blocks
    /// (H100 / H200), else in registers (GB10's ~100 KB an SM).
    pub fn prefill_kernel(fp8: bool, dev: &DevProps) -> &'static str {
        let qsmem = dev.smem_per_sm >= 3 * (70 * 1024);
        match (qsmem, fp8) {
            (true, false) => "attention_prefill_flash_qsmem",
            (true, true) => "attention_prefill_flash_qsmem_fp8",
            (false, false) => "attention_prefill_flash",
            (false, true) => "attention_prefill_flash_fp8",
        }
    }

    /// Dynamic shared memory of the kernels that opt in past 48 KB (0 for the others).
    pub fn big_smem(name: &str) -> u32 {
        use crate::cuda::{ATC_QK_SMEM, ATC_SMEM};
        match name {
            "attention_prefill_flash_qsmem" | "attention_prefill_flash_qsmem_fp8" => ATT_QS_SMEM,
            "attention_decode_tc" | "attention_decode_tc_fp8" => ATC_SMEM,
            "attention_decode_tc_qk" | "attention_decode_tc_qk_fp8" => ATC_QK_SMEM,
            "attention_decode_tc_qk_3stage" => ATC_QK3_SMEM,
            _ => 0,
        }
    }

    /// Kernels launched with PDL whose small grids (under one block an SM) run slower when their
    /// blocks, scheduled as the previous kernel's blocks retire, crowd onto the first SMs freed:
    /// the sliding layers' decode attention (PERF.md run 155). They get `spread_pad` bytes of
    /// unused dynamic shared memory for a grid within one wave.
    pub const SPREAD: &[&str] = &["attention_decode_gqa_qk", "attention_decode_gqa_qk_fp8"];

    /// The padding of a SPREAD kernel with `static_smem` bytes of static shared memory that
    /// leaves an SM room for one of its blocks: half an SM's, less the static part (0 for other
    /// kernels).
    pub fn spread_pad(name: &str, smem_per_sm: u32, static_smem: u32) -> u32 {
        if !SPREAD.contains(&name) {
            return 0;
        }
        ((smem_per_sm / 2 + 1024).saturating_sub(static_smem) + 1023) & !1023
    }

    /// Dynamic shared memory of a decode attention launch of `blocks` blocks: the kernel's own
    /// (`big_smem`), or the SPREAD padding `pad` when the grid is within one wave.
    pub fn decode_smem(name: &str, blocks: usize, dev: &DevProps, pad: u32) -> u32 {
        let pad = if blocks <= dev.sms as usize { pad } else { 0 };
        big_smem(name).max(pad)
    }

    /// Threads of a split merge block: head_dim rounded up to warps.
    pub fn merge_block(hd: usize) -> u32 {
        (hd as u32).div_ceil(32) * 32
    }
}

/// GEMVs (passes below `gemm_min_rows`) and the dense GEMMs (long passes).
pub mod linear {
    use super::DevProps;

    /// One Linear job.
    #[derive(Debug, Clone, Copy)]
    pub struct Shape {
        pub m: usize,
        pub n: usize,
        pub k: usize,
        pub fp4: bool,
        /// A tile-interleaved copy of the BF16 weights exists (`tile_bf16`).
        pub tiled: bool,
    }

    /// Whether the BF16 tensor-core GEMV can run the (non-router) Linear.
    pub fn tc_takes(s: &Shape) -> bool {
        !s.fp4 && s.k % 32 == 0
    }

    /// The tensor-core GEMV kernel and its warps a block. The warps split K: enough blocks x
    /// warps to fill the GPU for narrow outputs, fixed per (N, K) on a device (never by the
    /// pass's rows), so every row's arithmetic is batch-invariant.
    pub fn tc_kernel(s: &Shape, dev: &DevProps) -> (&'static str, u32) {
        let warps = if s.n <= 2048 {
            16
        } else if s.n <= 4096 {
            8
        } else if s.n.div_ceil(16) <= 4 * dev.sms as usize {
            // 4 blocks an SM at 5 warps stream from every SM (at 4 warps, 5 an SM left some idle).
            5
        } else {
            4
        };
        let name = if !s.tiled {
            "linear_tc_bf16"
        } else if s.m == 1 && warps == 16 && s.k <= 8192 {
            // One row, one block an SM: two rounds of weight loads in flight a warp.
            "linear_tc_bf16_tiled_row"
        } else {
            "linear_tc_bf16_tiled"
        };
        (name, warps)
    }

    /// The SIMT GEMV (NVFP4, or K not a multiple of 32, or the router): kernel, grid and dynamic
    /// shared memory (one row: the activation staged when it fits 48 KB).
    pub fn simt_kernel(s: &Shape) -> (&'static str, (u32, u32, u32), u32) {
        let one = s.m == 1 && s.k * 4 <= 48 * 1024;
        let name = match (s.fp4, one, s.m <= 8) {
            (false, true, _) => "linear_bf16_1",
            (true, true, _) => "linear_fp4_1",
            (false, false, true) => "linear_bf16_m8",
            (true, false, true) => "linear_fp4_m8",
            (false, false, false) => "linear_bf16_m16",
            (true, false, false) => "linear_fp4_m16",
        };
        let n16 = s.n.div_ceil(16) as u32;
        if one {
            (name, (n16, 1, 1), (s.k * 4) as u32)
        } else {
            // One dimension, a block's row tiles neighbours (see `gemv_grid`).
            let tiles = if s.m <= 8 { 1 } else { s.m.div_ceil(16) as u32 };
            (name, (n16 * tiles, 1, 1), 0)
        }
    }

    /// The tensor-core GEMV's grid for N outputs and M rows: ceil(N / 16) x ceil(M / 8) blocks in
    /// one dimension, a weight tile's row tiles neighbours, so they run together and a pass of more
    /// than 8 rows (batched decode, a DFlash verify at k >= 8 or of several sequences) reads the
    /// weights from DRAM once, not once per 8 rows.
    pub fn gemv_grid(n: usize, m: usize) -> (u32, u32, u32) {
        ((n.div_ceil(16) * m.div_ceil(8)) as u32, 1, 1)
    }

    /// How a long pass's Linear runs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Gemm {
        /// cuBLAS BF16 GEMMs on the hi and lo halves of the activations.
        Cublas,
        /// laguna's own tensor-core GEMM.
        Kernel(&'static str),
    }

    /// The long-pass GEMM: dense BF16 Linears (router included) on cuBLAS where it loaded, else
    /// laguna's GEMMs (every one on the activations' hi and lo halves).
    pub fn gemm(fp4: bool, cublas: bool) -> Gemm {
        match fp4 {
            false if cublas => Gemm::Cublas,
            false => Gemm::Kernel("gemm_bf16"),
            true => Gemm::Kernel("gemm_fp4"),
        }
    }
}

/// The MoE: the one-row fused decode launch, the weight-streaming expert kernels (several rows
/// below `gemm_min_rows`) and the grouped expert GEMMs (long passes).
pub mod moe {
    use super::DevProps;
    use crate::config::LagunaConfig;

    /// `mk_launch`'s grid and dynamic shared memory on `sms` SMs where an SM holds `per_sm` of
    /// its blocks: one block an SM (every block resident: its grid barriers spin), None where
    /// the shapes or no block fit.
    pub fn mk_geom(cfg: &LagunaConfig, sms: u32, per_sm: u32) -> Option<(u32, u32)> {
        let smem = mk_smem(cfg)?;
        (per_sm > 0).then_some((sms, smem))
    }

    /// Threads of a `moe_decode_fused` block, one block an SM (its launch bounds): 20 warps an SM, as many
    /// as moe_*_fp4_warp keep resident, with 132 barrier arrivals on the H200 instead of 660.
    pub const MK_BLOCK: u32 = 640;

    /// `moe_decode_fused`'s dynamic shared memory (the normed row and every slot's activations, f32) when
    /// the model's shapes fit it.
    pub fn mk_smem(cfg: &LagunaConfig) -> Option<u32> {
        let h = cfg.hidden_size;
        let im = cfg.moe_intermediate_size;
        let kk = cfg.top_k + 1;
        let fits = cfg.num_experts > 0
            && cfg.num_experts <= 256
            && h % 16 == 0
            && im % 16 == 0
            && h <= 2048
            && im <= 512
            && kk <= 32;
        let bytes = 4 * (h + kk * im);
        // With the kernel's ~15 KB of static shared memory (s_dn, s_nw, s_bias, top-k's scores),
        // under the 48 KB a block gets without opting in.
        (fits && bytes <= 28 * 1024).then_some(bytes as u32)
    }

    /// A layer's experts.
    #[derive(Debug, Clone, Copy)]
    pub struct Shape {
        pub h: usize,
        pub im: usize,
        pub experts: usize,
        /// gate, up and down all NVFP4.
        pub fp4: bool,
        /// gate (and up) NVFP4, down NVFP4 (mixed stacks run the generic kernels).
        pub gate_fp4: bool,
        pub down_fp4: bool,
    }

    /// Whether the expert dot products take tensor cores: NVFP4 experts at H 2048 and I 512
    /// (Laguna-XS 2.1), in the fused decode launch and the multi-row items together, so a row
    /// keeps its bits whether it is decoded alone or verified with others.
    pub fn tc(s: &Shape) -> bool {
        s.fp4 && s.h == 2048 && s.im == 512
    }

    /// The fused one-row MoE launch (norm, router, top-k, experts, combine, next norm), when the
    /// layer fits it: one row, NVFP4 experts, a BF16 router, no unfolded shared expert, the
    /// shapes `mk_smem` accepts (`grid` > 0), and at most one router row pair a warp
    /// (E <= 2 x the grid's warps: the rows are loaded into registers before the PDL wait).
    pub fn fused_decode(
        s: &Shape,
        m: usize,
        router_fp4: bool,
        unfolded_shared: bool,
        grid: u32,
        block: u32,
    ) -> Option<&'static str> {
        let warps = (grid * block / 32) as usize;
        if m != 1 || grid == 0 || router_fp4 || unfolded_shared || !s.fp4 || s.experts > 2 * warps {
            return None;
        }
        Some(if tc(s) {
            "moe_decode_fused_tc"
        } else {
            "moe_decode_fused"
        })
    }

    /// The weight-streaming expert kernels of a pass of `slots` (row, expert) slots in `groups`
    /// groups: gate/up and down names, grids, block size and dynamic shared memory each.
    #[derive(Debug, Clone, Copy)]
    pub struct Stream {
        pub gate_up: &'static str,
        pub down: &'static str,
        pub gu_grid: (u32, u32, u32),
        pub dn_grid: (u32, u32, u32),
        pub gu_smem: u32,
        pub dn_smem: u32,
        pub block: u32,
        /// The tensor-core items (their input: the rows' B fragments, `moe_tc_bfrag_rows`).
        pub tc: bool,
    }

    pub fn stream(s: &Shape, m: usize, slots: usize, groups: usize, dev: &DevProps) -> Stream {
        let (h, im) = (s.h, s.im);
        // One item a warp, all of a warp's loads in flight (NVFP4, XS-sized or smaller).
        let warp =
            s.gate_fp4 && s.down_fp4 && h % 16 == 0 && im % 16 == 0 && h <= 2048 && im <= 512;
        if warp {
            // 4 warps a block: gate/up items are 2 intermediate rows of a group, down items 8
            // output rows.
            let gb = (groups * im / 2).div_ceil(4).max(1) as u32;
            let db = (groups * h / 8).div_ceil(4).max(1) as u32;
            let tc = tc(s);
            let (gate_up, down) = if tc {
                ("moe_gate_up_fp4_tc", "moe_down_fp4_tc")
            } else {
                ("moe_gate_up_fp4_warp", "moe_down_fp4_warp")
            };
            return Stream {
                gate_up,
                down,
                gu_grid: (gb, 1, 1),
                dn_grid: (db, 1, 1),
                gu_smem: 0,
                dn_smem: 0,
                block: 128,
                tc,
            };
        }
        if h % 16 == 0 && im % 16 == 0 {
            // Persistent grouped kernels, two blocks an SM.
            let gb = (dev.sms * 2)
                .min((slots * im / 2).div_ceil(8) as u32)
                .max(1);
            let db = (dev.sms * 2).min((slots * h / 4).div_ceil(8) as u32).max(1);
            let (gate_up, down) = if s.gate_fp4 {
                ("moe_gate_up_fp4_grouped", "moe_down_fp4_grouped")
            } else {
                ("moe_gate_up_bf16_grouped", "moe_down_bf16_grouped")
            };
            return Stream {
                gate_up,
                down,
                gu_grid: (gb, 1, 1),
                dn_grid: (db, 1, 1),
                gu_smem: 0,
                dn_smem: 0,
                block: 256,
                tc: false,
            };
        }
        // Any shape: a block row per group (one row: the activation staged in shared memory).
        let one = m == 1 && h * 4 <= 48 * 1024 && im * 4 <= 48 * 1024;
        let gate_up = match (s.gate_fp4, one) {
            (true, false) => "moe_gate_up_fp4",
            (false, false) => "moe_gate_up_bf16",
            (true, true) => "moe_gate_up_fp4_1",
            (false, true) => "moe_gate_up_bf16_1",
        };
        let down = match (s.down_fp4, one) {
            (true, false) => "moe_down_fp4",
            (false, false) => "moe_down_bf16",
            (true, true) => "moe_down_fp4_1",
            (false, true) => "moe_down_bf16_1",
        };
        let (gu_smem, dn_smem) = if one {
            ((h * 4) as u32, (im * 4) as u32)
        } else {
            (0, 0)
        };
        Stream {
            gate_up,
            down,
            gu_grid: (im.div_ceil(8) as u32, groups as u32, 1),
            dn_grid: (h.div_ceil(8) as u32, groups as u32, 1),
            gu_smem,
            dn_smem,
            block: 256,
            tc: false,
        }
    }

    /// The grouped expert GEMMs of a long pass: gate/up (with SiLU(gate) * up in its epilogue
    /// for NVFP4, writing the down GEMM's BF16 input split), down, and the down's output tile
    /// width (128 for NVFP4: K = I is short).
    #[derive(Debug, Clone, Copy)]
    pub struct Gemm {
        pub gate_up: &'static str,
        /// The gate/up GEMM applies SiLU(gate) * up itself (else `silu_mul_split` runs).
        pub silu: bool,
        pub down: &'static str,
        pub down_tile: usize,
    }

    pub fn gemm(s: &Shape) -> Gemm {
        let (gate_up, silu) = if s.gate_fp4 {
            ("moe_gemm_gate_up_fp4_silu", true)
        } else {
            ("moe_gemm_gate_up_bf16", false)
        };
        let (down, down_tile) = if s.down_fp4 {
            ("moe_gemm_down_fp4_wide", 128)
        } else {
            ("moe_gemm_down_bf16", 64)
        };
        Gemm {
            gate_up,
            silu,
            down,
            down_tile,
        }
    }
}

/// Greedy argmax and the device sampler.
pub mod sample {
    /// Blocks a row of `argmax_rows_split` (1,536 logits each, at most 64).
    pub fn argmax_split_blocks(vocab: usize) -> u32 {
        vocab.div_ceil(1536).clamp(1, 64) as u32
    }

    /// The sampler: `sample_rows_split` with `nb` >= 2 blocks a row where that many fit at once,
    /// else one block a row.
    pub fn sampler(nb: usize) -> &'static str {
        if nb >= 2 {
            "sample_rows_split"
        } else {
            "sample_rows"
        }
    }

    /// Most blocks a row of `sample_rows_split`.
    pub const SPLIT_MAX_BLOCKS: usize = 64;
    /// Threads of a `sample_rows_split` block (its launch bounds) and of a `sample_rows` block.
    pub const SPLIT_BLOCK: u32 = 512;
    pub const ROWS_BLOCK: u32 = 1024;

    /// The sampler launch for `n` rows where an SM holds `per_sm` blocks of `sample_rows_split`:
    /// as many blocks a row as fit on the device at once with every row's (its per-row
    /// barriers need all of a row's blocks resident), at most SPLIT_MAX_BLOCKS; else
    /// `sample_rows`. (kernel, grid, block)
    pub fn sampler_geom(n: usize, per_sm: u32, sms: u32) -> (&'static str, (u32, u32, u32), u32) {
        let nb = (per_sm as usize * sms as usize / n.max(1)).min(SPLIT_MAX_BLOCKS);
        match sampler(nb) {
            "sample_rows_split" => ("sample_rows_split", (nb as u32, n as u32, 1), SPLIT_BLOCK),
            name => (name, (n as u32, 1, 1), ROWS_BLOCK),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: DevProps = DevProps {
        sms: 132,
        smem_per_sm: 233_472,
        smem_per_block: 232_448,
    };
    const GB10: DevProps = DevProps {
        sms: 48,
        smem_per_sm: 102_400,
        smem_per_block: 101_376,
    };

    fn xs_attn(window: usize, solo: bool, fp8: bool) -> attention::Shape {
        attention::Shape {
            m: 1,
            nh: 64,
            nkv: 8,
            hd: 128,
            window,
            half: 64,
            fp8,
            solo,
            staged: false,
        }
    }

    #[test]
    fn attention_forms_by_shape_and_device() {
        use attention::*;
        // XS-2.1 decode step: full layers on tensor cores with the q/k write fused, 3 stages
        // where the SM holds them and the grid is one wave.
        let full = xs_attn(0, true, false);
        let d = select_decode(&full);
        assert_eq!((d.form, d.fused_qk), (Form::Tc, true));
        assert_eq!(
            decode_kernel(&full, d, 128, &H200).0,
            "attention_decode_tc_qk_3stage"
        );
        assert_eq!(
            decode_kernel(&full, d, 128, &GB10).0,
            "attention_decode_tc_qk"
        );
        assert_eq!(
            decode_kernel(&full, d, 512, &H200).0,
            "attention_decode_tc_qk"
        );
        // Sliding layers: the GQA form, q/k fused, a warp more than the group.
        let swa = xs_attn(512, true, false);
        let d = select_decode(&swa);
        assert_eq!((d.form, d.fused_qk), (Form::Gqa, true));
        assert_eq!(
            decode_kernel(&swa, d, 64, &H200),
            ("attention_decode_gqa_qk", 32 * 9)
        );
        // Verify rows (not solo): separate q/k launch.
        let d = select_decode(&xs_attn(512, false, true));
        assert!(!d.fused_qk);
        assert_eq!(
            decode_kernel(&xs_attn(512, false, true), d, 64, &H200).0,
            "attention_decode_gqa_fp8"
        );
        // head_dim 256 or a group over 16: one block a query head.
        let big = attention::Shape { hd: 256, ..full };
        assert_eq!(select_decode(&big).form, Form::Head);
        assert_eq!(decode_kernel(&big, select_decode(&big), 1, &H200).1, 256);
        // head_dim 40 / 50 / 18: the flash prefill; past 128 or odd: none (a staged pass of such
        // heads reads the stage in the head form).
        let hd40 = attention::Shape {
            hd: 40,
            window: 64,
            solo: false,
            ..full
        };
        assert!(flash_takes(&hd40) && flash_takes(&swa));
        assert!(flash_takes(&attention::Shape { hd: 50, ..hd40 }));
        assert!(flash_takes(&attention::Shape { hd: 18, ..hd40 }));
        assert!(!flash_takes(&big) && !flash_takes(&attention::Shape { hd: 51, ..hd40 }));
        assert_eq!(select_decode(&hd40).form, Form::Gqa);
        let staged = attention::Shape {
            staged: true,
            ..hd40
        };
        assert_eq!(select_decode(&staged).form, Form::Head);
        assert_eq!(
            select_decode(&attention::Shape { hd: 50, ..hd40 }).form,
            Form::Head
        );
        assert_eq!(merge_kernel(Form::Tc, 16), "attention_decode_tc_merge16");
        assert_eq!(merge_kernel(Form::Gqa, 64), "attention_decode_merge64");
        assert_eq!(
            prefill_kernel(false, &H200),
            "attention_prefill_flash_qsmem"
        );
        assert_eq!(prefill_kernel(true, &GB10), "attention_prefill_flash_fp8");
    }

    #[test]
    fn gemv_and_moe_by_shape() {
        let qkvg = linear::Shape {
            m: 1,
            n: 48 * 128 + 2 * 8 * 128 + 48,
            k: 2048,
            fp4: false,
            tiled: true,
        };
        // XS-2.1's 48-head q|k|v|g: 515 row groups, at most 4 an SM of the H200's 132: 5 warps;
        // a 64-head one (644 groups) and the GB10's 48 SMs: 4.
        assert_eq!(linear::tc_kernel(&qkvg, &H200), ("linear_tc_bf16_tiled", 5));
        assert_eq!(linear::tc_kernel(&qkvg, &GB10), ("linear_tc_bf16_tiled", 4));
        let q64 = linear::Shape {
            n: 64 * 128 + 2 * 8 * 128 + 64,
            ..qkvg
        };
        assert_eq!(linear::tc_kernel(&q64, &H200), ("linear_tc_bf16_tiled", 4));
        let o = linear::Shape {
            n: 2048,
            k: 8192,
            ..qkvg
        };
        assert_eq!(
            linear::tc_kernel(&o, &H200),
            ("linear_tc_bf16_tiled_row", 16)
        );
        assert_eq!(
            linear::tc_kernel(&linear::Shape { m: 7, ..o }, &H200),
            ("linear_tc_bf16_tiled", 16)
        );
        assert_eq!(
            linear::tc_kernel(&linear::Shape { tiled: false, ..o }, &H200).0,
            "linear_tc_bf16"
        );
        assert_eq!(linear::gemm(false, true), linear::Gemm::Cublas);
        assert_eq!(
            linear::gemm(false, false),
            linear::Gemm::Kernel("gemm_bf16")
        );
        assert_eq!(linear::gemm(true, true), linear::Gemm::Kernel("gemm_fp4"));
        let xs = moe::Shape {
            h: 2048,
            im: 512,
            experts: 256,
            fp4: true,
            gate_fp4: true,
            down_fp4: true,
        };
        assert_eq!(
            moe::fused_decode(&xs, 1, false, false, 132, 640),
            Some("moe_decode_fused_tc")
        );
        assert_eq!(
            moe::fused_decode(&xs, 1, false, false, 48, 640),
            Some("moe_decode_fused_tc")
        );
        // Too few warps for a router row pair each: the separate launches.
        assert_eq!(moe::fused_decode(&xs, 1, false, false, 4, 640), None);
        assert_eq!(moe::fused_decode(&xs, 2, false, false, 132, 640), None);
        let small = moe::Shape {
            h: 64,
            im: 32,
            experts: 8,
            ..xs
        };
        assert_eq!(
            moe::fused_decode(&small, 1, false, false, 132, 640),
            Some("moe_decode_fused")
        );
        assert!(moe::stream(&xs, 7, 63, 40, &H200).tc);
        assert_eq!(
            moe::stream(&small, 7, 28, 8, &H200).gate_up,
            "moe_gate_up_fp4_warp"
        );
        let odd = moe::Shape { h: 72, ..small };
        assert_eq!(
            moe::stream(&odd, 1, 4, 4, &H200).gate_up,
            "moe_gate_up_fp4_1"
        );
        assert_eq!(moe::gemm(&xs).down, "moe_gemm_down_fp4_wide");
        assert_eq!(sample::sampler(1), "sample_rows");
    }
}
