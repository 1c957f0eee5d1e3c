//! Device-resident greedy DFlash for one sequence (CUDA target + [`CudaDraft`]): the same
//! propose → verify → accept → context steps as [`crate::spec::step`], but the proposals, the
//! target's taps, the verification argmaxes and the acceptance stay on the GPU; the host reads
//! back 2k+2 ints per step and does the bookkeeping (lengths, pages).
//!
//! One step for committed tokens `x[0..T)` (target and draft context hold `0..T-1`), `t = x[T-1]`:
//! The three device segments below are one CUDA graph per k (three graphs with events between
//! them when timing).
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
//! computes every row bit-identically to a 1-row decode step (`laguna device-test` checks both).
use super::draft::CudaDraft;
use super::*;
use crate::generate::{FinishReason, GenerateRequest};
use crate::spec::draft::DraftModel;
use crate::spec::stats::{SpecStats, StepStats};

/// Device time per step segment (CUDA events), summed over `steps` (timing on).
#[derive(Debug, Default, Clone)]
pub struct SpecTimes {
    pub steps: usize,
    pub draft_ms: f64,
    pub verify_ms: f64,
    pub ctx_ms: f64,
    /// Wall time of whole steps (uploads, graphs, read-back, host bookkeeping).
    pub wall_ms: f64,
}

pub struct SpecRun {
    pub completion: Vec<u32>,
    pub finish: FinishReason,
    pub stats: SpecStats,
    pub times: SpecTimes,
    /// Wall time of the prefill (prompt through the target + draft context), ms.
    pub prefill_ms: f64,
}

struct Graphs {
    /// The whole step (propose + verify + context) as one graph: used unless timing.
    step: device::Graph,
    /// The three segments as separate graphs, with events between them when timing.
    propose: device::Graph,
    verify: device::Graph,
    ctx: device::Graph,
}

/// Greedy DFlash driver on the device; keeps one set of CUDA graphs per k.
pub struct CudaSpec {
    graphs: HashMap<usize, Graphs>,
    pub use_graphs: bool,
    /// Record per-segment device times (adds event records between the graphs).
    pub timing: bool,
    /// Per-kernel timing of eager steps (use_graphs = false): propose, verify, context.
    pub prof: Option<[device::Prof; 3]>,
    /// Device buffer of `spec_accept`'s output (allocated on the target's device at first use;
    /// one CudaSpec serves one target).
    accept_buf: u64,
}

impl Default for CudaSpec {
    fn default() -> Self {
        CudaSpec { graphs: HashMap::new(), use_graphs: true, timing: false, prof: None, accept_buf: 0 }
    }
}

impl CudaSpec {
    fn prepare(&mut self, target: &mut CudaModel, draft: &CudaDraft) -> Result<()> {
        crate::spec::enable_taps(target, draft)?;
        target.set_taps_on_device(true)?;
        if self.accept_buf == 0 {
            self.accept_buf = target.dev.alloc(4 * (2 * 32 + 2)).map_err(cerr)?;
        }
        // Logit row lists (prefixes are the same for every k): draft rows 1..=k, target 0..=k;
        // one sequence (seqrow 0). `forward` overwrites these, so this runs after every prefill.
        let n = 16.min(target.sc.lrows).min(draft.m.sc.lrows);
        let drows: Vec<i32> = (1..=n as i32).collect();
        let trows: Vec<i32> = (0..n as i32).collect();
        draft.m.dev.htod(draft.m.sc.sel, as_bytes(&drows)).map_err(cerr)?;
        target.dev.htod(target.sc.sel, as_bytes(&trows)).map_err(cerr)?;
        let zeros = vec![0i32; 16.min(target.sc.rows).min(draft.m.sc.rows)];
        draft.m.dev.htod(draft.m.sc.seqrow, as_bytes(&zeros)).map_err(cerr)?;
        target.dev.htod(target.sc.seqrow, as_bytes(&zeros)).map_err(cerr)?;
        Ok(())
    }

    /// Prompt through the target in passes (taps kept on the device) and each pass's rows into the
    /// draft context; returns the greedy first token.
    fn prefill(&mut self, target: &mut CudaModel, draft: &mut CudaDraft, tseq: SeqId, dseq: SeqId, prompt: &[u32]) -> Result<u32> {
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
                logits: if last { LogitRows::Last } else { LogitRows::None },
            }])?;
            if last {
                first = crate::cpu::ops::argmax(out[0].row(0)) as u32;
            }
            draft.m.ensure_pages(dseq, end)?;
            let bt = draft.m.bt_row(dseq);
            draft.m.dev.htod(draft.m.sc.bt, as_bytes(&bt)).map_err(cerr)?;
            let pos: Vec<i32> = (start..end).map(|p| p as i32).collect();
            draft.m.dev.htod(draft.cpos, as_bytes(&pos)).map_err(cerr)?;
            draft.context_pass(&mut None, target.taps_dev, w, end - start)?;
            draft.set_context_len(dseq, end);
            start = end;
        }
        target.dev.sync().map_err(cerr)?;
        self.prepare(target, draft)?;
        Ok(first)
    }

    fn propose_body(target: &CudaModel, draft: &CudaDraft, k: usize, prof: &mut Option<device::Prof>) -> Result<()> {
        draft.m.run_layers(k + 1, prof)?;
        draft.m.greedy_rows(prof, k, target.sc.tokens + 4)
    }
    fn verify_body(target: &CudaModel, k: usize, out: u64, prof: &mut Option<device::Prof>) -> Result<()> {
        target.run_layers_taps_dev(k + 1, prof)?;
        target.greedy_rows(prof, k + 1, target.sc.amax)?;
        target
            .dev
            .launch_p(prof, "spec_accept", (1, 1, 1), (32, 1, 1), 0, |b| {
                b.u64(target.sc.tokens).u64(target.sc.amax).i32(k as i32).u64(out);
            })
            .map_err(cerr)
    }
    fn ctx_body(target: &CudaModel, draft: &CudaDraft, k: usize, prof: &mut Option<device::Prof>) -> Result<()> {
        let w = draft.config().num_taps() * target.cfg.hidden_size;
        draft.context_pass(prof, target.taps_dev, w, k + 1)
    }

    fn capture(target: &CudaModel, draft: &CudaDraft, k: usize, out: u64) -> std::result::Result<Graphs, String> {
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
                Self::propose_body(target, draft, k, &mut None)?;
                Self::verify_body(target, k, out, &mut None)?;
                Self::ctx_body(target, draft, k, &mut None)
            })?,
            propose: one(&|| Self::propose_body(target, draft, k, &mut None))?,
            verify: one(&|| Self::verify_body(target, k, out, &mut None))?,
            ctx: one(&|| Self::ctx_body(target, draft, k, &mut None))?,
        })
    }

    /// One propose + verify + accept + context step with k drafts; returns (accepted a, the a + 1
    /// emitted tokens, the k drafts).
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        target: &mut CudaModel,
        draft: &mut CudaDraft,
        tseq: SeqId,
        dseq: SeqId,
        t: u32,
        tlen: usize,
        k: usize,
        times: &mut SpecTimes,
    ) -> Result<(usize, Vec<u32>, Vec<u32>)> {
        let t0 = std::time::Instant::now();
        // Committed positions 0..tlen-1 hold K/V; this step's rows sit at tlen-1 ..= tlen-1+k.
        let p0 = tlen - 1;
        target.ensure_pages(tseq, p0 + k + 1)?;
        draft.m.ensure_pages(dseq, p0 + k + 1)?;
        let mask = draft.config().mask_token_id as i32;
        let mut dt = vec![mask; k + 1];
        dt[0] = t as i32;
        let pos: Vec<i32> = (0..=k).map(|i| (p0 + i) as i32).collect();
        let dm = &draft.m;
        dm.dev.htod(dm.sc.tokens, as_bytes(&dt)).map_err(cerr)?;
        dm.dev.htod(dm.sc.pos, as_bytes(&pos)).map_err(cerr)?;
        dm.dev.htod(draft.cpos, as_bytes(&pos)).map_err(cerr)?;
        dm.dev.htod(dm.sc.bt, as_bytes(&dm.bt_row(dseq))).map_err(cerr)?;
        if dm.noncausal {
            let ke = vec![(p0 + k + 1) as i32; k + 1];
            dm.dev.htod(dm.sc.kend, as_bytes(&ke)).map_err(cerr)?;
        }
        target.dev.htod(target.sc.tokens, as_bytes(&[t as i32])).map_err(cerr)?;
        target.dev.htod(target.sc.pos, as_bytes(&pos)).map_err(cerr)?;
        target.dev.htod(target.sc.bt, as_bytes(&target.bt_row(tseq))).map_err(cerr)?;

        if self.use_graphs && !self.graphs.contains_key(&k) {
            match Self::capture(target, draft, k, self.accept_buf) {
                Ok(g) => {
                    self.graphs.insert(k, g);
                }
                Err(e) => {
                    tracing::warn!("CUDA graph capture of the DFlash step failed, running eagerly: {e}");
                    self.use_graphs = false;
                }
            }
        }
        let ev = |on: bool| -> Result<Option<device::Event>> { if on { target.dev.event().map(Some).map_err(cerr) } else { Ok(None) } };
        let e0 = ev(self.timing)?;
        match self.graphs.get(&k).filter(|_| self.use_graphs) {
            Some(g) if !self.timing => g.step.launch().map_err(cerr)?,
            Some(g) => {
                g.propose.launch().map_err(cerr)?;
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
                Self::propose_body(target, draft, k, &mut ps[0])?;
                let e1 = ev(self.timing)?;
                Self::verify_body(target, k, self.accept_buf, &mut ps[1])?;
                let e2 = ev(self.timing)?;
                Self::ctx_body(target, draft, k, &mut ps[2])?;
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
        // [a, d_1..d_a, g_a, .., drafts at k + 2]: the only read-back of the step.
        let mut out = vec![0i32; 2 * k + 2];
        target.dev.dtoh(as_bytes_mut(&mut out), self.accept_buf).map_err(cerr)?;
        times.steps += 1;
        times.wall_ms += t0.elapsed().as_secs_f64() * 1e3;
        let a = out[0] as usize;
        if a > k {
            return Err(EngineError::Other(format!("device acceptance returned {a} > k = {k}")));
        }
        let emitted = out[1..a + 2].iter().map(|&x| x as u32).collect();
        let drafts = out[k + 2..2 * k + 2].iter().map(|&x| x as u32).collect();
        Ok((a, emitted, drafts))
    }

    /// Greedy speculative generation of one request on the device (`req.sampling` is ignored:
    /// greedy). Token-identical to greedy decoding without the draft.
    pub fn generate(&mut self, target: &mut CudaModel, draft: &mut CudaDraft, req: &GenerateRequest, k: usize, keep_history: bool) -> Result<SpecRun> {
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
    ) -> Result<SpecRun> {
        let max_pos = target.cfg.max_position_embeddings;
        let t0 = std::time::Instant::now();
        let first = self.prefill(target, draft, tseq, dseq, &req.prompt)?;
        let prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut tokens = req.prompt.clone();
        let mut completion = vec![];
        let mut stats = SpecStats::with_k(k);
        let mut times = SpecTimes::default();
        let mut finish = FinishReason::Length;
        let cfg = target.cfg.clone();
        let stop = |tok: u32| (!req.ignore_eos && cfg.is_eos(tok)) || req.stop_token_ids.contains(&tok);
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
            let (a, emitted, d) = self.step(target, draft, tseq, dseq, t, tlen, ke, &mut times)?;
            // Target K/V: rows tlen-1 ..= tlen-1+a are committed; the draft context likewise.
            target.seqs.get_mut(&tseq).expect("live").len = tlen + ke;
            target.truncate(tseq, tlen + a);
            draft.set_context_len(dseq, tlen + ke);
            draft.truncate(dseq, tlen + a);
            let st = StepStats { num_draft_tokens: ke, num_accepted_tokens: a };
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
        drop(push);
        Ok(SpecRun { completion, finish, stats, times, prefill_ms })
    }
}
