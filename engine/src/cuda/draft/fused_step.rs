//! Device-resident greedy DFlash (CUDA target + [`CudaDraft`]) for a batch of sequences: the same
//! propose → verify → accept → context steps as [`crate::spec::step`], but the proposals, the
//! target's taps, the verification argmaxes and the acceptance stay on the GPU; the host reads
//! back 2k+2 ints per sequence and step and does the bookkeeping (lengths, pages). Sequence b's
//! rows sit at b*(k+1) ..= b*(k+1)+k of both passes.
//!
//! One step for a sequence with committed tokens `x[0..T)` (target and draft context hold
//! `0..T-1`), `t = x[T-1]`; the device segments are one CUDA graph per (k, batch, the target's
//! `attention_decode_tc` grid, `tc_grid`) (three graphs with events between them when timing):
//! 1. propose: draft forward over `[t, mask x k]` at `T-1..T-1+k`, final norm +
//!    shared lm_head + argmax of rows 1..k written straight into the target's token slots 1..k;
//! 2. verify: target forward over `[t, d_1..d_k]` with the taps copied to a device
//!    buffer, argmax of all k+1 rows;
//! 3. context: the draft's context K/V for all k+1 verified rows at `T-1..T-1+k`.
//!    Rows past the accepted ones are garbage but never read: the draft's length becomes `T+a`
//!    and the next block (at `T+a..`) overwrites them before any query can see them (the same
//!    holds for the target's K/V of rejected rows);
//! 4. accept (end of the verify segment, `spec_accept`): the longest prefix `a` of drafts equal to
//!    the target's argmaxes, the emitted `d_1..d_a, g_a` (bonus token) and the drafts, in one small
//!    device buffer; the host reads it back (the step's only read-back), sets the target length
//!    to `T+a` and the draft context to `T+a` (K/V of rejected rows stay where they are and are
//!    overwritten by the next step before anything reads them: no K/V moves).
//!
//! Greedy output is token-identical to plain greedy decoding when the target's k+1-row verify
//! computes every row bit-identically to a 1-row decode step (`laguna-dev device-test` checks both).
use super::CudaDraft;
use crate::cuda::{as_bytes, as_bytes_mut, cerr, device, CudaModel};
use crate::error::{EngineError, Result};
use crate::generate::{FinishReason, GenerateRequest};
use crate::model::{LogitRows, Model, SeqId, StepInput};
use crate::spec::draft::DraftModel;
use crate::spec::stats::{SpecStats, StepStats};
use std::collections::HashMap;

/// What a device step returns per sequence: (accepted a, the a + 1 emitted tokens, the k drafts).
pub type Accepted = (usize, Vec<u32>, Vec<u32>);

/// Rows per device DFlash step (all sequences): the weight-streaming regime's limit.
const MAX_ROWS: usize = 31;

/// One sequence of a device DFlash step: target and draft sequences, the last committed token
/// `t` and the number of committed tokens (target K/V and draft context hold `tlen - 1`).
#[derive(Debug, Clone, Copy)]
pub struct SeqStep {
    pub tseq: SeqId,
    pub dseq: SeqId,
    pub t: u32,
    pub tlen: usize,
}

/// Device time per step segment (CUDA events), summed over `steps` (timing on).
#[derive(Debug, Default, Clone)]
pub struct FusedTimes {
    pub steps: usize,
    pub draft_ms: f64,
    pub verify_ms: f64,
    pub ctx_ms: f64,
    /// Wall time of whole steps (uploads, graphs, read-back, host bookkeeping).
    pub wall_ms: f64,
}

pub struct FusedRun {
    pub completion: Vec<u32>,
    pub finish: FinishReason,
    pub stats: SpecStats,
    pub times: FusedTimes,
    /// Wall time of the prefill (prompt through the target + draft context), ms.
    pub prefill_ms: f64,
}

struct Graphs {
    /// The whole step (propose + verify + context) as one graph: used unless timing.
    step: device::Graph,
    /// The three segments as separate graphs, with events between them when timing.
    /// None at k = 0 (no draft forward: nothing to capture).
    propose: Option<device::Graph>,
    verify: device::Graph,
    ctx: device::Graph,
}

/// Greedy DFlash driver on the device; keeps one set of CUDA graphs per (k, batch, the target's
/// `attention_decode_tc` grid).
pub struct FusedStep {
    graphs: HashMap<(usize, usize, usize, bool), Graphs>,
    pub use_graphs: bool,
    /// Record per-segment device times (adds event records between the graphs).
    pub timing: bool,
    /// Per-kernel timing of eager steps (use_graphs = false): propose, verify, context.
    pub prof: Option<[device::Prof; 3]>,
    /// Device buffer of `spec_accept`'s output (allocated on the target's device at first use;
    /// one FusedStep serves one target).
    accept_buf: u64,
    /// The acceptance oracle's proposals (`step_batch`'s `oracle`), copied into the target's token
    /// slots after the draft's own scatter, so the draft forward and its argmax still run.
    oracle_buf: u64,
}

impl Default for FusedStep {
    fn default() -> Self {
        FusedStep {
            graphs: HashMap::new(),
            use_graphs: true,
            timing: false,
            prof: None,
            accept_buf: 0,
            oracle_buf: 0,
        }
    }
}

impl FusedStep {
    pub(super) fn prepare(&mut self, target: &mut CudaModel, draft: &CudaDraft) -> Result<()> {
        crate::spec::enable_taps(target, draft)?;
        target.set_taps_on_device(true)?;
        if self.accept_buf == 0 {
            self.accept_buf = target
                .dev
                .alloc(4 * MAX_ROWS * (2 * MAX_ROWS + 2))
                .map_err(cerr)?;
        }
        if self.oracle_buf == 0 {
            self.oracle_buf = target.dev.alloc(4 * MAX_ROWS).map_err(cerr)?;
        }
        Ok(())
    }

    /// Prompt through the target in passes (taps kept on the device) and each pass's rows into the
    /// draft context; returns the greedy first token.
    fn prefill(
        &mut self,
        target: &mut CudaModel,
        draft: &mut CudaDraft,
        tseq: SeqId,
        dseq: SeqId,
        prompt: &[u32],
    ) -> Result<u32> {
        let chunk = target.sc.rows.min(draft.max_rows());
        let w = draft.config().num_taps() * target.cfg.hidden_size;
        let mut start = 0;
        let mut first = 0u32;
        while start < prompt.len() {
            let end = (start + chunk).min(prompt.len());
            let last = end == prompt.len();
            let out = target.forward(&[StepInput {
                seq: tseq,
                tokens: &prompt[start..end],
                start_pos: start,
                logits: if last {
                    LogitRows::Last
                } else {
                    LogitRows::None
                },
            }])?;
            if last {
                first = crate::sample::argmax(out[0].row(0)) as u32;
            }
            draft.m.ensure_pages(dseq, end)?;
            draft.m.upload_tables(&[dseq])?;
            let pos: Vec<i32> = (start..end).map(|p| p as i32).collect();
            draft.m.dev.htod(draft.cpos, as_bytes(&pos)).map_err(cerr)?;
            draft
                .m
                .dev
                .htod(draft.cseq, as_bytes(&vec![0i32; end - start]))
                .map_err(cerr)?;
            draft.context_pass(&mut None, target.fwd.taps_dev, w, end - start)?;
            draft.m.kv.note_written(dseq, end);
            draft.set_context_len(dseq, end);
            start = end;
        }
        target.dev.sync().map_err(cerr)?;
        self.prepare(target, draft)?;
        Ok(first)
    }

    // Rows of sequence b sit at b*(k+1) ..= b*(k+1)+k in both passes. With `oracle` (a device
    // buffer of nb*(k+1) tokens) the oracle's rows replace the draft's after its scatter. k = 0
    // (a plain decode step that keeps the draft's context) runs no draft.
    fn propose_body(
        target: &CudaModel,
        draft: &CudaDraft,
        k: usize,
        nb: usize,
        oracle: Option<u64>,
        prof: &mut Option<device::Prof>,
    ) -> Result<()> {
        if k == 0 {
            return Ok(());
        }
        Self::draft_body(target, draft, k, nb, prof)?;
        if let Some(src) = oracle {
            target
                .dev
                .dtod(target.sc.tokens, src, 4 * nb * (k + 1))
                .map_err(cerr)?;
        }
        Ok(())
    }
    fn draft_body(
        target: &CudaModel,
        draft: &CudaDraft,
        k: usize,
        nb: usize,
        prof: &mut Option<device::Prof>,
    ) -> Result<()> {
        draft.m.run_layers(nb * (k + 1), prof)?;
        // Argmaxes of the mask rows (sel lists them) land in the draft's amax, then in the
        // target's token slots b*(k+1)+1.. .
        draft.m.greedy_rows(prof, nb * k, draft.m.sc.amax)?;
        draft
            .m
            .dev
            .launch_p(
                prof,
                "scatter_drafts",
                (1, 1, 1),
                ((nb * k).div_ceil(32) as u32 * 32, 1, 1),
                0,
                |b| {
                    b.u64(draft.m.sc.amax)
                        .u64(target.sc.tokens)
                        .i32(nb as i32)
                        .i32(k as i32);
                },
            )
            .map_err(cerr)
    }
    fn verify_body(
        target: &CudaModel,
        k: usize,
        nb: usize,
        out: u64,
        prof: &mut Option<device::Prof>,
    ) -> Result<()> {
        target.run_layers_taps_dev(nb * (k + 1), prof)?;
        target.greedy_rows(prof, nb * (k + 1), target.sc.amax)?;
        target
            .dev
            .launch_p(prof, "spec_accept", (1, 1, 1), (32, 1, 1), 0, |b| {
                b.u64(target.sc.tokens)
                    .u64(target.sc.amax)
                    .i32(k as i32)
                    .i32(nb as i32)
                    .u64(out);
            })
            .map_err(cerr)
    }
    fn ctx_body(
        target: &CudaModel,
        draft: &CudaDraft,
        k: usize,
        nb: usize,
        prof: &mut Option<device::Prof>,
    ) -> Result<()> {
        let w = draft.config().num_taps() * target.cfg.hidden_size;
        draft.context_pass(prof, target.fwd.taps_dev, w, nb * (k + 1))
    }

    fn capture(
        target: &CudaModel,
        draft: &CudaDraft,
        k: usize,
        nb: usize,
        out: u64,
        oracle: Option<u64>,
    ) -> std::result::Result<Graphs, String> {
        let dev = &target.dev;
        let one = |f: &dyn Fn() -> Result<()>| -> std::result::Result<device::Graph, String> {
            dev.begin_capture()?;
            let r = f();
            let g = dev.end_capture();
            r.map_err(|e| e.to_string())?;
            g
        };
        Ok(Graphs {
            step: one(&|| {
                Self::propose_body(target, draft, k, nb, oracle, &mut None)?;
                Self::verify_body(target, k, nb, out, &mut None)?;
                Self::ctx_body(target, draft, k, nb, &mut None)
            })?,
            propose: match k {
                0 => None,
                _ => Some(one(&|| {
                    Self::propose_body(target, draft, k, nb, oracle, &mut None)
                })?),
            },
            verify: one(&|| Self::verify_body(target, k, nb, out, &mut None))?,
            ctx: one(&|| Self::ctx_body(target, draft, k, nb, &mut None))?,
        })
    }

    /// Whether a batch of `nb` sequences with k drafts each fits one weight-streaming pass (rows
    /// bit-identical to 1-row decode steps) and this driver's buffers.
    pub fn fits(target: &CudaModel, draft: &CudaDraft, k: usize, nb: usize) -> bool {
        let rows = nb * (k + 1);
        nb >= 1
            && rows <= MAX_ROWS
            && rows < target.opts.gemm_min_rows
            && rows <= target.sc.rows.min(draft.m.sc.rows).min(target.sc.lrows).min(draft.m.sc.lrows)
            && nb <= target.sc.bt_seqs.min(draft.m.sc.bt_seqs)
            // k + 1 rows per sequence write K/V past the committed length: within the rings' spare slots.
            && target.ring_spare().is_none_or(|s| k <= s)
            && draft.m.ring_spare().is_none_or(|s| k <= s)
    }

    /// One propose + verify + accept + context step for `seqs` (k drafts each, all on the device,
    /// one read-back); returns per sequence (accepted a, the a + 1 emitted tokens, the k drafts).
    /// `oracle`: nb x k proposals that replace the draft's (the acceptance oracle). k = 0 is a
    /// decode step that writes the draft's context. Callers check [`FusedStep::fits`] and call
    /// [`FusedStep::prepare`] (via `generate` or `fused_step`) first.
    pub(super) fn step_batch(
        &mut self,
        target: &mut CudaModel,
        draft: &mut CudaDraft,
        seqs: &[SeqStep],
        k: usize,
        oracle: Option<&[u32]>,
        times: &mut FusedTimes,
    ) -> Result<Vec<Accepted>> {
        // This step's argmaxes overwrite sc.amax: no pipelined decode step may feed from it.
        target.dec.fed.replace(None);
        let t0 = std::time::Instant::now();
        let nb = seqs.len();
        if !Self::fits(target, draft, k, nb) {
            return Err(EngineError::Other(format!(
                "{nb} sequences x {} rows do not fit one device DFlash step",
                k + 1
            )));
        }
        let mask = draft.config().mask_token_id as i32;
        let (mut dt, mut tt, mut pos, mut seqrow, mut kend) =
            (vec![], vec![], vec![], vec![], vec![]);
        let (mut dseqs, mut tseqs) = (vec![], vec![]);
        let (mut dsel, mut tsel) = (vec![], vec![]);
        for (b, q) in seqs.iter().enumerate() {
            // Committed positions 0..tlen-1 hold K/V; this sequence's rows sit at tlen-1 ..= tlen-1+k.
            let p0 = q.tlen - 1;
            target.kv.check_ring(q.tseq, p0)?;
            draft.m.kv.check_ring(q.dseq, p0)?;
            target.ensure_pages(q.tseq, p0 + k + 1)?;
            draft.m.ensure_pages(q.dseq, p0 + k + 1)?;
            for i in 0..=k {
                dt.push(if i == 0 { q.t as i32 } else { mask });
                tt.push(if i == 0 { q.t as i32 } else { 0 });
                pos.push((p0 + i) as i32);
                seqrow.push(b as i32);
                kend.push((p0 + k + 1) as i32);
                tsel.push((b * (k + 1) + i) as i32);
                if i > 0 {
                    dsel.push((b * (k + 1) + i) as i32);
                }
            }
            dseqs.push(q.dseq);
            tseqs.push(q.tseq);
        }
        let dm = &draft.m;
        let up = |dst: u64, v: &[i32]| dm.dev.htod_staged(dst, as_bytes(v)).map_err(cerr);
        up(dm.sc.tokens, &dt)?;
        up(dm.sc.pos, &pos)?;
        dm.set_tc_cap(&pos);
        up(dm.sc.seqrow, &seqrow)?;
        up(draft.cpos, &pos)?;
        up(draft.cseq, &seqrow)?;
        dm.upload_tables(&dseqs)?;
        dm.pass.staged.set(false);
        dm.pass.solo.set(false);
        up(dm.sc.sel, &dsel)?;
        if dm.fwd.noncausal {
            up(dm.sc.kend, &kend)?;
        }
        up(target.sc.tokens, &tt)?;
        up(target.sc.pos, &pos)?;
        target.set_tc_cap(&pos);
        up(target.sc.seqrow, &seqrow)?;
        target.upload_tables(&tseqs)?;
        target.pass.staged.set(false);
        target.pass.solo.set(false);
        up(target.sc.sel, &tsel)?;
        let obuf = match oracle {
            Some(d) => {
                if d.len() != nb * k {
                    return Err(EngineError::Other(format!(
                        "oracle gave {} proposals for {nb} sequences x k = {k}",
                        d.len()
                    )));
                }
                let rows: Vec<i32> = seqs
                    .iter()
                    .enumerate()
                    .flat_map(|(b, q)| {
                        std::iter::once(q.t as i32)
                            .chain(d[b * k..(b + 1) * k].iter().map(|&x| x as i32))
                    })
                    .collect();
                up(self.oracle_buf, &rows)?;
                Some(self.oracle_buf)
            }
            None => None,
        };

        // One set of graphs per (k, batch, the target's attention_tc grid, oracle).
        let key = (k, nb, target.pass.tc_cap.get(), obuf.is_some());
        if self.use_graphs && !self.graphs.contains_key(&key) {
            match Self::capture(target, draft, k, nb, self.accept_buf, obuf) {
                Ok(g) => {
                    self.graphs.insert(key, g);
                }
                Err(e) => {
                    tracing::warn!(
                        "CUDA graph capture of the DFlash step failed, running eagerly: {e}"
                    );
                    self.use_graphs = false;
                }
            }
        }
        let ev = |on: bool| -> Result<Option<device::Event>> {
            if on {
                target.dev.event().map(Some).map_err(cerr)
            } else {
                Ok(None)
            }
        };
        let e0 = ev(self.timing)?;
        match self.graphs.get(&key).filter(|_| self.use_graphs) {
            Some(g) if !self.timing => g.step.launch().map_err(cerr)?,
            Some(g) => {
                if let Some(p) = &g.propose {
                    p.launch().map_err(cerr)?;
                }
                let e1 = ev(self.timing)?;
                g.verify.launch().map_err(cerr)?;
                let e2 = ev(self.timing)?;
                g.ctx.launch().map_err(cerr)?;
                let e3 = ev(self.timing)?;
                if let (Some(a), Some(b), Some(c), Some(d)) = (&e0, &e1, &e2, &e3) {
                    d.sync().map_err(cerr)?;
                    times.draft_ms += a.ms_to(b);
                    times.verify_ms += b.ms_to(c);
                    times.ctx_ms += c.ms_to(d);
                }
            }
            None => {
                let mut ps: [Option<device::Prof>; 3] = match self.prof.take() {
                    Some([a, b, c]) => [Some(a), Some(b), Some(c)],
                    None => [None, None, None],
                };
                Self::propose_body(target, draft, k, nb, obuf, &mut ps[0])?;
                let e1 = ev(self.timing)?;
                Self::verify_body(target, k, nb, self.accept_buf, &mut ps[1])?;
                let e2 = ev(self.timing)?;
                Self::ctx_body(target, draft, k, nb, &mut ps[2])?;
                if let [Some(a), Some(b), Some(c)] = ps {
                    self.prof = Some([a, b, c]);
                }
                let e3 = ev(self.timing)?;
                if let (Some(a), Some(b), Some(c), Some(d)) = (&e0, &e1, &e2, &e3) {
                    d.sync().map_err(cerr)?;
                    times.draft_ms += a.ms_to(b);
                    times.verify_ms += b.ms_to(c);
                    times.ctx_ms += c.ms_to(d);
                }
            }
        }
        // Per sequence [a, d_1..d_a, g_a, .., drafts at k + 2]: the only read-back of the step.
        let w = 2 * k + 2;
        let mut out = vec![0i32; nb * w];
        target
            .dev
            .dtoh(as_bytes_mut(&mut out), self.accept_buf)
            .map_err(cerr)?;
        times.steps += 1;
        times.wall_ms += t0.elapsed().as_secs_f64() * 1e3;
        let mut res = Vec::with_capacity(nb);
        for (b, q) in seqs.iter().enumerate() {
            let o = &out[b * w..(b + 1) * w];
            let a = o[0] as usize;
            if a > k {
                return Err(EngineError::Other(format!(
                    "device acceptance returned {a} > k = {k}"
                )));
            }
            // Target K/V: rows tlen-1 ..= tlen-1+a are committed; the draft context likewise.
            target.kv.note_written(q.tseq, q.tlen + k);
            draft.m.kv.note_written(q.dseq, q.tlen + k);
            target.kv.seqs.get_mut(&q.tseq).expect("live").len = q.tlen + k;
            target.truncate(q.tseq, q.tlen + a);
            draft.set_context_len(q.dseq, q.tlen + k);
            draft.truncate(q.dseq, q.tlen + a);
            res.push((
                a,
                o[1..a + 2].iter().map(|&x| x as u32).collect(),
                o[k + 2..2 * k + 2].iter().map(|&x| x as u32).collect(),
            ));
        }
        Ok(res)
    }

    /// Greedy speculative generation of one request on the device (`req.sampling` is ignored:
    /// greedy). Token-identical to greedy decoding without the draft.
    pub fn generate(
        &mut self,
        target: &mut CudaModel,
        draft: &mut CudaDraft,
        req: &GenerateRequest,
        k: usize,
        keep_history: bool,
    ) -> Result<FusedRun> {
        draft.config().check_k(k)?;
        crate::generate::check_prompt(target, &req.prompt)?;
        self.prepare(target, draft)?;
        let tseq = target.new_seq()?;
        let dseq = match draft.new_seq() {
            Ok(s) => s,
            Err(e) => {
                target.free_seq(tseq);
                return Err(e);
            }
        };
        let r = self.generate_inner(target, draft, req, k, keep_history, tseq, dseq);
        target.free_seq(tseq);
        draft.free_seq(dseq);
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn generate_inner(
        &mut self,
        target: &mut CudaModel,
        draft: &mut CudaDraft,
        req: &GenerateRequest,
        k: usize,
        keep_history: bool,
        tseq: SeqId,
        dseq: SeqId,
    ) -> Result<FusedRun> {
        let max_pos = target.cfg.max_position_embeddings;
        let t0 = std::time::Instant::now();
        let first = self.prefill(target, draft, tseq, dseq, &req.prompt)?;
        let prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut tokens = req.prompt.clone();
        let mut completion = vec![];
        let mut stats = SpecStats::with_k(k);
        let mut times = FusedTimes::default();
        let mut finish = FinishReason::Length;
        let cfg = target.cfg.clone();
        let stop =
            |tok: u32| (!req.ignore_eos && cfg.is_eos(tok)) || req.stop_token_ids.contains(&tok);
        let mut push = |tok: u32, completion: &mut Vec<u32>, tokens: &mut Vec<u32>| -> bool {
            tokens.push(tok);
            completion.push(tok);
            if stop(tok) {
                finish = FinishReason::Stop;
                return true;
            }
            completion.len() >= req.max_tokens
        };
        stats.num_emitted_tokens += 1;
        let mut done = req.max_tokens == 0 || push(first, &mut completion, &mut tokens);
        while !done {
            let tlen = tokens.len();
            let ke = k.min(max_pos.saturating_sub(tlen));
            if ke == 0 {
                break;
            }
            let t = *tokens.last().expect("non-empty");
            let (a, emitted, d) = self
                .step_batch(
                    target,
                    draft,
                    &[SeqStep {
                        tseq,
                        dseq,
                        t,
                        tlen,
                    }],
                    ke,
                    None,
                    &mut times,
                )?
                .remove(0);
            let st = StepStats {
                num_draft_tokens: ke,
                num_accepted_tokens: a,
            };
            stats.observe(&st);
            stats.num_emitted_tokens += a as u64 + 1;
            if keep_history {
                stats.acceptance_lengths.push(a);
                stats.proposals.push(d.clone());
            }
            for &tok in &emitted {
                if push(tok, &mut completion, &mut tokens) {
                    done = true;
                    break;
                }
            }
        }
        Ok(FusedRun {
            completion,
            finish,
            stats,
            times,
            prefill_ms,
        })
    }
}
