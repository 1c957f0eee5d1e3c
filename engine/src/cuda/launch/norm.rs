//! Norm kernels (kernels/cu/norm/): the embedding gather + first input norm and the RMSNorms.
use super::R;
use crate::cuda::device::{Dev, Prof};

/// Threads of a row-norm block over `h` values: up to 8 per thread, whole warps, at most 1024.
pub fn norm_block(h: usize) -> u32 {
    (h.div_ceil(8).div_ceil(32) * 32).clamp(32, 1024) as u32
}

/// `rmsnorm` (or with `xs` `rmsnorm_split`, y's BF16 hi / lo written there too): y[m] =
/// RMSNorm(x[rows[m]]) with weights w, one block of `block` threads a row.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm(
    d: &Dev,
    prof: &mut Option<Prof>,
    m: u32,
    block: u32,
    x: u64,
    rows: u64,
    w: u64,
    y: u64,
    h: i32,
    eps: f32,
    xs: Option<u64>,
) -> R<()> {
    let name = if xs.is_some() {
        "rmsnorm_split"
    } else {
        "rmsnorm"
    };
    d.launch_p(prof, name, (m, 1, 1), (block, 1, 1), 0, |b| {
        b.u64(x).u64(rows).u64(w).u64(y).i32(h).f32(eps);
        if let Some(xs) = xs {
            b.u64(xs);
        }
    })
}

/// `embed_norm`: the rows' embeddings (token ids from `tokens`, or for fed rows from `feed`)
/// into x, and their RMSNorm with `w` into hn (and its BF16 split into xs when non-zero).
#[derive(Debug, Clone, Copy)]
pub struct EmbedNorm {
    pub table: u64,
    pub tokens: u64,
    pub feed: u64,
    pub x: u64,
    pub h: i32,
    pub w: u64,
    pub hn: u64,
    pub eps: f32,
    pub xs: u64,
}

pub fn embed_norm(d: &Dev, prof: &mut Option<Prof>, m: u32, block: u32, a: &EmbedNorm) -> R<()> {
    d.launch_p(prof, "embed_norm", (m, 1, 1), (block, 1, 1), 0, |b| {
        b.u64(a.table)
            .u64(a.tokens)
            .u64(a.feed)
            .u64(a.x)
            .i32(a.h)
            .u64(a.w)
            .u64(a.hn)
            .f32(a.eps)
            .u64(a.xs);
    })
}
