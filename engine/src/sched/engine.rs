//! The engine thread: owns the model, runs continuous batching.
//!
//! Each step: take new submissions, drop cancelled sequences (freeing their KV), admit waiting
//! requests up to `max_num_seqs`, then build one batch: a decode row (or a draft block, with a spec
//! driver) for every running sequence that has output, then prefill chunks of the others, so the
//! step's token total stays within `max_num_batched_tokens`. After the forward, each sequence
//! samples with its own RNG and emits 1..=k+1 tokens.
use super::metrics::MetricsSnapshot;
use super::prefix_cache::PrefixCache;
use super::spec_hook::{verify, SpecDriver};
use super::stream::{ABORTED, LIVE, STOPPED};
use super::types::{EngineEvent, FinishReason, GenRequest, Health, TokenLogprob};
use crate::grammar::Constraint;
use crate::model::{DecodeItem, LogitRows, Model, SeqId, StepInput};
use crate::sample::{log_softmax, sample, uniform_for, Rng};
use crate::spec::{DraftModel, SpecState};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

mod cache;
use cache::prefill_cut;

#[derive(Debug, Clone, PartialEq)]
pub struct SchedConfig {
    /// Most sequences decoding at once.
    pub max_num_seqs: usize,
    /// Most token rows in one forward step (decode rows + prefill chunks).
    pub max_num_batched_tokens: usize,
    /// Prompt + output limit per sequence.
    pub max_model_len: usize,
    /// Most requests queued behind the running ones before `submit` answers `Overloaded` (0: no limit).
    pub max_waiting: usize,
    /// Reuse the K/V of earlier requests' prefixes (`sched::prefix_cache`; vLLM's
    /// `enable_prefix_caching`). Off, or a backend without a `PrefixStore`, prefills every prompt.
    pub prefix_cache: bool,
    /// With the prefix cache: also snapshot a prompt's prefill every this many tokens (0: only at
    /// the end of each prompt and each output).
    pub prefix_snapshot_every: usize,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            max_num_seqs: 32,
            max_num_batched_tokens: 2048,
            max_model_len: 4096,
            max_waiting: 0,
            prefix_cache: true,
            prefix_snapshot_every: 8192,
        }
    }
}

/// DFlash speculative decoding: the draft model and its k. With it, every step runs through
/// `crate::spec::step` (draft propose, target verify, rollback, draft context) and a sequence
/// emits 1..=k+1 tokens per step. With `costs` (adaptive k) each sequence carries a
/// `SpecController` over this step-time table and k is the largest it may choose.
pub struct Dflash {
    pub draft: Box<dyn DraftModel>,
    pub k: usize,
    pub costs: Option<std::sync::Arc<crate::spec::StepCosts>>,
}

pub(crate) struct Submission {
    pub req: GenRequest,
    pub tx: UnboundedSender<EngineEvent>,
    pub cancel: Arc<AtomicU8>,
    pub arrival: Instant,
}

pub(crate) enum Msg {
    Submit(Box<Submission>),
    Wake,
}

pub(crate) struct Shared {
    pub health: Mutex<Health>,
    pub metrics: Mutex<MetricsSnapshot>,
    /// Submitted but not yet admitted.
    pub queued: AtomicUsize,
    pub vocab_size: AtomicUsize,
}

struct Running {
    sub: Submission,
    seq: SeqId,
    /// Prompt followed by the output so far.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Positions whose K/V the model holds.
    computed: usize,
    rng: Rng,
    first_token: Option<Instant>,
    /// DFlash state (owns the target and draft sequences) when a draft is loaded.
    spec: Option<SpecState>,
    /// Prefix cache: keys of the sequence's blocks 0.. in the cache (restored or exported; pinned).
    pins: Vec<u64>,
    /// Prefix cache: the position of the sequence's last snapshot (0: none).
    saved_at: usize,
    /// The request's grammar (without DFlash; with it, `spec` holds it).
    grammar: Option<Constraint>,
}

impl Running {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
    fn constrained(&self) -> bool {
        self.grammar.is_some() || self.spec.as_ref().is_some_and(|s| s.constraint.is_some())
    }
}

/// One sequence's share of a step.
struct Planned {
    idx: usize,
    rows: Vec<u32>,
    start: usize,
    logits: LogitRows,
    drafts: Vec<u32>,
}

pub(crate) struct Engine {
    pub cfg: SchedConfig,
    pub model: Box<dyn Model>,
    pub spec: Option<Box<dyn SpecDriver>>,
    pub dflash: Option<Dflash>,
    pub inbox: mpsc::Receiver<Msg>,
    pub shared: Arc<Shared>,
    waiting: VecDeque<Submission>,
    running: Vec<Running>,
    /// A pipelined decode step launched and not yet collected: its sequences, in row order.
    inflight: Option<Vec<SeqId>>,
    /// The prefix cache's index (None: off, or the backend has no `PrefixStore`).
    cache: Option<PrefixCache>,
}

impl Engine {
    pub fn new(
        cfg: SchedConfig,
        mut model: Box<dyn Model>,
        spec: Option<Box<dyn SpecDriver>>,
        dflash: Option<Dflash>,
        inbox: mpsc::Receiver<Msg>,
        shared: Arc<Shared>,
    ) -> Engine {
        if let Some(s) = &spec {
            model.set_taps(&s.taps());
        }
        Engine {
            cfg,
            model,
            spec,
            dflash,
            inbox,
            shared,
            waiting: VecDeque::new(),
            running: vec![],
            inflight: None,
            cache: None,
        }
        .with_prefix_cache()
    }

    pub fn run(mut self) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                self.publish_gauges();
                match self.inbox.recv() {
                    Ok(m) => self.take(m),
                    Err(_) => return,
                }
            }
            while let Ok(m) = self.inbox.try_recv() {
                self.take(m);
            }
            self.reap_cancelled();
            self.admit();
            self.publish_gauges();
            if !self.running.is_empty() {
                self.step();
                self.cache_checkpoints();
            }
        }
    }

    fn take(&mut self, m: Msg) {
        if let Msg::Submit(s) = m {
            self.waiting.push_back(*s);
        }
    }

    fn publish_gauges(&self) {
        let mut m = self.shared.metrics.lock().unwrap();
        m.num_running = self.running.len();
        m.num_waiting = self.waiting.len();
    }

    fn record_finish(&self, reason: FinishReason, arrival: Instant) {
        let mut m = self.shared.metrics.lock().unwrap();
        *m.request_success
            .entry(reason.as_str().to_string())
            .or_insert(0) += 1;
        if matches!(reason, FinishReason::Stop | FinishReason::Length) {
            m.e2e_latency.observe(arrival.elapsed().as_secs_f64());
        }
    }

    fn free(&mut self, r: Running) {
        if let Some(c) = self.cache.as_mut() {
            c.unpin(&r.pins);
        }
        match (&r.spec, self.dflash.as_mut()) {
            (Some(st), Some(d)) => st.free(self.model.as_mut(), d.draft.as_mut()),
            _ => self.model.free_seq(r.seq),
        }
        if let Some(s) = self.spec.as_mut() {
            s.free_seq(r.seq);
        }
    }

    /// Drop sequences whose client went away (or that a stop string ended), freeing their KV.
    fn reap_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let c = self.running[i].sub.cancel.load(Ordering::Acquire);
            if c == ABORTED || c == STOPPED || self.running[i].sub.tx.is_closed() {
                self.cache_save(i);
                let r = self.running.swap_remove(i);
                let arrival = r.sub.arrival;
                self.free(r);
                let reason = if c == STOPPED {
                    FinishReason::Stop
                } else {
                    FinishReason::Abort
                };
                self.record_finish(reason, arrival);
            } else {
                i += 1;
            }
        }
        let before = self.waiting.len();
        let mut aborted = vec![];
        self.waiting.retain(|s| {
            let live = s.cancel.load(Ordering::Acquire) == LIVE && !s.tx.is_closed();
            if !live {
                aborted.push(s.arrival);
            }
            live
        });
        self.shared
            .queued
            .fetch_sub(before - self.waiting.len(), Ordering::AcqRel);
        for a in aborted {
            self.record_finish(FinishReason::Abort, a);
        }
    }

    fn admit(&mut self) {
        while self.running.len() < self.cfg.max_num_seqs {
            let Some(mut sub) = self.waiting.pop_front() else {
                break;
            };
            let mut grammar = sub.req.constraint.take();
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            let started = self.start_cached(&sub.req);
            let ((seq, mut spec), (computed, pins)) = match started {
                Ok(x) => x,
                Err(e) => {
                    let _ = sub.tx.send(EngineEvent::Error(format!(
                        "could not start a sequence: {e}"
                    )));
                    self.record_finish(FinishReason::Error, sub.arrival);
                    continue;
                }
            };
            let rng = sub
                .req
                .sampling
                .seed
                .map(Rng::new)
                .unwrap_or_else(Rng::from_entropy);
            if let Some(st) = spec.as_mut() {
                st.constraint = grammar.take();
            }
            let tokens = sub.req.prompt.clone();
            let prompt_len = tokens.len();
            {
                let mut m = self.shared.metrics.lock().unwrap();
                m.prompt_tokens_total += prompt_len as u64;
                if self.cache.is_some() {
                    m.prefix_cache_queries += prompt_len as u64;
                    m.prefix_cache_hits += computed as u64;
                }
            }
            let _ = sub.tx.send(EngineEvent::Cached(computed));
            self.running.push(Running {
                sub,
                seq,
                tokens,
                prompt_len,
                computed,
                rng,
                first_token: None,
                spec,
                pins,
                saved_at: computed,
                grammar,
            });
        }
    }

    fn plan(&mut self) -> Vec<Planned> {
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut plan = vec![];
        // Decode rows first: every running sequence with output advances each step.
        for (idx, r) in self.running.iter().enumerate() {
            if r.generated() == 0 || budget == 0 {
                continue;
            }
            let last = r.tokens[r.tokens.len() - 1];
            let mut drafts = vec![];
            if let Some(spec) = self.spec.as_mut() {
                // Never draft past what the request may still emit or what fits in the step.
                let room = (r.sub.req.max_tokens - r.generated())
                    .min(self.cfg.max_model_len.saturating_sub(r.tokens.len()))
                    .min(budget)
                    .saturating_sub(1);
                if room > 0 {
                    drafts = spec.propose(r.seq, &r.tokens);
                    drafts.truncate(room.min(spec.max_draft()));
                }
            }
            let mut rows = vec![last];
            rows.extend_from_slice(&drafts);
            budget -= rows.len();
            let logits = if drafts.is_empty() {
                LogitRows::Last
            } else {
                LogitRows::All
            };
            plan.push(Planned {
                idx,
                rows,
                start: r.computed,
                logits,
                drafts,
            });
        }
        // Then prefill chunks, oldest first.
        for (idx, r) in self.running.iter().enumerate() {
            if r.generated() > 0 || budget == 0 {
                continue;
            }
            let n = self.prefill_cut(r.computed, r.prompt_len).min(budget);
            budget -= n;
            let end = r.computed + n;
            let logits = if end == r.prompt_len {
                LogitRows::Last
            } else {
                LogitRows::None
            };
            plan.push(Planned {
                idx,
                rows: r.tokens[r.computed..end].to_vec(),
                start: r.computed,
                logits,
                drafts: vec![],
            });
        }
        plan
    }

    fn step(&mut self) {
        if self.dflash.is_some() {
            return self.step_dflash();
        }
        if self.inflight.is_some() {
            return self.step_pipelined();
        }
        let plan = self.plan();
        if plan.is_empty() {
            return;
        }
        let rows: Vec<(usize, usize)> = plan.iter().map(|p| (p.idx, p.rows.len())).collect();
        self.cache_room_for(&rows);
        if self.device_decode(&plan) {
            return;
        }
        let inputs: Vec<StepInput> = plan
            .iter()
            .map(|p| StepInput {
                seq: self.running[p.idx].seq,
                tokens: &p.rows,
                start_pos: p.start,
                logits: p.logits,
            })
            .collect();
        // The grammar masks of the rows this step samples are computed while the forward runs.
        let model = &mut self.model;
        let masks: Vec<&mut Constraint> = self
            .running
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| {
                plan.iter()
                    .any(|p| p.idx == *i && p.logits != LogitRows::None)
            })
            .filter_map(|(_, r)| r.grammar.as_mut())
            .collect();
        let outs = crate::grammar::prepare_beside(masks, || model.forward(&inputs));
        {
            let mut m = self.shared.metrics.lock().unwrap();
            m.num_steps += 1;
            m.max_batch_seqs_seen = m.max_batch_seqs_seen.max(plan.len());
        }
        let outs = match outs {
            Ok(o) => o,
            Err(e) => {
                // Fail the sequences of this batch; the others keep going.
                let mut idxs: Vec<usize> = plan.iter().map(|p| p.idx).collect();
                idxs.sort_unstable_by(|a, b| b.cmp(a));
                self.fail(idxs, &e.to_string());
                return;
            }
        };
        let mut finished: Vec<usize> = vec![];
        for (p, out) in plan.iter().zip(outs.iter()) {
            let done = self.advance(p, out);
            if done {
                finished.push(p.idx);
            }
        }
        self.remove(finished);
    }

    /// A step of decode rows only (one token per sequence, no drafts, no logprobs asked) on a
    /// backend that samples on the device: the tokens come back without the logits (the host
    /// draws each non-greedy row's uniform from the sequence's Rng, as `sample` would), in
    /// `decode_step` calls of at most `device_sampling()` sequences. False when the step does not
    /// qualify; the caller then runs the generic forward.
    fn device_decode(&mut self, plan: &[Planned]) -> bool {
        let cap = self.model.device_sampling();
        if cap == 0 || self.spec.is_some() {
            return false;
        }
        let ok = plan.iter().all(|p| {
            let r = &self.running[p.idx];
            p.rows.len() == 1
                && p.drafts.is_empty()
                && p.logits == LogitRows::Last
                && r.generated() > 0
                && r.sub.req.logprobs.is_none()
                && r.grammar.is_none()
        });
        if !ok {
            return false;
        }
        let us: Vec<f64> = plan
            .iter()
            .map(|p| {
                let r = &mut self.running[p.idx];
                uniform_for(&r.sub.req.sampling, &mut r.rng)
            })
            .collect();
        {
            let mut m = self.shared.metrics.lock().unwrap();
            m.num_steps += 1;
            m.max_batch_seqs_seen = m.max_batch_seqs_seen.max(plan.len());
        }
        // A backend that pipelines decode steps: launch this one and return; the next step
        // (`step_pipelined`) collects it, launching its successor first when it can.
        if self.model.decode_pipelined() && plan.len() <= cap {
            let seqs: Vec<SeqId> = plan.iter().map(|p| self.running[p.idx].seq).collect();
            let res = {
                let items = decode_items(&self.running, &plan, &us);
                self.model.decode_launch(&items)
            };
            match res {
                Ok(()) => self.inflight = Some(seqs),
                Err(e) => self.fail(plan.iter().map(|p| p.idx).collect(), &e.to_string()),
            }
            return true;
        }
        // Indices into `running` stay valid until `remove` / `fail` at the end.
        let mut finished = vec![];
        let mut failed = vec![];
        let mut err = String::new();
        for (chunk, cu) in plan.chunks(cap).zip(us.chunks(cap)) {
            let res = {
                let items = decode_items(&self.running, chunk, cu);
                self.model.decode_step(&items)
            };
            match res {
                Err(e) => {
                    failed.extend(chunk.iter().map(|p| p.idx));
                    err = e.to_string();
                }
                Ok(toks) => {
                    for (p, t) in chunk.iter().zip(toks) {
                        self.running[p.idx].computed += 1;
                        if self.deliver(p.idx, vec![t], vec![]) {
                            finished.push(p.idx);
                        }
                    }
                }
            }
        }
        self.report_failed(&failed, &err);
        finished.extend(failed);
        self.remove(finished);
        true
    }

    /// Collect the pipelined decode step in flight. When the step after it would be the same
    /// decode step (every running sequence is in it, none may finish on the token in flight by
    /// length), that step is launched first, each sequence fed on the device with the token the
    /// step in flight draws for it, so the device goes from one step to the next without waiting
    /// for the host. A sequence that the collected token finishes (EOS, a stop token) leaves
    /// that successor's row unused: it is freed, and the row dropped when collected.
    fn step_pipelined(&mut self) {
        let seqs = self.inflight.take().expect("a step in flight");
        let max_len = self.cfg.max_model_len;
        let ahead = self.running.len() == seqs.len()
            && seqs.iter().all(|s| {
                self.running.iter().any(|r| {
                    r.seq == *s
                        && r.generated() + 1 < r.sub.req.max_tokens
                        && r.tokens.len() + 1 < max_len
                        && r.sub.cancel.load(Ordering::Acquire) == LIVE
                })
            });
        let mut launch_err = None;
        if ahead {
            let rows: Vec<(usize, usize)> = seqs
                .iter()
                .filter_map(|s| self.running.iter().position(|r| r.seq == *s))
                .map(|i| (i, 2))
                .collect();
            self.cache_room_for(&rows);
            let us: Vec<f64> = seqs
                .iter()
                .map(|s| {
                    let r = self.running.iter_mut().find(|r| r.seq == *s).unwrap();
                    uniform_for(&r.sub.req.sampling, &mut r.rng)
                })
                .collect();
            let res = {
                let items: Vec<DecodeItem> = seqs
                    .iter()
                    .zip(&us)
                    .enumerate()
                    .map(|(j, (s, &u))| {
                        let r = self.running.iter().find(|r| r.seq == *s).unwrap();
                        DecodeItem {
                            seq: r.seq,
                            token: 0,
                            params: &r.sub.req.sampling,
                            u,
                            prev: Some(j),
                        }
                    })
                    .collect();
                self.model.decode_launch(&items)
            };
            match res {
                Ok(()) => {
                    let mut m = self.shared.metrics.lock().unwrap();
                    m.num_steps += 1;
                    m.max_batch_seqs_seen = m.max_batch_seqs_seen.max(seqs.len());
                }
                Err(e) => launch_err = Some(e.to_string()),
            }
        }
        let launched = ahead && launch_err.is_none();
        let idx_of = |run: &[Running], s: SeqId| run.iter().position(|r| r.seq == s);
        match self.model.decode_collect() {
            Err(e) => {
                if launched {
                    let _ = self.model.decode_collect();
                }
                let idxs: Vec<usize> = seqs
                    .iter()
                    .filter_map(|&s| idx_of(&self.running, s))
                    .collect();
                self.fail(idxs, &e.to_string());
                return;
            }
            Ok(toks) => {
                let mut finished = vec![];
                for (&s, t) in seqs.iter().zip(toks) {
                    let Some(idx) = idx_of(&self.running, s) else {
                        continue;
                    };
                    self.running[idx].computed += 1;
                    if self.deliver(idx, vec![t], vec![]) {
                        finished.push(idx);
                    }
                }
                if let Some(e) = &launch_err {
                    let live: Vec<usize> = seqs
                        .iter()
                        .filter_map(|&s| idx_of(&self.running, s))
                        .filter(|i| !finished.contains(i))
                        .collect();
                    self.report_failed(&live, e);
                    finished.extend(live);
                }
                self.remove(finished);
            }
        }
        if launched {
            if self.running.is_empty() {
                // Nothing left to feed it: collect it now rather than leave it queued.
                let _ = self.model.decode_collect();
            } else {
                self.inflight = Some(seqs);
            }
        }
    }

    fn fail(&mut self, idxs: Vec<usize>, e: &str) {
        self.report_failed(&idxs, e);
        self.remove(idxs);
    }

    /// Tell these running sequences' clients that their step failed (they are removed after).
    fn report_failed(&mut self, idxs: &[usize], e: &str) {
        for &i in idxs {
            // Whatever its K/V hold now, they are not cached.
            self.running[i].saved_at = usize::MAX;
            let r = &self.running[i];
            let _ = r
                .sub
                .tx
                .send(EngineEvent::Error(format!("forward failed: {e}")));
            self.record_finish(FinishReason::Error, r.sub.arrival);
        }
    }

    /// Free finished sequences (saving their prefix in the cache first, unless they failed).
    fn remove(&mut self, mut finished: Vec<usize>) {
        finished.sort_unstable_by(|a, b| b.cmp(a));
        finished.dedup();
        for i in finished {
            self.cache_save(i);
            let r = self.running.swap_remove(i);
            self.free(r);
        }
    }

    /// One DFlash step over the sequences that fit in the token budget: decoding sequences take
    /// k+1 rows, then prompts are prefilled in chunks with what is left.
    fn step_dflash(&mut self) {
        let k = self.dflash.as_ref().map_or(0, |d| d.k);
        let mut budget = self.cfg.max_num_batched_tokens;
        let every = self.snapshot_every();
        let cut = |c: usize, len: usize| prefill_cut(c, len, every);
        let mut chosen: Vec<usize> = vec![];
        for (i, r) in self.running.iter().enumerate() {
            let st = r.spec.as_ref().expect("dflash sequences carry a SpecState");
            if st.is_prefilled() && budget > k {
                budget -= k + 1;
                chosen.push(i);
            }
        }
        for (i, r) in self.running.iter_mut().enumerate() {
            let st = r.spec.as_mut().expect("dflash sequences carry a SpecState");
            if !st.is_prefilled() && budget > 0 {
                let n = cut(r.computed, r.prompt_len).min(budget);
                st.prefill_chunk = n;
                budget -= n;
                chosen.push(i);
            }
        }
        if chosen.is_empty() {
            // Not even one decode block fits (k+1 > max_num_batched_tokens): run the oldest alone.
            chosen.push(0);
        }
        chosen.sort_unstable();
        let rows: Vec<(usize, usize)> = chosen
            .iter()
            .map(|&i| match &self.running[i].spec {
                Some(st) if !st.is_prefilled() => (i, st.prefill_chunk.max(1)),
                _ => (i, k + 1),
            })
            .collect();
        self.cache_room_for(&rows);
        let result = {
            let mut states: Vec<&mut SpecState> = vec![];
            for (i, r) in self.running.iter_mut().enumerate() {
                if chosen.binary_search(&i).is_ok() {
                    states.push(r.spec.as_mut().expect("SpecState"));
                }
            }
            let d = self.dflash.as_mut().expect("dflash");
            crate::spec::step(self.model.as_mut(), d.draft.as_mut(), &mut states)
        };
        {
            let mut m = self.shared.metrics.lock().unwrap();
            m.num_steps += 1;
            m.max_batch_seqs_seen = m.max_batch_seqs_seen.max(chosen.len());
        }
        let results = match result {
            Ok(r) => r,
            Err(e) => {
                self.fail(chosen, &e.to_string());
                return;
            }
        };
        // The step's k (one for all its decoding sequences): the chosen-k gauge and histogram.
        let step_k = chosen
            .iter()
            .zip(&results)
            .find(|(&i, res)| {
                !res.tokens.is_empty() && self.running[i].computed == self.running[i].prompt_len
            })
            .map(|(_, res)| res.proposals.len());
        if let Some(sk) = step_k {
            let mut m = self.shared.metrics.lock().unwrap();
            m.spec_k = sk;
            if m.spec_k_steps.len() <= sk {
                m.spec_k_steps.resize(sk + 1, 0);
            }
            m.spec_k_steps[sk] += 1;
        }
        let mut finished = vec![];
        for (&i, res) in chosen.iter().zip(results) {
            let r = &mut self.running[i];
            if res.tokens.is_empty() {
                // An earlier prefill chunk.
                let chunk = r.spec.as_ref().map_or(0, |st| st.prefill_chunk);
                r.computed = (r.computed + chunk).min(r.prompt_len);
                continue;
            }
            r.computed = r.prompt_len;
            if !res.proposals.is_empty() {
                let mut m = self.shared.metrics.lock().unwrap();
                m.spec_num_drafts += 1;
                m.spec_num_draft_tokens += res.stats.num_draft_tokens as u64;
                m.spec_num_accepted_tokens += res.stats.num_accepted_tokens as u64;
                if m.spec_accepted_per_pos.len() < k {
                    m.spec_accepted_per_pos.resize(k, 0);
                }
                for pos in 0..res.stats.num_accepted_tokens {
                    m.spec_accepted_per_pos[pos] += 1;
                }
            }
            if self.deliver(i, res.tokens, vec![]) {
                finished.push(i);
            }
        }
        self.remove(finished);
    }

    /// Apply one sequence's forward output; true when it finished (or its client is gone).
    fn advance(&mut self, p: &Planned, out: &crate::model::StepOutput) -> bool {
        let r = &mut self.running[p.idx];
        if p.logits == LogitRows::None {
            r.computed += p.rows.len();
            if let Some(s) = self.spec.as_mut() {
                s.observe(r.seq, p.start, &out.taps, p.rows.len());
            }
            return false;
        }
        let want_lp = r.sub.req.logprobs;
        let mut lps: Vec<TokenLogprob> = vec![];
        let sampling = r.sub.req.sampling.clone();
        let rng = &mut r.rng;
        let grammar = &mut r.grammar;
        let mut gerr: Option<String> = None;
        let mut sample_row = |i: usize| -> u32 {
            let row = out.row(i);
            let t = match grammar.as_mut() {
                None => sample(row, &sampling, rng),
                // Sampled from the masked row and fed to the grammar (a draft that the grammar
                // forbids never equals the sampled token, so it is rejected like a mismatch).
                Some(g) => match g
                    .masked(row)
                    .map(|m| sample(&m, &sampling, rng))
                    .and_then(|t| g.consume(t).map(|_| t))
                {
                    Ok(t) => t,
                    Err(e) => {
                        gerr.get_or_insert(e.to_string());
                        0
                    }
                },
            };
            // Logprobs are those of the model's raw distribution.
            if let Some(n) = want_lp {
                lps.push(logprob_of(row, t, n));
            }
            t
        };
        let emitted = if p.drafts.is_empty() {
            r.computed += p.rows.len();
            vec![sample_row(0)]
        } else {
            let v = verify(&p.drafts, &mut sample_row);
            // Rows kept: the last committed token plus the accepted drafts.
            r.computed += 1 + v.accepted;
            self.model.truncate(r.seq, r.computed);
            let mut m = self.shared.metrics.lock().unwrap();
            m.spec_num_drafts += 1;
            m.spec_num_draft_tokens += p.drafts.len() as u64;
            m.spec_num_accepted_tokens += v.accepted as u64;
            if m.spec_accepted_per_pos.len() < p.drafts.len() {
                m.spec_accepted_per_pos.resize(p.drafts.len(), 0);
            }
            for pos in 0..v.accepted {
                m.spec_accepted_per_pos[pos] += 1;
            }
            v.tokens
        };
        if let Some(s) = self.spec.as_mut() {
            let kept = if p.drafts.is_empty() {
                p.rows.len()
            } else {
                emitted.len()
            };
            s.observe(r.seq, p.start, &out.taps, kept);
        }
        if let Some(e) = gerr {
            let r = &self.running[p.idx];
            let _ = r.sub.tx.send(EngineEvent::Error(format!(
                "constrained decoding failed: {e}"
            )));
            self.record_finish(FinishReason::Error, r.sub.arrival);
            return true;
        }
        self.deliver(p.idx, emitted, lps)
    }

    /// Append emitted tokens (stopping at EOS / stop ids / limits), send them; true when finished.
    fn deliver(&mut self, idx: usize, mut emitted: Vec<u32>, mut lps: Vec<TokenLogprob>) -> bool {
        let r = &mut self.running[idx];
        // Stop conditions, token by token.
        let req = &r.sub.req;
        let mut finish: Option<(FinishReason, Option<u32>)> = None;
        let mut n_keep = emitted.len();
        // A grammar allows EOS only once it is complete: then it ends the output, ignore_eos or not.
        let constrained = r.constrained();
        for (i, &t) in emitted.iter().enumerate() {
            r.tokens.push(t);
            let is_eos = (!req.ignore_eos || constrained) && self.model.config().is_eos(t);
            if req.stop_token_ids.contains(&t) {
                finish = Some((FinishReason::Stop, Some(t)));
            } else if is_eos {
                finish = Some((FinishReason::Stop, None));
            } else if r.generated() >= req.max_tokens || r.tokens.len() >= self.cfg.max_model_len {
                finish = Some((FinishReason::Length, None));
            }
            if finish.is_some() {
                n_keep = i + 1;
                break;
            }
        }
        emitted.truncate(n_keep);
        lps.truncate(n_keep);
        let now = Instant::now();
        {
            let mut m = self.shared.metrics.lock().unwrap();
            m.generation_tokens_total += emitted.len() as u64;
            if r.first_token.is_none() {
                m.time_to_first_token
                    .observe((now - r.sub.arrival).as_secs_f64());
            }
        }
        r.first_token.get_or_insert(now);
        let sent = r
            .sub
            .tx
            .send(EngineEvent::Tokens {
                ids: emitted,
                logprobs: lps,
            })
            .is_ok();
        let arrival = r.sub.arrival;
        if !sent || r.sub.cancel.load(Ordering::Acquire) != LIVE {
            let c = r.sub.cancel.load(Ordering::Acquire);
            self.record_finish(
                if c == STOPPED {
                    FinishReason::Stop
                } else {
                    FinishReason::Abort
                },
                arrival,
            );
            return true;
        }
        if let Some((reason, stop_token)) = finish {
            let _ = r.sub.tx.send(EngineEvent::Finished { reason, stop_token });
            self.record_finish(reason, arrival);
            return true;
        }
        false
    }
}

/// The decode items of planned one-token rows of `running` (the token from the host), with their
/// uniforms.
fn decode_items<'a>(running: &'a [Running], plan: &[Planned], us: &[f64]) -> Vec<DecodeItem<'a>> {
    plan.iter()
        .zip(us)
        .map(|(p, &u)| {
            let r = &running[p.idx];
            DecodeItem {
                seq: r.seq,
                token: p.rows[0],
                params: &r.sub.req.sampling,
                u,
                prev: None,
            }
        })
        .collect()
}

/// The chosen token's logprob and the `n` best alternatives.
pub fn logprob_of(logits: &[f32], chosen: u32, n: usize) -> TokenLogprob {
    let lp = log_softmax(logits);
    let mut top = vec![];
    if n > 0 {
        let mut idx: Vec<usize> = (0..lp.len()).collect();
        let n = n.min(idx.len());
        idx.select_nth_unstable_by(n - 1, |&a, &b| {
            lp[b]
                .partial_cmp(&lp[a])
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.cmp(&b))
        });
        idx.truncate(n);
        idx.sort_by(|&a, &b| {
            lp[b]
                .partial_cmp(&lp[a])
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.cmp(&b))
        });
        top = idx.into_iter().map(|i| (i as u32, lp[i])).collect();
    }
    TokenLogprob {
        id: chosen,
        logprob: lp[chosen as usize],
        top,
    }
}
