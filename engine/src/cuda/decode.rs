//! Decode steps from captured CUDA graphs (`decode_greedy`, `decode_step` with `sample_rows`)
//! and the device sampler's launch.
use super::{as_bytes, as_bytes_mut, cerr, device, select, CudaModel, DECODE_ROWS};
use crate::error::{EngineError, Result};
use crate::model::{DecodeItem, Model, SeqId};
use crate::sample::SamplingParams;
use std::cell::RefCell;
use std::collections::HashMap;
use std::collections::VecDeque;

/// What a decode step leaves on the device for the next: its rows' tokens in `sc.amax` (what
/// `DecodeItem::prev` names), and, when the readback ring is there (so `decode_advance` ran),
/// `sc.tokens` = row feeds and `sc.pos` = `next_pos` for the same sequences in the same rows.
pub(super) struct Fed {
    pub seqs: Vec<SeqId>,
    pub next_pos: Vec<i32>,
}

/// The captured decode graphs and the pipelined decode steps in flight.
#[derive(Default)]
pub(super) struct DecodeState {
    /// The captured `decode_greedy` step and the `attention_decode_tc` grid it was captured with.
    pub(super) graph: Option<device::Graph>,
    pub(super) graph_tc: usize,
    pub(super) graph_failed: bool,
    /// Captured `decode_step` bodies by (batch size, all greedy, `attention_decode_tc` grid).
    pub(super) step_graphs: HashMap<(usize, bool, usize), device::Graph>,
    /// Decode steps launched by `decode_launch` and not yet collected, oldest first: (readback
    /// ring slot, rows, an event recorded after the step).
    pub(super) pending: VecDeque<(usize, usize, device::Event)>,
    /// What the last decode step left for the next one (`Fed`); None once anything else may
    /// have written `sc.amax`, `sc.tokens` or `sc.pos`.
    pub(super) fed: RefCell<Option<Fed>>,
    /// Decode steps that ran `decode_advance` (the device's `sc.adv_ctr` holds the same count).
    pub(super) adv_steps: u64,
}

/// One row's parameters for `sample_rows`: (temperature, 0 = greedy; top_k; top_p; u).
fn sample_params(sp: &SamplingParams, u: f64) -> [f64; 4] {
    let t = if sp.is_greedy() {
        0.0
    } else {
        sp.temperature as f64
    };
    [t, sp.top_k as f64, sp.top_p as f64, u]
}

impl CudaModel {
    /// One greedy decode step for one sequence entirely on the device: returns the argmax token.
    /// Replays a CUDA graph of the whole step when graphs are on (the step's only host syncs are
    /// the metadata upload and reading the sampled token).
    pub fn decode_greedy(
        &mut self,
        seq: SeqId,
        token: u32,
        prof: &mut Option<device::Prof>,
    ) -> Result<u32> {
        self.dec.fed.replace(None);
        let pos = self.seq_len(seq);
        self.kv.check_ring(seq, pos)?;
        self.ensure_pages(seq, pos + 1)?;
        if token as usize >= self.cfg.vocab_size {
            return Err(EngineError::Request(format!(
                "token id {token} is outside the vocabulary"
            )));
        }
        self.upload_meta(&[token as i32], &[pos as i32], &[0], &[seq])?;
        self.dev
            .htod_cached(self.sc.sel, as_bytes(&[0i32]))
            .map_err(cerr)?;
        let use_graph = self.opts.graphs
            && prof.is_none()
            && self.fwd.taps.is_empty()
            && !self.dec.graph_failed;
        if self.dec.graph_tc != self.pass.tc_cap.get() {
            // Captured with another attention_tc grid (the row crossed 8K or 16K keys).
            self.dec.graph = None;
        }
        if use_graph && self.dec.graph.is_none() {
            self.dec.graph_tc = self.pass.tc_cap.get();
            match self.capture_decode() {
                Ok(g) => self.dec.graph = Some(g),
                Err(e) => {
                    tracing::warn!("CUDA graph capture failed, running eagerly: {e}");
                    self.dec.graph_failed = true;
                }
            }
        }
        if use_graph && self.dec.graph.is_some() {
            self.dec.graph.as_ref().unwrap().launch().map_err(cerr)?;
        } else {
            self.decode_body(prof)?;
        }
        let mut out = [0i32];
        self.dev
            .dtoh(as_bytes_mut(&mut out), self.sc.amax)
            .map_err(cerr)?;
        self.kv.note_written(seq, pos + 1);
        self.kv.seqs.get_mut(&seq).unwrap().len = pos + 1;
        Ok(out[0] as u32)
    }

    /// Diagnostic (`laguna bench`): the captured greedy decode graph replayed n times back to
    /// back with the last step's inputs (the same position, its K/V slot rewritten with the same
    /// values; nothing read back in between): ms a replay, None before a graph exists.
    pub fn replay_decode_graph(&self, n: usize) -> Result<Option<f64>> {
        let Some(g) = self.dec.graph.as_ref() else {
            return Ok(None);
        };
        self.dev.sync().map_err(cerr)?;
        let a = self.dev.event().map_err(cerr)?;
        for _ in 0..n {
            g.launch().map_err(cerr)?;
        }
        let b = self.dev.event().map_err(cerr)?;
        b.sync().map_err(cerr)?;
        Ok(Some(a.ms_to(&b) / n.max(1) as f64))
    }

    /// Diagnostic (`laguna bench` under LAGUNA_STAMP): the decode graph replayed three times back
    /// to back with the kernels recording a timeline; the middle replay's launches as a table
    /// (None without a graph or a LAGUNA_STAMP build).
    pub fn decode_timeline(&self) -> Result<Option<String>> {
        let Some(g) = self.dec.graph.as_ref() else {
            return Ok(None);
        };
        if !self.dev.stamping() {
            return Ok(None);
        }
        self.dev.sync().map_err(cerr)?;
        self.dev.stamps_reset().map_err(cerr)?;
        for _ in 0..3 {
            g.launch().map_err(cerr)?;
        }
        self.dev.sync().map_err(cerr)?;
        let recs = self.dev.stamps_take().map_err(cerr)?;
        // LAGUNA_STAMP_OUT=file: every record as CSV (grid, wait ns, end ns, SM, block, function).
        if let Some(p) = &laguna_kernels::env::knobs().stamp_out {
            if let Err(e) = std::fs::write(p, super::stamp::csv(&recs)) {
                tracing::warn!("LAGUNA_STAMP_OUT {}: {e}", p.display());
            }
        }
        let ls = super::stamp::launches(&recs);
        let st = super::stamp::step(&ls, "embed_norm", 1);
        Ok(Some(format!(
            "{} records, {} launches over 3 replays\n\n{}",
            recs.len(),
            ls.len(),
            super::stamp::report(&st)
        )))
    }

    /// `Model::decode_step` on the device: one pass of n rows (one per sequence), the final norm
    /// and lm_head over all of them, `sample_rows`; replayed from a CUDA graph per n when graphs
    /// are on. Host syncs: the metadata/parameter uploads and reading the n tokens. With the
    /// readback ring, the same launch as `decode_launch_dev`, then its collect.
    pub(super) fn decode_step_dev(&mut self, items: &[DecodeItem]) -> Result<Vec<u32>> {
        if !self.dec.pending.is_empty() {
            return Err(EngineError::Other(
                "decode_step while pipelined decode steps are still to be collected".into(),
            ));
        }
        if items.is_empty() {
            return Ok(vec![]);
        }
        if items.iter().any(|it| it.prev.is_some()) {
            return Err(EngineError::Other(
                "decode_step items take their tokens from the host (prev is for decode_launch)"
                    .into(),
            ));
        }
        if self.dev.readback_ring().is_none() {
            self.decode_enqueue(items)?;
            let mut out = vec![0i32; items.len()];
            self.dev
                .dtoh(as_bytes_mut(&mut out), self.sc.amax)
                .map_err(cerr)?;
            return Ok(out.into_iter().map(|t| t as u32).collect());
        }
        self.decode_launch_dev(items)?;
        self.decode_collect_dev()
    }

    /// `Model::decode_launch`: `decode_step`'s launches, the last of them (`decode_advance`)
    /// storing the tokens into a slot of the readback ring; returns without waiting. An item with
    /// `prev = Some(j)` feeds row j of the previous step's tokens: its token id goes up as -1 - j
    /// and `embed` reads it from `sc.amax`, which that step left and nothing has written since
    /// (`fed`). A step whose rows are the previous step's sequences, in the same rows, each fed
    /// its own row, uploads neither tokens nor positions: `decode_advance` left both.
    pub(super) fn decode_launch_dev(&mut self, items: &[DecodeItem]) -> Result<()> {
        let n = items.len();
        if n == 0 {
            return Err(EngineError::Other("decode_launch with no items".into()));
        }
        if self.dev.readback_ring().is_none() {
            return Err(EngineError::Other(
                "decode_launch needs the readback ring (mapped pinned memory), which this device did not give".into(),
            ));
        }
        if n > device::READBACK_BYTES / 4 {
            return Err(EngineError::Other(format!(
                "decode_launch of {n} rows: at most {}",
                device::READBACK_BYTES / 4
            )));
        }
        if self.dec.pending.len() >= device::READBACK_SLOTS - 1 {
            return Err(EngineError::Other(format!(
                "{} pipelined decode steps are already queued: collect one first",
                self.dec.pending.len()
            )));
        }
        if let Some(j) = items.iter().filter_map(|it| it.prev).max() {
            let have = self.dec.fed.borrow().as_ref().map(|f| f.seqs.len());
            if have.is_none_or(|r| j >= r) {
                return Err(EngineError::Other(format!(
                    "a decode item feeds row {j} of the previous step, which left {have:?} rows on the device"
                )));
            }
        }
        let slot = (self.dec.adv_steps % device::READBACK_SLOTS as u64) as usize;
        self.decode_enqueue(items)?;
        let ev = self.dev.marker().map_err(cerr)?;
        self.dec.pending.push_back((slot, n, ev));
        Ok(())
    }

    /// `Model::decode_collect`: wait for the oldest launched step's tokens (not for later ones).
    pub(super) fn decode_collect_dev(&mut self) -> Result<Vec<u32>> {
        let (slot, n, ev) = self.dec.pending.pop_front().ok_or_else(|| {
            EngineError::Other("decode_collect with no decode step launched".into())
        })?;
        let mut out = vec![0i32; n];
        self.dev
            .readback_take(slot, &ev, as_bytes_mut(&mut out))
            .map_err(cerr)?;
        let v = self.cfg.vocab_size;
        out.into_iter()
            .map(|t| {
                if t < 0 || t as usize >= v {
                    Err(EngineError::Other(format!(
                        "the device drew token {t}, outside the vocabulary (size {v})"
                    )))
                } else {
                    Ok(t as u32)
                }
            })
            .collect()
    }

    /// A decode step's checks, uploads and launches (graph replay when graphs are on), its
    /// tokens left in `sc.amax` (and in the readback ring); the sequences' lengths advanced.
    fn decode_enqueue(&mut self, items: &[DecodeItem]) -> Result<()> {
        let n = items.len();
        if n > self.device_sampling() {
            return Err(EngineError::Other(format!(
                "decode_step takes at most {} sequences here, got {n}",
                self.device_sampling()
            )));
        }
        let v = self.cfg.vocab_size;
        let mut tokens = Vec::with_capacity(n);
        let mut pos = Vec::with_capacity(n);
        let mut seqs = Vec::with_capacity(n);
        let mut params = Vec::with_capacity(4 * n);
        for (i, it) in items.iter().enumerate() {
            if it.prev.is_none() && it.token as usize >= v {
                return Err(EngineError::Request(format!(
                    "token id {} is outside the vocabulary (size {v})",
                    it.token
                )));
            }
            if items[..i].iter().any(|o| o.seq == it.seq) {
                return Err(EngineError::Other(format!(
                    "sequence {} appears twice in one decode step",
                    it.seq
                )));
            }
            if !self.kv.seqs.contains_key(&it.seq) {
                return Err(EngineError::Other(format!("unknown sequence {}", it.seq)));
            }
        }
        for it in items {
            let p = self.seq_len(it.seq);
            self.kv.check_ring(it.seq, p)?;
            self.ensure_pages(it.seq, p + 1)?;
            tokens.push(match it.prev {
                Some(j) => -1 - j as i32,
                None => it.token as i32,
            });
            pos.push(p as i32);
            seqs.push(it.seq);
            // Greedy rows ignore the uniform: 0 keeps their parameters unchanged step to step,
            // so an all-greedy step uploads none.
            let u = if it.params.is_greedy() { 0.0 } else { it.u };
            params.extend_from_slice(&sample_params(it.params, u));
        }
        let advance = self.dev.readback_ring().is_some();
        let fed = self.dec.fed.replace(None).is_some_and(|f| {
            advance
                && f.seqs == seqs
                && f.next_pos == pos
                && items.iter().enumerate().all(|(i, it)| it.prev == Some(i))
        });
        let seqrow: Vec<i32> = (0..n as i32).collect();
        self.upload_meta_fed(&tokens, &pos, &seqrow, &seqs, fed)?;
        self.dev
            .htod_cached(self.sc.sel, as_bytes(&seqrow))
            .map_err(cerr)?;
        self.dev
            .htod_cached(self.sc.sparams, as_bytes(&params))
            .map_err(cerr)?;
        // Every row greedy: the tokens by the greedy argmax kernels instead of
        // `sample_rows` (whose greedy rows take the same index, the lowest among the maxima, in
        // one block a row). One graph per (n, greedy).
        let greedy = n <= self.sc.lrows && items.iter().all(|it| it.params.is_greedy());
        let key = (n, greedy, self.pass.tc_cap.get());
        let use_graph = self.opts.graphs && self.fwd.taps.is_empty() && !self.dec.graph_failed;
        if use_graph && !self.dec.step_graphs.contains_key(&key) {
            match self.capture(|m| m.decode_step_body(&mut None, n, greedy)) {
                Ok(g) => {
                    self.dec.step_graphs.insert(key, g);
                }
                Err(e) => {
                    tracing::warn!("CUDA graph capture failed, running eagerly: {e}");
                    self.dec.graph_failed = true;
                }
            }
        }
        match self.dec.step_graphs.get(&key).filter(|_| use_graph) {
            Some(g) => g.launch().map_err(cerr)?,
            None => self.decode_step_body(&mut None, n, greedy)?,
        }
        if advance {
            self.dec.adv_steps += 1;
        }
        for (it, &p) in items.iter().zip(&pos) {
            self.kv.note_written(it.seq, p as usize + 1);
            self.kv.seqs.get_mut(&it.seq).unwrap().len = p as usize + 1;
        }
        self.dec.fed.replace(Some(Fed {
            seqs,
            next_pos: pos.iter().map(|p| p + 1).collect(),
        }));
        Ok(())
    }

    pub(super) fn decode_step_body(
        &self,
        prof: &mut Option<device::Prof>,
        n: usize,
        greedy: bool,
    ) -> Result<()> {
        self.run_layers(n, prof)?;
        if greedy {
            // The rows listed in sc.sel are 0..n (decode_step_dev), so greedy_rows' argmax of
            // logits row i is row i's token, in sc.amax as sample_rows leaves it.
            self.greedy_rows(prof, n, self.sc.amax)?;
        } else {
            self.sample_rows(prof, n)?;
        }
        let Some(ring) = self.dev.readback_ring() else {
            return Ok(());
        };
        let sc = &self.sc;
        self.dev
            .launch_p(
                prof,
                "decode_advance",
                (1, 1, 1),
                (32 * n.div_ceil(32) as u32, 1, 1),
                0,
                |b| {
                    b.i32(n as i32)
                        .u64(sc.amax)
                        .u64(ring)
                        .u64(sc.adv_ctr)
                        .i32(device::READBACK_SLOTS as i32)
                        .i32((device::READBACK_BYTES / 4) as i32)
                        .u64(sc.tokens)
                        .u64(sc.pos);
                },
            )
            .map_err(cerr)
    }

    /// Final norm + lm_head over the rows listed in sc.sel (n of them), then one token per row
    /// drawn by `sample_rows` with the parameters in sc.sparams, into sc.amax.
    pub(super) fn sample_rows(&self, prof: &mut Option<device::Prof>, n: usize) -> Result<()> {
        self.final_logits(prof, n)?;
        self.launch_sample(prof, n)
    }

    /// `sample_rows` over the first n rows of sc.logits with the parameters in sc.sparams.
    pub(super) fn launch_sample(&self, prof: &mut Option<device::Prof>, n: usize) -> Result<()> {
        let sc = &self.sc;
        let per_sm = self
            .dev
            .occupancy("sample_rows_split", select::sample::SPLIT_BLOCK, 0);
        let (name, grid, block) = select::sample::sampler_geom(n, per_sm, self.dev.sms);
        let g = name == "sample_rows_split";
        self.dev
            .launch_p(prof, name, grid, (block, 1, 1), 0, |b| {
                b.u64(sc.logits)
                    .i32(self.cfg.vocab_size as i32)
                    .u64(sc.sparams)
                    .u64(sc.samp_e)
                    .u64(sc.amax);
                if g {
                    b.u64(sc.samp_g);
                }
            })
            .map_err(cerr)
    }

    /// Draw one token from each of the given logits rows with `sample_rows` (device sampling
    /// checks: the rows are uploaded to the logits buffer).
    pub fn sample_logits(
        &self,
        rows: &[&[f32]],
        items: &[(SamplingParams, f64)],
    ) -> Result<Vec<u32>> {
        self.dec.fed.replace(None);
        let n = rows.len();
        let v = self.cfg.vocab_size;
        if n > DECODE_ROWS || v > 1 << 17 || items.len() != n || rows.iter().any(|r| r.len() != v) {
            return Err(EngineError::Other(format!(
                "sample_logits: at most {DECODE_ROWS} rows of {v} logits, one parameter set each"
            )));
        }
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        self.dev
            .htod(self.sc.logits, as_bytes(&flat))
            .map_err(cerr)?;
        let params: Vec<f64> = items
            .iter()
            .flat_map(|(sp, u)| sample_params(sp, *u))
            .collect();
        self.dev
            .htod_staged(self.sc.sparams, as_bytes(&params))
            .map_err(cerr)?;
        self.launch_sample(&mut None, n)?;
        let mut out = vec![0i32; n];
        self.dev
            .dtoh(as_bytes_mut(&mut out), self.sc.amax)
            .map_err(cerr)?;
        Ok(out.into_iter().map(|t| t as u32).collect())
    }

    pub(super) fn decode_body(&self, prof: &mut Option<device::Prof>) -> Result<()> {
        self.run_layers(1, prof)?;
        self.greedy_rows(prof, 1, self.sc.amax)
    }

    pub(super) fn capture_decode(&self) -> std::result::Result<device::Graph, String> {
        self.capture(|m| m.decode_body(&mut None))
    }

    /// The launches of `body` captured as one CUDA graph.
    pub(super) fn capture(
        &self,
        body: impl FnOnce(&Self) -> Result<()>,
    ) -> std::result::Result<device::Graph, String> {
        self.dev.begin_capture()?;
        let r = body(self);
        let g = self.dev.end_capture();
        r.map_err(|e| e.to_string())?;
        g
    }
}
