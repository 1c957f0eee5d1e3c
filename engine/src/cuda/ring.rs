//! K/V layout arithmetic of the CUDA backend, free of any device so CI tests it: how a K/V budget
//! splits into sliding-window rings and pages of the full-attention pool, when a sequence may
//! continue after a rewind, and which passes need the staged ring path.

/// Where a model's K/V go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    /// Ring slots per sequence (window + spec_k), 0 when no layer has a ring.
    pub ring: usize,
    /// The (largest) window of the ring layers.
    pub window: usize,
    pub ring_layers: usize,
    pub full_layers: usize,
    /// Bytes of all rings (ring layers x sequences x slots x K and V).
    pub ring_bytes: usize,
    /// Bytes of one page across the full layers (page_size positions, K and V).
    pub page_bytes: usize,
    /// Pages of the full-attention pool (1 when there is no full layer: nothing is paged).
    pub pages: usize,
}

/// Split `pool_bytes` of K/V: rings first (`max_seqs` sequences, `window + spec_k` slots for each
/// layer with a window when `rings` is on), then whole pages of `page_size` positions for the other
/// layers. `windows[i]` is layer i's sliding window (0 = full attention); `kvw` = kv_heads x head_dim;
/// `elt` = bytes per element (2 BF16, 1 FP8). Err says what to change when the rings do not fit.
#[allow(clippy::too_many_arguments)]
pub fn kv_layout(
    windows: &[usize],
    rings: bool,
    spec_k: usize,
    max_seqs: usize,
    kvw: usize,
    elt: usize,
    page_size: usize,
    pool_bytes: usize,
) -> Result<KvLayout, String> {
    let ring_layers = if rings {
        windows.iter().filter(|&&w| w > 0).count()
    } else {
        0
    };
    let full_layers = windows.len() - ring_layers;
    let window = if rings {
        windows.iter().copied().max().unwrap_or(0)
    } else {
        0
    };
    let ring = if ring_layers > 0 { window + spec_k } else { 0 };
    let seqs = max_seqs.max(1);
    let ring_bytes = ring_layers * seqs * ring * kvw * 2 * elt;
    let page_bytes = page_size.max(1) * kvw * 2 * elt * full_layers;
    if pool_bytes < ring_bytes {
        return Err(format!(
            "a K/V budget of {pool_bytes} bytes does not hold the sliding-window rings of {seqs} sequences ({ring_bytes} bytes: {ring_layers} layers x {ring} slots); raise kv_cache_memory_bytes or lower max_num_seqs"
        ));
    }
    let pages = if full_layers == 0 {
        1
    } else {
        ((pool_bytes - ring_bytes) / page_bytes).max(1)
    };
    Ok(KvLayout {
        ring,
        window,
        ring_layers,
        full_layers,
        ring_bytes,
        page_bytes,
        pages,
    })
}

/// Elements one K or V buffer may hold: kernels index it with 31-bit offsets.
pub const MAX_KV_ELEMS: usize = (1 << 31) - 1;

/// The default K/V budget when none is given: `budget` (a share of free device memory), but never
/// more than `max_seqs` sequences of `max_len` positions need (whole pages each, plus the rings),
/// nor more pages than 31-bit offsets address. `Err` only when the rings alone overflow 31 bits.
#[allow(clippy::too_many_arguments)]
pub fn default_pool_bytes(
    windows: &[usize],
    rings: bool,
    spec_k: usize,
    max_seqs: usize,
    kvw: usize,
    elt: usize,
    page_size: usize,
    max_len: usize,
    budget: usize,
) -> Result<usize, String> {
    let lay = kv_layout(
        windows,
        rings,
        spec_k,
        max_seqs,
        kvw,
        elt,
        page_size,
        usize::MAX,
    )?;
    let seqs = max_seqs.max(1);
    if seqs * lay.ring * kvw > MAX_KV_ELEMS {
        return Err(format!(
            "the sliding-window rings of {seqs} sequences ({} slots of {kvw} elements) exceed 31-bit offsets; lower max_num_seqs",
            lay.ring
        ));
    }
    if lay.full_layers == 0 {
        return Ok(budget.min(lay.ring_bytes).max(lay.ring_bytes));
    }
    let ps = page_size.max(1);
    let needed = seqs * max_len.max(1).div_ceil(ps);
    let addressable = MAX_KV_ELEMS / (ps * kvw.max(1));
    let pages = needed.min(addressable).max(1);
    Ok(budget.min(lay.ring_bytes + pages * lay.page_bytes))
}

/// Whether a sequence whose ring (R = `ring` slots, position p in slot p % R) was last written up to
/// `ring_hi` (exclusive) still holds every key the row at `start` sees through a `window`: the keys
/// start + 1 - window .. start - 1 must be among the last R written positions.
pub fn ring_can_continue(start: usize, ring_hi: usize, ring: usize, window: usize) -> bool {
    if ring == 0 || start == 0 || window <= 1 {
        return true; // no ring, or no earlier key visible
    }
    (start + 1).saturating_sub(window) >= ring_hi.saturating_sub(ring)
}

/// Per pass row: the first and the last row of its sequence (rows of one sequence are contiguous),
/// and the most rows any sequence has in the pass.
pub fn seq_spans(seqrow: &[i32]) -> (Vec<usize>, Vec<usize>, usize) {
    let m = seqrow.len();
    let (mut first, mut last) = (vec![0; m], vec![0; m]);
    let mut longest = 0;
    let mut i = 0;
    while i < m {
        let mut j = i;
        while j + 1 < m && seqrow[j + 1] == seqrow[i] {
            j += 1;
        }
        for r in i..=j {
            first[r] = i;
            last[r] = j;
        }
        longest = longest.max(j + 1 - i);
        i = j + 1;
    }
    (first, last, longest)
}

/// A pass writes its ring layers through the stage when some sequence has more rows than the
/// ring's spare slots + 1: written in place before the attention, its later rows would overwrite
/// keys its earlier rows still see.
pub fn needs_stage(longest: usize, ring: usize, window: usize) -> bool {
    ring > 0 && longest > ring - window + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_pool_never_exceeds_what_sequences_need() {
        // Tiny model: 2 full layers, kvw 64, BF16, pages of 64, 8 sequences of 4096 positions.
        let w = [0, 0];
        let b = default_pool_bytes(&w, true, 0, 8, 64, 2, 64, 4096, 16 << 30).unwrap();
        let lay = kv_layout(&w, true, 0, 8, 64, 2, 64, b).unwrap();
        assert_eq!(lay.pages, 8 * 4096 / 64);
        // A small budget still wins.
        assert_eq!(
            default_pool_bytes(&w, true, 0, 8, 64, 2, 64, 4096, 1 << 20).unwrap(),
            1 << 20
        );
    }

    #[test]
    fn default_pool_stays_within_31_bit_offsets() {
        // Enough sequences x length that the pages would need more than 2^31 elements.
        let w = [0, 5, 0];
        let (kvw, ps) = (1024, 16);
        let b = default_pool_bytes(&w, true, 3, 64, kvw, 2, ps, 262_144, usize::MAX).unwrap();
        let lay = kv_layout(&w, true, 3, 64, kvw, 2, ps, b).unwrap();
        assert!(lay.pages * ps * kvw <= MAX_KV_ELEMS);
        assert!(lay.pages > 0);
        // Rings that overflow on their own are an error naming the fix.
        let e = default_pool_bytes(&[600], true, 15, 1 << 16, 1024, 2, 16, 10, usize::MAX);
        assert!(e.unwrap_err().contains("max_num_seqs"));
    }

    /// A ring simulated slot by slot: which position each slot holds.
    struct SimRing {
        slots: Vec<Option<usize>>,
    }
    impl SimRing {
        fn write(&mut self, p: usize) {
            let r = self.slots.len();
            self.slots[p % r] = Some(p);
        }
        fn holds(&self, p: usize) -> bool {
            self.slots[p % self.slots.len()] == Some(p)
        }
    }

    #[test]
    fn ring_rewind_rule_is_exact() {
        // For every (window, spare, length, rewind), write 0..len row by row (what 1-row steps and
        // in-place passes of <= spare + 1 rows do), rewind, and compare the rule with the slots.
        for window in [1usize, 3, 8] {
            for spare in [0usize, 1, 4] {
                let ring = window + spare;
                for len in 1..3 * ring {
                    for back in 0..=len {
                        let mut sim = SimRing {
                            slots: vec![None; ring],
                        };
                        for p in 0..len {
                            sim.write(p);
                        }
                        let start = len - back;
                        let needed =
                            ((start + 1).saturating_sub(window)..start).all(|k| sim.holds(k));
                        assert_eq!(
                            ring_can_continue(start, len, ring, window),
                            needed,
                            "w {window} spare {spare} len {len} back {back}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn in_place_pass_of_spare_plus_one_rows_keeps_visible_keys() {
        // Rows s..s+n-1 written before the attention: row s + j must still see keys
        // s + j + 1 - window .. s + j. Holds exactly when n <= spare + 1 (needs_stage is false).
        for window in [2usize, 5, 8] {
            for spare in [0usize, 2, 6] {
                let ring = window + spare;
                for s in 0..2 * ring {
                    for n in 1..=ring + 2 {
                        let mut sim = SimRing {
                            slots: vec![None; ring],
                        };
                        for p in 0..s + n {
                            sim.write(p);
                        }
                        let ok = (0..n).all(|j| {
                            ((s + j + 1).saturating_sub(window)..=s + j).all(|k| sim.holds(k))
                        });
                        if !needs_stage(n, ring, window) {
                            assert!(ok, "w {window} spare {spare} s {s} n {n}");
                        } else if s >= ring {
                            // Once the ring has wrapped, such a pass overwrites the oldest key its
                            // first row sees (s + 1 - window, by row s + spare + 1).
                            assert!(!ok, "w {window} spare {spare} s {s} n {n}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn spans_of_contiguous_sequences() {
        let (f, l, longest) = seq_spans(&[0, 0, 0, 1, 2, 2]);
        assert_eq!(f, vec![0, 0, 0, 3, 4, 4]);
        assert_eq!(l, vec![2, 2, 2, 3, 5, 5]);
        assert_eq!(longest, 3);
        assert_eq!(seq_spans(&[]).2, 0);
    }

    #[test]
    fn layout_splits_rings_then_pages() {
        // 3 sliding layers (window 8) + 1 full, kvw 16, BF16: rings 3 x 2 seqs x (8 + 4) slots x 16 x 2 x 2.
        let w = [8, 8, 0, 8];
        let l = kv_layout(&w, true, 4, 2, 16, 2, 4, 100_000).unwrap();
        assert_eq!(
            (l.ring, l.window, l.ring_layers, l.full_layers),
            (12, 8, 3, 1)
        );
        assert_eq!(l.ring_bytes, 3 * 2 * 12 * 16 * 2 * 2);
        assert_eq!(l.page_bytes, 4 * 16 * 2 * 2);
        assert_eq!(l.pages, (100_000 - l.ring_bytes) / l.page_bytes);
        // Rings off: every layer pages.
        let l = kv_layout(&w, false, 4, 2, 16, 1, 4, 100_000).unwrap();
        assert_eq!(
            (l.ring, l.ring_layers, l.full_layers, l.ring_bytes),
            (0, 0, 4, 0)
        );
        // A budget below the rings is refused with what to change.
        let e = kv_layout(&w, true, 4, 2, 16, 2, 4, 1000).unwrap_err();
        assert!(e.contains("max_num_seqs"), "{e}");
    }
}
