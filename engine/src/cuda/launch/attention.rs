//! Attention kernels (kernels/cu/attention/): the q/k norm + RoPE + K/V write, the split-KV
//! decode attention and its merges, the flash prefill attention and the ring commit.
use super::{Geom, R};
use crate::cuda::device::{Args, Dev, Prof};

/// The q/k norm + RoPE arguments (after the new K/V rows where a kernel writes them).
#[derive(Debug, Clone, Copy)]
pub struct Rope {
    pub q_norm: u64,
    pub k_norm: u64,
    pub inv_freq: u64,
    pub half: i32,
    pub attn_factor: f32,
    pub eps: f32,
}
impl Rope {
    fn push(&self, b: &mut Args) {
        b.u64(self.q_norm)
            .u64(self.k_norm)
            .u64(self.inv_freq)
            .i32(self.half)
            .f32(self.attn_factor)
            .f32(self.eps);
    }
}

/// Where a layer's K/V live: the block table (ring or pages) and the caches.
#[derive(Debug, Clone, Copy)]
pub struct Cache {
    pub pos: u64,
    pub seqrow: u64,
    pub bt: u64,
    pub max_pages: i32,
    pub page_size: i32,
    pub kc: u64,
    pub vc: u64,
}

/// `qk_norm_rope_store` / `_fp8` (QK_PARAMS): q normed and rotated in place, the new K/V rows
/// normed, rotated and written to the cache (or to the stage `ks` / `vs` when non-zero).
#[derive(Debug, Clone, Copy)]
pub struct QkStore {
    pub q: u64,
    pub ldq: i32,
    pub k: u64,
    pub v: u64,
    pub ldkv: i32,
    pub rope: Rope,
    pub cache: Cache,
    pub nh: i32,
    pub nkv: i32,
    pub hd: i32,
    pub ks: u64,
    pub vs: u64,
    pub kinv: f32,
    pub vinv: f32,
}

pub fn qk_norm_rope_store(
    d: &Dev,
    prof: &mut Option<Prof>,
    fp8: bool,
    g: Geom,
    a: &QkStore,
) -> R<()> {
    let name = if fp8 {
        "qk_norm_rope_store_fp8"
    } else {
        "qk_norm_rope_store"
    };
    d.launch_p(prof, name, g.grid, (g.block, 1, 1), g.smem, |b| {
        b.u64(a.q).i32(a.ldq).u64(a.k).u64(a.v).i32(a.ldkv);
        a.rope.push(b);
        let c = &a.cache;
        b.u64(c.pos)
            .u64(c.seqrow)
            .u64(c.bt)
            .i32(c.max_pages)
            .i32(c.page_size)
            .u64(c.kc)
            .u64(c.vc)
            .i32(a.nh)
            .i32(a.nkv)
            .i32(a.hd)
            .u64(a.ks)
            .u64(a.vs)
            .f32(a.kinv)
            .f32(a.vinv);
    })
}

/// ATT_PARAMS: the arguments every decode and prefill attention kernel starts with.
#[derive(Debug, Clone, Copy)]
pub struct Attn {
    pub q: u64,
    pub ldq: i32,
    pub out: u64,
    pub ldo: i32,
    pub cache: Cache,
    pub nh: i32,
    pub nkv: i32,
    pub hd: i32,
    pub window: i32,
    pub sink: u64,
    pub g: u64,
    pub ldg: i32,
    pub gate_mode: i32,
    /// Softmax scale (the K scale folded in).
    pub scale: f32,
    pub vscale: f32,
}
impl Attn {
    fn push(&self, b: &mut Args) {
        let c = &self.cache;
        b.u64(self.q)
            .i32(self.ldq)
            .u64(self.out)
            .i32(self.ldo)
            .u64(c.kc)
            .u64(c.vc)
            .u64(c.pos)
            .u64(c.seqrow)
            .u64(c.bt)
            .i32(c.max_pages)
            .i32(c.page_size)
            .i32(self.nh)
            .i32(self.nkv)
            .i32(self.hd)
            .i32(self.window)
            .u64(self.sink)
            .u64(self.g)
            .i32(self.ldg)
            .i32(self.gate_mode)
            .f32(self.scale)
            .f32(self.vscale);
    }
}

/// The new K/V rows a decode attention writes itself (`_qk` kernels), with their norm + RoPE.
#[derive(Debug, Clone, Copy)]
pub struct FusedQk {
    pub k: u64,
    pub v: u64,
    pub ldkv: i32,
    pub rope: Rope,
    pub kinv: f32,
    pub vinv: f32,
}

/// A split-KV decode attention (`attention_decode_*`): `nsplit` splits a row, partials in `part`
/// (or the output when `nsplit` is 1). `qk`: the `_qk` kernels' fused q/k write (GQK_PARAMS);
/// else the kernel takes the per-row key ends of a non-causal block (`kend`, 0 when causal), and
/// `attention_decode_head*` the staged pass's K / V stage and first rows (`stage`: ks, vs,
/// sfirst; zeros when the layer is not staged).
#[allow(clippy::too_many_arguments)]
pub fn decode(
    d: &Dev,
    prof: &mut Option<Prof>,
    name: &'static str,
    g: Geom,
    a: &Attn,
    nsplit: i32,
    part: u64,
    qk: Option<&FusedQk>,
    kend: u64,
    stage: [u64; 3],
) -> R<()> {
    debug_assert_eq!(name.contains("_qk"), qk.is_some(), "{name}");
    let head = name.starts_with("attention_decode_head");
    debug_assert!(head || stage[0] == 0, "{name} reads no stage");
    d.launch_p(prof, name, g.grid, (g.block, 1, 1), g.smem, |b| {
        a.push(b);
        b.i32(nsplit).u64(part);
        match qk {
            Some(f) => {
                b.u64(f.k).u64(f.v).i32(f.ldkv);
                f.rope.push(b);
                b.f32(f.kinv).f32(f.vinv);
            }
            None => {
                b.u64(kend);
                if head {
                    b.u64(stage[0]).u64(stage[1]).u64(stage[2]);
                }
            }
        }
    })
}

/// MERGE_PARAMS: the merge of a decode attention's split partials into the output rows.
#[derive(Debug, Clone, Copy)]
pub struct Merge {
    pub part: u64,
    pub nsplit: i32,
    pub out: u64,
    pub ldo: i32,
    pub nh: i32,
    pub hd: i32,
    pub sink: u64,
    pub g: u64,
    pub ldg: i32,
    pub gate_mode: i32,
    pub pos: u64,
    pub window: i32,
    pub kend: u64,
    pub vscale: f32,
}

/// `attention_decode_merge16` / `_merge64` / `attention_decode_tc_merge16` / `_tc_merge64`.
pub fn merge(d: &Dev, prof: &mut Option<Prof>, name: &'static str, g: Geom, a: &Merge) -> R<()> {
    d.launch_p(prof, name, g.grid, (g.block, 1, 1), g.smem, |b| {
        b.u64(a.part)
            .i32(a.nsplit)
            .u64(a.out)
            .i32(a.ldo)
            .i32(a.nh)
            .i32(a.hd)
            .u64(a.sink)
            .u64(a.g)
            .i32(a.ldg)
            .i32(a.gate_mode)
            .u64(a.pos)
            .i32(a.window)
            .u64(a.kend)
            .f32(a.vscale);
    })
}

/// The flash prefill attention's arguments after ATT_PARAMS.
#[derive(Debug, Clone, Copy)]
pub struct Prefill {
    /// Query tiles of the pass: (first row, rows) pairs.
    pub tiles: u64,
    /// The stage of a staged ring pass (0, 0 otherwise).
    pub ks: u64,
    pub vs: u64,
    /// Per row: the first row of its sequence in the pass.
    pub sfirst: u64,
    /// Non-zero: the output also as the BF16 split the o_proj GEMM reads.
    pub xs: u64,
    pub m: i32,
}

/// `attention_prefill_flash*`.
pub fn prefill(
    d: &Dev,
    prof: &mut Option<Prof>,
    name: &'static str,
    g: Geom,
    a: &Attn,
    p: &Prefill,
) -> R<()> {
    d.launch_p(prof, name, g.grid, (g.block, 1, 1), g.smem, |b| {
        a.push(b);
        b.u64(p.tiles)
            .u64(p.ks)
            .u64(p.vs)
            .u64(p.sfirst)
            .u64(p.xs)
            .i32(p.m);
    })
}

/// `ring_commit`: a staged pass's rows among their sequence's last `ring` positions from the
/// stage into their ring slots (`rowb` bytes a K or V row). Grid (rows), block 64.
#[derive(Debug, Clone, Copy)]
pub struct RingCommit {
    pub ks: u64,
    pub vs: u64,
    pub pos: u64,
    pub seqrow: u64,
    pub slast: u64,
    pub bt: u64,
    pub ring: i32,
    pub kc: u64,
    pub vc: u64,
    pub rowb: i32,
}

pub fn ring_commit(d: &Dev, prof: &mut Option<Prof>, m: u32, a: &RingCommit) -> R<()> {
    d.launch_p(prof, "ring_commit", (m, 1, 1), (64, 1, 1), 0, |b| {
        b.u64(a.ks)
            .u64(a.vs)
            .u64(a.pos)
            .u64(a.seqrow)
            .u64(a.slast)
            .u64(a.bt)
            .i32(a.ring)
            .u64(a.kc)
            .u64(a.vc)
            .i32(a.rowb);
    })
}
