//! Linear kernels: the SIMT and tensor-core GEMVs (kernels/cu/gemv/), the dense GEMMs
//! (kernels/cu/gemm/dense.cu) and the activation helpers around them.
use super::{Geom, R};
use crate::cuda::device::{Dev, Prof};

/// The parameters every Linear kernel takes: y[m, n] (+)= x[m, k] . W^T.
#[derive(Debug, Clone, Copy)]
pub struct Linear {
    /// Weights (BF16 row-major, the tile-interleaved copy, or NVFP4 codes).
    pub w: u64,
    /// NVFP4 block scales (0 for BF16).
    pub s: u64,
    pub inv_gs: f32,
    pub x: u64,
    pub ldx: i32,
    pub y: u64,
    pub ldy: i32,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    /// Add into y instead of writing it.
    pub acc: bool,
}

/// Any Linear kernel (`linear_*`, `linear_tc_bf16*`, `gemm_*`) but the argmax-folding one.
pub fn linear(d: &Dev, prof: &mut Option<Prof>, name: &'static str, g: Geom, a: &Linear) -> R<()> {
    debug_assert!(name != "linear_tc_bf16_tiled_argmax");
    d.launch_p(prof, name, g.grid, (g.block, 1, 1), g.smem, |b| push(b, a))
}

/// `linear_tc_bf16_tiled_argmax`: the tiled GEMV folding each block's logits into the rows'
/// 64-bit argmax slots (`argmax_fin` reads them).
pub fn linear_argmax(d: &Dev, prof: &mut Option<Prof>, g: Geom, a: &Linear, slots: u64) -> R<()> {
    let name = "linear_tc_bf16_tiled_argmax";
    d.launch_p(prof, name, g.grid, (g.block, 1, 1), g.smem, |b| {
        push(b, a);
        b.u64(slots);
    })
}

fn push(b: &mut crate::cuda::device::Args, a: &Linear) {
    b.u64(a.w)
        .u64(a.s)
        .f32(a.inv_gs)
        .u64(a.x)
        .i32(a.ldx)
        .u64(a.y)
        .i32(a.ldy)
        .i32(a.m)
        .i32(a.n)
        .i32(a.k)
        .i32(a.acc as i32);
}

/// `silu_mul`: act[m, i] = SiLU(gu[:, :i]) * gu[:, i:].
pub fn silu_mul(d: &Dev, prof: &mut Option<Prof>, gu: u64, act: u64, m: usize, i: usize) -> R<()> {
    let grid = (i.div_ceil(256) as u32, m.min(65535) as u32, 1);
    d.launch_p(prof, "silu_mul", grid, (256, 1, 1), 0, |b| {
        b.u64(gu).u64(act).i32(m as i32).i32(i as i32);
    })
}

/// `silu_mul_split`: SiLU(gate) * up of `s` rows straight into a BF16 hi (+ lo) split.
pub fn silu_mul_split(
    d: &Dev,
    prof: &mut Option<Prof>,
    gu: u64,
    xs: u64,
    s: usize,
    i: usize,
    lo: bool,
) -> R<()> {
    let grid = (i.div_ceil(256) as u32, s.min(65535) as u32, 1);
    d.launch_p(prof, "silu_mul_split", grid, (256, 1, 1), 0, |b| {
        b.u64(gu).u64(xs).i32(s as i32).i32(i as i32).i32(lo as i32);
    })
}

/// `split_bf16`: x (f32 [m, k], row stride ldx) as BF16 hi [m, k] then lo [m, k] into xs.
#[allow(clippy::too_many_arguments)]
pub fn split_bf16(
    d: &Dev,
    prof: &mut Option<Prof>,
    x: u64,
    ldx: usize,
    m: usize,
    k: usize,
    xs: u64,
    lo: bool,
) -> R<()> {
    let grid = (k.div_ceil(256) as u32, m.min(65535) as u32, 1);
    d.launch_p(prof, "split_bf16", grid, (256, 1, 1), 0, |b| {
        b.u64(x)
            .i32(ldx as i32)
            .i32(m as i32)
            .i32(k as i32)
            .u64(xs)
            .i32(lo as i32);
    })
}

/// `tile_bf16`: the tile-interleaved copy of a BF16 [n, k] matrix (k % 32 == 0) the tiled GEMVs
/// read: each 16-row x 32-K tile one contiguous 1 KB piece in fragment order.
pub fn tile_bf16(d: &Dev, prof: &mut Option<Prof>, w: u64, dst: u64, n: usize, k: usize) -> R<()> {
    let grid = (n.div_ceil(16) as u32, (k / 32) as u32, 1);
    d.launch_p(prof, "tile_bf16", grid, (32, 1, 1), 0, |b| {
        b.u64(w).u64(dst).i32(n as i32).i32(k as i32);
    })
}

/// `read_u4` (diagnostic, `laguna-dev kbench`): `n` 16-byte words from `src` streamed once,
/// grid-stride, nothing computed: the practical read roofline a weight-streaming kernel is
/// measured against. `out`: one word a block (written only on an impossible checksum).
pub fn read_u4(d: &Dev, prof: &mut Option<Prof>, g: Geom, src: u64, n: u64, out: u64) -> R<()> {
    d.launch_p(prof, "read_u4", g.grid, (g.block, 1, 1), g.smem, |b| {
        b.u64(src).u64(n).u64(out);
    })
}

/// `read_tc_pattern` (diagnostic, `laguna-dev kbench`): `linear_tc_bf16`'s weight loads alone
/// for the BF16 [n, k] matrix at `w`, with its grid and block; `tiled`: each (16-row group,
/// K tile) read as one contiguous 1 KB piece, as a tile-interleaved layout would be.
#[allow(clippy::too_many_arguments)]
pub fn read_tc_pattern(
    d: &Dev,
    prof: &mut Option<Prof>,
    g: Geom,
    w: u64,
    n: i32,
    k: i32,
    out: u64,
    tiled: bool,
) -> R<()> {
    d.launch_p(
        prof,
        "read_tc_pattern",
        g.grid,
        (g.block, 1, 1),
        g.smem,
        |b| {
            b.u64(w).i32(n).i32(k).u64(out).i32(tiled as i32);
        },
    )
}
