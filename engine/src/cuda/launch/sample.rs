//! Argmax and sampling kernels (kernels/cu/sample/).
use super::R;
use crate::cuda::device::{Dev, Prof};

/// `argmax_rows`: one block of 1024 a row of `vocab` logits; the index into `out`.
pub fn argmax_rows(
    d: &Dev,
    prof: &mut Option<Prof>,
    n: u32,
    logits: u64,
    vocab: i32,
    out: u64,
) -> R<()> {
    d.launch_p(prof, "argmax_rows", (n, 1, 1), (1024, 1, 1), 0, |b| {
        b.u64(logits).i32(vocab).u64(out);
    })
}

/// `argmax_rows_split`: `nb` blocks of 256 a row, folded by a 64-bit atomicMax into `slots`
/// (per-row counters `cnt`; both left zero); the same index as `argmax_rows`.
#[allow(clippy::too_many_arguments)]
pub fn argmax_rows_split(
    d: &Dev,
    prof: &mut Option<Prof>,
    n: u32,
    nb: u32,
    logits: u64,
    vocab: i32,
    out: u64,
    slots: u64,
    cnt: u64,
) -> R<()> {
    d.launch_p(prof, "argmax_rows_split", (n, nb, 1), (256, 1, 1), 0, |b| {
        b.u64(logits).i32(vocab).u64(out).u64(slots).u64(cnt);
    })
}

/// `argmax_fin`: the n rows' tokens from the argmax slots the lm_head GEMV folded into.
pub fn argmax_fin(d: &Dev, prof: &mut Option<Prof>, slots: u64, n: i32, out: u64) -> R<()> {
    let block = (n as u32).div_ceil(32) * 32;
    d.launch_p(prof, "argmax_fin", (1, 1, 1), (block, 1, 1), 0, |b| {
        b.u64(slots).i32(n).u64(out);
    })
}
