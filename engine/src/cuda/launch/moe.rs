//! MoE kernels (kernels/cu/moe/ and kernels/cu/gemm.cu): router top-k and grouping, the
//! weight-streaming expert kernels, the grouped expert GEMMs, the combine, and the fused one-row
//! decode launch.
use super::{Geom, R};
use crate::cuda::device::{Args, Dev, Prof};

/// An expert stack on the device: codes (or BF16), E4M3 block scales, 1 / global scale per expert.
#[derive(Debug, Clone, Copy)]
pub struct Stack {
    pub w: u64,
    pub s: u64,
    pub inv: u64,
}
impl Stack {
    fn push(&self, b: &mut Args) {
        b.u64(self.w).u64(self.s).u64(self.inv);
    }
}

/// The (row, expert) slots of a pass grouped by expert (moe_group's or router_topk's output).
#[derive(Debug, Clone, Copy)]
pub struct Groups {
    pub expert: u64,
    pub start: u64,
    pub count: u64,
    pub perm: u64,
    pub meta: u64,
}
impl Groups {
    fn push(&self, b: &mut Args) {
        b.u64(self.expert)
            .u64(self.start)
            .u64(self.count)
            .u64(self.perm)
            .u64(self.meta);
    }
}

/// The router's top-k rule (sigmoid scores + bias, `k` picks, optional renormalisation, the
/// folded shared expert as slot k when `shared_slot`).
#[derive(Debug, Clone, Copy)]
pub struct TopK {
    pub bias: u64,
    pub experts: i32,
    pub k: i32,
    pub softcap: f32,
    pub norm_topk: i32,
    pub shared_slot: i32,
    pub inv_scale: f32,
}

/// `router_topk`: grid (rows), block 32. `direct`: a one-row pass's groups written here (no
/// `moe_group` launch).
#[allow(clippy::too_many_arguments)]
pub fn router_topk(
    d: &Dev,
    prof: &mut Option<Prof>,
    m: u32,
    logits: u64,
    t: &TopK,
    ids: u64,
    wts: u64,
    direct: Option<&Groups>,
) -> R<()> {
    d.launch_p(prof, "router_topk", (m, 1, 1), (32, 1, 1), 0, |b| {
        b.u64(logits)
            .u64(t.bias)
            .i32(t.experts)
            .i32(t.k)
            .f32(t.softcap)
            .i32(t.norm_topk)
            .u64(ids)
            .u64(wts)
            .i32(t.shared_slot)
            .f32(t.inv_scale);
        match direct {
            Some(g) => g.push(b),
            None => {
                b.u64(0).u64(0).u64(0).u64(0).u64(0);
            }
        }
    })
}

/// `moe_group`: the `slots` (row, expert) ids grouped by expert; with `tiles` also the GEMM's
/// 64-row tiles. `shared_expert`: the folded shared expert's id (-1: none).
#[allow(clippy::too_many_arguments)]
pub fn moe_group(
    d: &Dev,
    prof: &mut Option<Prof>,
    ids: u64,
    slots: i32,
    experts: i32,
    g: &Groups,
    tiles: u64,
    kk: i32,
    shared_expert: i32,
) -> R<()> {
    let block = (slots as u32).div_ceil(32).clamp(1, 32) * 32;
    d.launch_p(
        prof,
        "moe_group",
        (1, 1, 1),
        (block, 1, 1),
        8 * experts as u32,
        |b| {
            b.u64(ids).i32(slots).i32(experts);
            g.push(b);
            b.u64(tiles).i32(kk).i32(shared_expert);
        },
    )
}

/// The weight-streaming gate/up kernels (`moe_gate_up_*`): SiLU(gate) * up of every slot into
/// `act`. `x`: the normed rows (the tensor-core form: their B fragments).
#[derive(Debug, Clone, Copy)]
pub struct GateUp {
    pub gate: Stack,
    pub up: Stack,
    pub x: u64,
    pub h: i32,
    pub im: i32,
    pub kk: i32,
    pub groups: Groups,
    pub act: u64,
}

pub fn gate_up(d: &Dev, prof: &mut Option<Prof>, name: &'static str, g: Geom, a: &GateUp) -> R<()> {
    d.launch_p(prof, name, g.grid, (g.block, 1, 1), g.smem, |b| {
        a.gate.push(b);
        a.up.push(b);
        b.u64(a.x).i32(a.h).i32(a.im).i32(a.kk);
        a.groups.push(b);
        b.u64(a.act);
    })
}

/// The weight-streaming down kernels (`moe_down_*`): every slot's expert output into `out`.
#[derive(Debug, Clone, Copy)]
pub struct Down {
    pub down: Stack,
    pub act: u64,
    pub h: i32,
    pub im: i32,
    pub groups: Groups,
    pub out: u64,
}

pub fn down(d: &Dev, prof: &mut Option<Prof>, name: &'static str, g: Geom, a: &Down) -> R<()> {
    d.launch_p(prof, name, g.grid, (g.block, 1, 1), g.smem, |b| {
        a.down.push(b);
        b.u64(a.act).i32(a.h).i32(a.im);
        a.groups.push(b);
        b.u64(a.out);
    })
}

/// `moe_tc_bfrag_rows`: rows of H 2048 as the tensor-core items' B fragments. Grid (rows), 256.
pub fn tc_bfrag_rows(d: &Dev, prof: &mut Option<Prof>, m: u32, x: u64, xf: u64) -> R<()> {
    d.launch_p(prof, "moe_tc_bfrag_rows", (m, 1, 1), (256, 1, 1), 0, |b| {
        b.u64(x).u64(xf);
    })
}

/// The grouped expert GEMMs' gate/up (`moe_gemm_gate_up_*`): the activations' BF16 split `xs`
/// (lo at + `xlo` elements), 64-row tiles from `moe_group`. `silu_lo`: the NVFP4 form's
/// SiLU epilogue writes the down GEMM's input split, lo at + this many elements.
#[derive(Debug, Clone, Copy)]
pub struct GemmGateUp {
    pub gate: Stack,
    pub up: Stack,
    pub xs: u64,
    pub xlo: u64,
    pub h: i32,
    pub im: i32,
    pub kk: i32,
    pub groups: Groups,
    pub tiles: u64,
    pub out: u64,
    pub silu_lo: Option<u64>,
}

pub fn gemm_gate_up(
    d: &Dev,
    prof: &mut Option<Prof>,
    name: &'static str,
    g: Geom,
    a: &GemmGateUp,
) -> R<()> {
    d.launch_p(prof, name, g.grid, (g.block, 1, 1), g.smem, |b| {
        a.gate.push(b);
        a.up.push(b);
        b.u64(a.xs).u64(a.xlo).i32(a.h).i32(a.im).i32(a.kk);
        a.groups.push(b);
        b.u64(a.tiles).u64(a.out);
        if let Some(lo) = a.silu_lo {
            b.u64(lo);
        }
    })
}

/// The grouped expert GEMMs' down (`moe_gemm_down_*`).
#[derive(Debug, Clone, Copy)]
pub struct GemmDown {
    pub down: Stack,
    pub act: u64,
    pub xlo: u64,
    pub h: i32,
    pub im: i32,
    pub groups: Groups,
    pub tiles: u64,
    pub out: u64,
}

pub fn gemm_down(
    d: &Dev,
    prof: &mut Option<Prof>,
    name: &'static str,
    g: Geom,
    a: &GemmDown,
) -> R<()> {
    d.launch_p(prof, name, g.grid, (g.block, 1, 1), g.smem, |b| {
        a.down.push(b);
        b.u64(a.act).u64(a.xlo).i32(a.h).i32(a.im);
        a.groups.push(b);
        b.u64(a.tiles).u64(a.out);
    })
}

/// `moe_combine` / `moe_combine_norm`: x += scale x the slots' weighted outputs (+ the shared
/// expert's `shared`); with `norm` also the next layer's input RMSNorm into `hn` (and its BF16
/// split into `xs` when non-zero), one block a row.
#[derive(Debug, Clone, Copy)]
pub struct Combine {
    pub x: u64,
    pub out: u64,
    pub wts: u64,
    pub shared: u64,
    pub h: i32,
    pub kk: i32,
    pub scale: f32,
}

/// The next input norm `moe_combine_norm` ends with.
#[derive(Debug, Clone, Copy)]
pub struct NextNorm {
    pub w: u64,
    pub hn: u64,
    pub eps: f32,
    pub xs: u64,
    /// Threads a block (norm::norm_block(H)).
    pub block: u32,
}

pub fn combine(
    d: &Dev,
    prof: &mut Option<Prof>,
    m: u32,
    a: &Combine,
    norm: Option<&NextNorm>,
) -> R<()> {
    let push = |b: &mut Args| {
        b.u64(a.x)
            .u64(a.out)
            .u64(a.wts)
            .u64(a.shared)
            .i32(a.h)
            .i32(a.kk)
            .f32(a.scale);
    };
    match norm {
        Some(n) => d.launch_p(
            prof,
            "moe_combine_norm",
            (m, 1, 1),
            (n.block, 1, 1),
            0,
            |b| {
                push(b);
                b.u64(n.w).u64(n.hn).f32(n.eps).u64(n.xs);
            },
        ),
        None => {
            let grid = ((a.h as u32).div_ceil(256), m, 1);
            d.launch_p(prof, "moe_combine", grid, (256, 1, 1), 0, push)
        }
    }
}

/// MOE_BLOCK_PARAMS: the fused one-row decode launch (`moe_decode_fused`, `_tc`): the layer's
/// post-attention norm, router GEMV, top-k, expert items and combine into `x`, then the norm
/// `next_w` of the residual into `hn_out`. One block of `block` threads an SM, all resident.
#[derive(Debug, Clone, Copy)]
pub struct DecodeFused {
    pub x: u64,
    pub post_w: u64,
    pub eps: f32,
    /// rmsnorm's block size for H (norm::norm_block): the norm's reduction order.
    pub nb: i32,
    pub router: u64,
    /// The router logits, all bits 1 between launches (the kernel polls them).
    pub rlog: u64,
    pub topk: TopK,
    pub gate: Stack,
    pub up: Stack,
    pub down: Stack,
    pub h: i32,
    pub im: i32,
    pub act: u64,
    pub out: u64,
    pub ids: u64,
    pub wts: u64,
    pub scale: f32,
    /// The grid barrier word (0 at allocation).
    pub bar: u64,
    pub next_w: u64,
    pub hn_out: u64,
    /// Phase timestamps (kbench; 0: none).
    pub tp: u64,
    /// Gate/up issue stagger, ns a warp index.
    pub stag: i32,
}

pub fn decode_fused(
    d: &Dev,
    prof: &mut Option<Prof>,
    name: &'static str,
    g: Geom,
    a: &DecodeFused,
) -> R<()> {
    d.launch_p(prof, name, g.grid, (g.block, 1, 1), g.smem, |b| {
        let t = &a.topk;
        b.u64(a.x)
            .u64(a.post_w)
            .f32(a.eps)
            .i32(a.nb)
            .u64(a.router)
            .u64(a.rlog)
            .u64(t.bias)
            .i32(t.experts)
            .i32(t.k)
            .f32(t.softcap)
            .i32(t.norm_topk)
            .i32(t.shared_slot)
            .f32(t.inv_scale);
        a.gate.push(b);
        a.up.push(b);
        a.down.push(b);
        b.i32(a.h)
            .i32(a.im)
            .u64(a.act)
            .u64(a.out)
            .u64(a.ids)
            .u64(a.wts)
            .f32(a.scale)
            .u64(a.bar)
            .u64(a.next_w)
            .u64(a.hn_out)
            .u64(a.tp)
            .i32(a.stag);
    })
}
