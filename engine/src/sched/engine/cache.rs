//! The engine's use of the prefix cache (docs/design/prefix-cache.md): resume a new sequence from
//! the longest cached prefix of its prompt, save blocks and a snapshot at the end of each prompt,
//! every `prefix_snapshot_every` prompt tokens and at the end of each output, and evict least
//! recently used entries when a store runs short of blocks.
use super::super::prefix_cache::{Handles, Hit, PrefixCache, ROOT};
use super::super::types::GenRequest;
use super::Engine;
use crate::error::{EngineError, Result};
use crate::model::SeqId;
use crate::spec::SpecState;

/// Rows of a prefill chunk from `computed`: up to the prompt's end, or to the next multiple of
/// `every` before it (so the sequence holds exactly that many positions after the step and can be
/// snapshotted there).
pub(super) fn prefill_cut(computed: usize, prompt_len: usize, every: usize) -> usize {
    let left = prompt_len - computed;
    if let Some(k) = computed.checked_div(every) {
        let next = (k + 1) * every;
        if next < prompt_len {
            return left.min(next - computed);
        }
    }
    left
}

/// A started sequence: the target's id and the DFlash state, if any.
type Started = (SeqId, Option<SpecState>);

impl Engine {
    /// Turn the cache on when asked and both the target and the draft (if any) have a store.
    pub(super) fn with_prefix_cache(mut self) -> Engine {
        if !self.cfg.prefix_cache {
            tracing::info!("prefix cache: off");
            return self;
        }
        if self.spec.as_ref().is_some_and(|s| !s.taps().is_empty()) {
            // A proposer fed the taps of every prompt row would miss the restored ones.
            tracing::info!("prefix cache: off (the speculative proposer reads prompt taps)");
            return self;
        }
        let Some(t) = self.model.prefix_store() else {
            tracing::info!("prefix cache: off (the backend has no prefix store)");
            return self;
        };
        let (block, mut snaps) = (t.block_size(), t.needs_snapshot());
        if let Some(d) = self.dflash.as_mut() {
            match d.draft.prefix_store() {
                Some(ds) if ds.block_size() == block => snaps |= ds.needs_snapshot(),
                Some(ds) => {
                    tracing::warn!(
                        "prefix cache: off (the draft's blocks of {} positions differ from the target's {block})",
                        ds.block_size()
                    );
                    return self;
                }
                None => {
                    tracing::info!("prefix cache: off (the draft has no prefix store)");
                    return self;
                }
            }
        }
        tracing::info!(
            "prefix cache: on (blocks of {block} positions{}, snapshots at each prompt's and output's end{})",
            match (snaps, self.dflash.is_some()) {
                (true, true) => ", sliding-window rings and the draft's context in snapshots",
                (true, false) => ", sliding-window rings in snapshots",
                (false, true) => ", the draft's context in blocks",
                (false, false) => "",
            },
            match self.cfg.prefix_snapshot_every {
                0 => String::new(),
                n => format!(" and every {n} prompt tokens"),
            }
        );
        self.cache = Some(PrefixCache::new(block, !snaps));
        self
    }

    /// Snapshot interval of prefills (0: none, or no cache).
    pub(super) fn snapshot_every(&self) -> usize {
        if self.cache.is_some() {
            self.cfg.prefix_snapshot_every
        } else {
            0
        }
    }

    pub(super) fn prefill_cut(&self, computed: usize, prompt_len: usize) -> usize {
        prefill_cut(computed, prompt_len, self.snapshot_every())
    }

    fn start_seq(&mut self, req: &GenRequest) -> Result<Started> {
        match self.dflash.as_mut() {
            Some(d) => SpecState::new(
                self.model.as_mut(),
                d.draft.as_mut(),
                &req.prompt,
                d.k,
                req.sampling.clone(),
            )
            .map(|mut st| {
                st.controller = d
                    .costs
                    .as_ref()
                    .map(|c| crate::spec::SpecController::new(c.clone()));
                (st.target_seq, Some(st))
            }),
            None => self.model.new_seq().map(|s| (s, None)),
        }
    }

    fn free_started(&mut self, (seq, spec): Started) {
        match (spec, self.dflash.as_mut()) {
            (Some(st), Some(d)) => st.free(self.model.as_mut(), d.draft.as_mut()),
            _ => self.model.free_seq(seq),
        }
    }

    /// Start a sequence for `req`, resumed from the longest cached prefix of its prompt: the
    /// sequence, and the positions restored with the keys of the blocks it pins.
    pub(super) fn start_cached(
        &mut self,
        req: &GenRequest,
    ) -> Result<(Started, (usize, Vec<u64>))> {
        let mut started = self.start_seq(req)?;
        let Some(hit) = self.cache.as_mut().and_then(|c| c.lookup(&req.prompt)) else {
            return Ok((started, (0, vec![])));
        };
        match self.restore(started.0, started.1.as_mut(), &hit) {
            Ok(()) => {
                if let Some(c) = self.cache.as_mut() {
                    c.pin(&hit.blocks);
                }
                Ok((started, (hit.pos, hit.blocks)))
            }
            Err(e) => {
                tracing::warn!(
                    "prefix cache: could not restore {} cached tokens ({e}); prefilling the whole prompt",
                    hit.pos
                );
                self.free_started(started);
                Ok((self.start_seq(req)?, (0, vec![])))
            }
        }
    }

    fn restore(&mut self, seq: SeqId, spec: Option<&mut SpecState>, hit: &Hit) -> Result<()> {
        let none = || EngineError::Other("no prefix store".into());
        let t = self.model.prefix_store().ok_or_else(none)?;
        let tb: Vec<u64> = hit.block_handles.iter().map(|h| h.target).collect();
        t.restore(seq, &tb, hit.snap.map(|h| h.target), hit.pos)?;
        if let Some(st) = spec {
            let d = self.dflash.as_mut().ok_or_else(none)?;
            let ds = d.draft.prefix_store().ok_or_else(none)?;
            let db: Option<Vec<u64>> = hit.block_handles.iter().map(|h| h.draft).collect();
            let db = db.ok_or_else(|| EngineError::Other("a block without draft K/V".into()))?;
            let dsnap =
                match hit.snap {
                    Some(h) => Some(h.draft.ok_or_else(|| {
                        EngineError::Other("a snapshot without draft state".into())
                    })?),
                    None => None,
                };
            ds.restore(st.draft_seq, &db, dsnap, hit.pos)?;
            st.resume_at(hit.pos)?;
        }
        Ok(())
    }

    /// Give an evicted entry's memory back to the stores.
    fn release(&mut self, h: Handles) {
        if let Some(t) = self.model.prefix_store() {
            t.release(h.target);
        }
        if let (Some(dh), Some(d)) = (h.draft, self.dflash.as_mut()) {
            if let Some(ds) = d.draft.prefix_store() {
                ds.release(dh);
            }
        }
    }

    /// Free blocks of the target's and the draft's store.
    fn free_blocks(&mut self) -> (usize, usize) {
        let t = self.model.prefix_store().map_or(0, |s| s.free_blocks());
        let d = match self.dflash.as_mut() {
            Some(d) => d.draft.prefix_store().map_or(0, |s| s.free_blocks()),
            None => usize::MAX,
        };
        (t, d)
    }

    /// Evict least recently used entries until the target's store has `need.0` free blocks and
    /// the draft's `need.1`; false when the cache has nothing left to give.
    fn make_room(&mut self, cache: &mut PrefixCache, need: (usize, usize)) -> bool {
        loop {
            let (t, d) = self.free_blocks();
            if t >= need.0 && d >= need.1 {
                return true;
            }
            match cache.evict_one() {
                Some(h) => self.release(h),
                None => return false,
            }
        }
    }

    /// Before a step: evict what the step's writes need from the stores' pools. `rows` are
    /// (running index, rows the step writes for it).
    pub(super) fn cache_room_for(&mut self, rows: &[(usize, usize)]) {
        let Some(mut cache) = self.cache.take() else {
            return;
        };
        let (mut nt, mut nd) = (0, 0);
        for &(i, n) in rows {
            let (seq, dseq) = (self.running[i].seq, self.running[i].spec.as_ref());
            let dseq = dseq.map(|s| s.draft_seq);
            let upto = self.model.seq_len(seq) + n;
            nt += self
                .model
                .prefix_store()
                .map_or(0, |s| s.blocks_for(seq, upto));
            if let (Some(ds), Some(d)) = (dseq, self.dflash.as_mut()) {
                nd += d.draft.prefix_store().map_or(0, |s| s.blocks_for(ds, upto));
            }
        }
        if nt > 0 || nd > 0 {
            self.make_room(&mut cache, (nt, nd));
        }
        self.cache = Some(cache);
    }

    /// Export block `index` of the target (and draft) sequence.
    fn export_block(&mut self, seq: SeqId, dseq: Option<SeqId>, index: usize) -> Result<Handles> {
        let none = || EngineError::Other("no prefix store".into());
        let target = self
            .model
            .prefix_store()
            .ok_or_else(none)?
            .export_block(seq, index)?;
        let draft = match (dseq, self.dflash.as_mut()) {
            (Some(ds), Some(d)) => match d.draft.prefix_store().ok_or_else(none) {
                Ok(s) => match s.export_block(ds, index) {
                    Ok(h) => Some(h),
                    Err(e) => {
                        self.release(Handles {
                            target,
                            draft: None,
                        });
                        return Err(e);
                    }
                },
                Err(e) => return Err(e),
            },
            _ => None,
        };
        Ok(Handles { target, draft })
    }

    fn export_snapshot(&mut self, seq: SeqId, dseq: Option<SeqId>) -> Result<Handles> {
        let none = || EngineError::Other("no prefix store".into());
        let target = self
            .model
            .prefix_store()
            .ok_or_else(none)?
            .export_snapshot(seq)?;
        let draft = match (dseq, self.dflash.as_mut()) {
            (Some(ds), Some(d)) => {
                let r = d
                    .draft
                    .prefix_store()
                    .ok_or_else(none)
                    .and_then(|s| s.export_snapshot(ds));
                match r {
                    Ok(h) => Some(h),
                    Err(e) => {
                        self.release(Handles {
                            target,
                            draft: None,
                        });
                        return Err(e);
                    }
                }
            }
            _ => None,
        };
        Ok(Handles { target, draft })
    }

    /// Costs (target, draft) in store blocks of one block export and of one snapshot.
    fn costs(&mut self) -> ((usize, usize), (usize, usize)) {
        let t = self
            .model
            .prefix_store()
            .map_or((0, 0), |s| (s.block_cost(), s.snapshot_cost()));
        let d = match self.dflash.as_mut() {
            Some(d) => d
                .draft
                .prefix_store()
                .map_or((0, 0), |s| (s.block_cost(), s.snapshot_cost())),
            None => (0, 0),
        };
        ((t.0, d.0), (t.1, d.1))
    }

    /// Save running[idx]'s prefix: its whole blocks not cached yet and a snapshot at its length.
    pub(super) fn cache_save(&mut self, idx: usize) {
        let Some(mut cache) = self.cache.take() else {
            return;
        };
        if let Err(e) = self.save_into(&mut cache, idx) {
            tracing::debug!("prefix cache: not saved ({e})");
        }
        self.cache = Some(cache);
    }

    fn save_into(&mut self, cache: &mut PrefixCache, idx: usize) -> Result<()> {
        let r = &self.running[idx];
        if r.saved_at == usize::MAX {
            return Ok(());
        }
        let (seq, dseq) = (r.seq, r.spec.as_ref().map(|s| s.draft_seq));
        // The prompt and the output as delivered (a DFlash step may have committed more, past a
        // stop or max_tokens: those are dropped). The last delivered token is never saved: the
        // plain path has not run it yet, and both paths save the same positions.
        let toks: Vec<u32> = r.tokens.clone();
        let len = self.model.seq_len(seq);
        if let (Some(ds), Some(d)) = (dseq, self.dflash.as_ref()) {
            if d.draft.context_len(ds) != len {
                return Err(EngineError::Other(format!(
                    "the draft holds {} positions, the target {len}",
                    d.draft.context_len(ds)
                )));
            }
        }
        let pos = len.min(
            toks.len()
                .saturating_sub(if r.generated() > 0 { 1 } else { 0 }),
        );
        let saved_at = self.running[idx].saved_at;
        if pos == 0 || pos <= saved_at {
            return Ok(());
        }
        if pos < len {
            self.model.truncate(seq, pos);
            if let (Some(ds), Some(d)) = (dseq, self.dflash.as_mut()) {
                d.draft.truncate(ds, pos);
            }
        }
        self.running[idx].saved_at = pos;
        let b = cache.block_size();
        let (block_cost, snap_cost) = self.costs();
        let mut pins = std::mem::take(&mut self.running[idx].pins);
        let mut parent = pins.last().copied().unwrap_or(ROOT);
        let mut res = Ok(());
        for j in pins.len()..pos / b {
            let ids = &toks[j * b..(j + 1) * b];
            let key = match cache.find_block(parent, ids) {
                Some(k) => k,
                None if !cache.can_insert_block(parent, ids) => {
                    res = Err(EngineError::Other("a block's key is taken".into()));
                    break;
                }
                None if !self.make_room(cache, block_cost) => {
                    res = Err(EngineError::Other("no room for a block".into()));
                    break;
                }
                None => match self.export_block(seq, dseq, j) {
                    Ok(h) => cache.insert_block(parent, ids, h),
                    Err(e) => {
                        res = Err(e);
                        break;
                    }
                },
            };
            cache.pin(&[key]);
            pins.push(key);
            parent = key;
        }
        let whole = pins.len() == pos / b;
        self.running[idx].pins = pins;
        res?;
        let tail = &toks[pos / b * b..pos];
        if whole && !cache.has_snapshot(parent, tail) {
            if !self.make_room(cache, snap_cost) {
                return Err(EngineError::Other("no room for a snapshot".into()));
            }
            let h = self.export_snapshot(seq, dseq)?;
            if !cache.insert_snapshot(parent, tail, h) {
                self.release(h);
            }
        }
        Ok(())
    }

    /// After a step: snapshot sequences that reached a prefill mark or the end of their prompt.
    pub(super) fn cache_checkpoints(&mut self) {
        if self.cache.is_none() {
            return;
        }
        let every = self.snapshot_every();
        for i in 0..self.running.len() {
            let r = &self.running[i];
            if r.saved_at == usize::MAX {
                continue;
            }
            let c = r.computed;
            let mark = r.generated() == 0 && every > 0 && c.is_multiple_of(every) && c > r.saved_at;
            let end = r.generated() > 0 && r.saved_at < r.prompt_len && c >= r.prompt_len;
            if mark || end {
                self.cache_save(i);
            }
        }
    }

    /// What the cache holds, for the log: (blocks, snapshots).
    #[allow(dead_code)]
    pub(super) fn cache_len(&self) -> Option<(usize, usize)> {
        self.cache.as_ref().map(|c| c.len())
    }
}

#[cfg(test)]
mod tests {
    use super::prefill_cut;

    #[test]
    fn prefill_chunks_stop_at_marks_before_the_prompt_end() {
        assert_eq!(prefill_cut(0, 10, 4), 4);
        assert_eq!(prefill_cut(4, 10, 4), 4);
        assert_eq!(prefill_cut(8, 10, 4), 2);
        assert_eq!(prefill_cut(5, 10, 4), 3);
        assert_eq!(prefill_cut(0, 8, 4), 4);
        assert_eq!(prefill_cut(4, 8, 4), 4);
        assert_eq!(prefill_cut(3, 10, 0), 7);
    }
}
