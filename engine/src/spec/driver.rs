//! The DFlash step driver: per-sequence [`SpecState`], batched [`step`], and single-sequence
//! [`generate_spec`]. Backend-agnostic: it only talks to `dyn Model` (target) and
//! `dyn DraftModel` (draft).
//!
//! Invariant between steps, for a sequence with committed tokens `x[0..T)` (prompt + generated):
//! the target KV and the draft context hold positions `0..T-1` (the last token `t = x[T-1]` has not
//! been run through the target yet).
//!
//! One step (after the prefill step):
//! 1. propose: one draft forward over `[t, mask x k]` at positions `T-1..T-1+k`; row j's argmax
//!    is the draft for position `T-1+j` (one batched draft call for all sequences);
//! 2. verify: one target forward over `[t, d_1..d_k]` at positions `T-1..` with taps (one batched
//!    target call); greedy or one-hot rejection sampling ([`super::verify`]) accepts `a` drafts and
//!    emits `a+1` tokens;
//! 3. rollback + context: the target is truncated to `T+a` positions (rejected rows leave no K/V),
//!    and the taps of the `a+1` accepted rows become draft context at positions `T-1..T-1+a`
//!    (one batched write; rejected rows are never written).
//!
//! The prefill step runs the prompt through the target with taps, samples the first token with
//! the plain sampler and writes the whole prompt as draft context.
use super::controller::{choose_batch, SpecController};
use super::draft::{BlockInput, ContextInput, DraftModel};
use super::oracle::Oracle;
use super::stats::{SpecStats, StepStats};
use super::verify::{verify, verify_constrained, Verdict};
use crate::error::{EngineError, Result};
use crate::generate::{check_prompt, is_stop, FinishReason, GenerateRequest, GenerateResult};
use crate::grammar::{prepare_beside, Constraint};
use crate::model::{LogitRows, Model, SeqId, StepInput};
use crate::sample::argmax;
use crate::sample::{sample, Rng, SamplingParams};
use std::sync::Arc;

/// Make the target capture the residual stream after the draft's tap layers. Call once per
/// (target, draft) pair before running [`step`]; [`SpecState::new`] calls it too.
pub fn enable_taps(target: &mut dyn Model, draft: &dyn DraftModel) -> Result<()> {
    draft.config().validate_target(target.config())?;
    target.set_taps(&draft.config().target_layer_ids);
    Ok(())
}

/// One sequence under speculative decoding.
pub struct SpecState {
    pub target_seq: SeqId,
    pub draft_seq: SeqId,
    /// num_speculative_tokens.
    pub k: usize,
    pub sampling: SamplingParams,
    rng: Rng,
    /// Committed tokens: the prompt, then every emitted token.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    prefilled: bool,
    /// Prompt positions already run through the target (chunked prefill).
    prefill_pos: usize,
    /// Prefill at most this many prompt tokens per step (0: the whole prompt in one step). Each
    /// chunk writes its draft context; only the last one samples the first token.
    pub prefill_chunk: usize,
    forced: Option<Vec<u32>>,
    /// Counters of this sequence (vLLM semantics, see [`SpecStats`]).
    pub stats: SpecStats,
    /// Keep per-step `acceptance_lengths` / `proposals` in `stats`.
    pub keep_history: bool,
    /// Constrained decoding: every row is sampled under this grammar (`super::verify`).
    pub constraint: Option<Constraint>,
    /// The bench's acceptance oracle: chooses the proposals (and, when sampling, the verdict)
    /// so each step accepts a planned number of drafts ([`super::oracle`]).
    pub oracle: Option<Oracle>,
    /// Adaptive k (`--num-speculative-tokens auto`): chooses `k` before each step from this
    /// sequence's acceptance and the measured step times ([`super::controller`]); `k` given to
    /// [`SpecState::new`] is then the largest k allowed.
    pub controller: Option<SpecController>,
}

/// What [`step`] produced for one sequence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepResult {
    /// Newly committed tokens, in order (1 for the last prefill step, none for an earlier prefill
    /// chunk; accepted drafts + 1 otherwise).
    /// The caller applies stop tokens / max_tokens and frees the sequence when done.
    pub tokens: Vec<u32>,
    /// The draft tokens verified this step (empty for the prefill step).
    pub proposals: Vec<u32>,
    pub stats: StepStats,
}

impl SpecState {
    /// Allocates a target and a draft sequence and validates the request.
    pub fn new(
        target: &mut dyn Model,
        draft: &mut dyn DraftModel,
        prompt: &[u32],
        k: usize,
        sampling: SamplingParams,
    ) -> Result<SpecState> {
        draft.config().check_k(k)?;
        check_prompt(target, prompt)?;
        enable_taps(target, draft)?;
        let rng = sampling
            .seed
            .map(Rng::new)
            .unwrap_or_else(Rng::from_entropy);
        let target_seq = target.new_seq()?;
        let draft_seq = match draft.new_seq() {
            Ok(s) => s,
            Err(e) => {
                target.free_seq(target_seq);
                return Err(e);
            }
        };
        Ok(SpecState {
            target_seq,
            draft_seq,
            k,
            sampling,
            rng,
            tokens: prompt.to_vec(),
            prompt_len: prompt.len(),
            prefilled: false,
            prefill_pos: 0,
            prefill_chunk: 0,
            forced: None,
            stats: SpecStats::with_k(k),
            keep_history: false,
            constraint: None,
            oracle: None,
            controller: None,
        })
    }

    pub fn free(&self, target: &mut dyn Model, draft: &mut dyn DraftModel) {
        target.free_seq(self.target_seq);
        draft.free_seq(self.draft_seq);
    }

    /// Generated tokens so far (everything after the prompt).
    pub fn completion(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    pub fn is_prefilled(&self) -> bool {
        self.prefilled
    }

    /// Start the prefill at prompt position `pos` instead of 0: the target sequence and the
    /// draft context already hold positions `0..pos` (restored from the prefix cache).
    pub fn resume_at(&mut self, pos: usize) -> Result<()> {
        if self.prefilled || self.prefill_pos != 0 || pos >= self.prompt_len {
            return Err(EngineError::Other(format!(
                "cannot resume a {}-token prompt at {pos}",
                self.prompt_len
            )));
        }
        self.prefill_pos = pos;
        Ok(())
    }

    /// Replace the next step's proposals with the first k of these tokens (the draft still runs
    /// and its context stays in sync). For tests and external proposers; at least k tokens (with a
    /// controller, k is chosen at the step: give its largest).
    pub fn force_next_drafts(&mut self, drafts: Vec<u32>) {
        self.forced = Some(drafts);
    }

    fn prefill_end(&self) -> usize {
        let n = self.tokens.len();
        if self.prefill_chunk == 0 {
            n
        } else {
            n.min(self.prefill_pos + self.prefill_chunk)
        }
    }

    /// A verify's verdict of k drafts under the bench's acceptance oracle: greedy verdicts must be the
    /// reference's (the oracle proved the verify accepts exactly the planned drafts); sampled ones
    /// are replaced by it ([`super::oracle`]).
    pub(crate) fn oracle_verdict(&self, k: usize, v: Verdict) -> Result<Verdict> {
        let Some(o) = &self.oracle else {
            return Ok(v);
        };
        let t = self.tokens.len();
        let want = o.verdict(t, k);
        if self.sampling.is_greedy() && v != want {
            return Err(EngineError::Other(format!(
                "acceptance oracle: the greedy verify at position {t} gave {v:?}, the reference {want:?} (verify rows not identical to decode rows?)"
            )));
        }
        Ok(want)
    }

    /// Record a verified step (drafts `d`, verdict `v`): counters, history, the k controller and
    /// the committed tokens. Shared by the generic step and a backend's fused step.
    pub(crate) fn commit(&mut self, d: Vec<u32>, v: Verdict) -> StepResult {
        let st = StepStats {
            num_draft_tokens: d.len(),
            num_accepted_tokens: v.accepted,
        };
        self.stats.observe(&st);
        self.stats.num_emitted_tokens += v.tokens.len() as u64;
        if self.keep_history {
            self.stats.acceptance_lengths.push(v.accepted);
            self.stats.proposals.push(d.clone());
        }
        if let Some(c) = self.controller.as_mut() {
            c.observe(d.len(), v.accepted);
        }
        self.tokens.extend_from_slice(&v.tokens);
        StepResult {
            tokens: v.tokens,
            proposals: d,
            stats: st,
        }
    }

    /// How many drafts the next verify can take without passing the target's max position.
    fn k_eff(&self, max_pos: usize) -> usize {
        self.k.min(max_pos.saturating_sub(self.tokens.len()))
    }
}

/// Advance every state by one step: prefill for new states, propose + verify otherwise.
/// One draft forward, one target forward and one context write are issued for the whole batch.
pub fn step(
    target: &mut dyn Model,
    draft: &mut dyn DraftModel,
    states: &mut [&mut SpecState],
) -> Result<Vec<StepResult>> {
    let max_pos = target.config().max_position_embeddings;
    let mask = draft.config().mask_token_id;
    choose_k(states);

    // A backend that runs whole greedy steps on its device (the CUDA draft with a CUDA target)
    // takes batches where every state is decoding greedily with its full k.
    let fusable = !states.is_empty()
        && states.iter().all(|s| {
            s.prefilled
                && s.forced.is_none()
                && s.constraint.is_none()
                && s.oracle.is_some() == states[0].oracle.is_some()
                && s.sampling.is_greedy()
                && s.k == states[0].k
                && s.k_eff(max_pos) == s.k
        });
    if fusable {
        if let Some(r) = draft.fused_greedy_step(target, states) {
            return r;
        }
    }

    // 1. Propose for the decoding states.
    let mut drafts: Vec<Vec<u32>> = vec![vec![]; states.len()];
    {
        let mut blocks: Vec<Vec<u32>> = vec![];
        let mut who: Vec<usize> = vec![];
        for (i, s) in states.iter().enumerate() {
            if s.prefilled && s.k_eff(max_pos) > 0 {
                let mut b = vec![*s.tokens.last().expect("non-empty")];
                b.extend(std::iter::repeat_n(mask, s.k));
                blocks.push(b);
                who.push(i);
            }
        }
        if !blocks.is_empty() {
            let batch: Vec<BlockInput> = who
                .iter()
                .zip(&blocks)
                .map(|(&i, b)| BlockInput {
                    seq: states[i].draft_seq,
                    tokens: b,
                    start_pos: states[i].tokens.len() - 1,
                })
                .collect();
            let outs = draft.propose(&batch)?;
            for (&i, out) in who.iter().zip(&outs) {
                let s = &mut *states[i];
                let mut d: Vec<u32> = (1..=s.k).map(|j| argmax(out.row(j)) as u32).collect();
                if let Some(f) = s.forced.take() {
                    if f.len() < s.k {
                        return Err(EngineError::Other(format!(
                            "forced drafts have {} tokens, expected at least k = {}",
                            f.len(),
                            s.k
                        )));
                    }
                    d = f[..s.k].to_vec();
                }
                d.truncate(s.k_eff(max_pos));
                if let Some(o) = s.oracle.as_mut() {
                    d = o.proposals(&s.tokens, d.len())?;
                }
                drafts[i] = d;
            }
        }
    }

    // Forced drafts are for the step that verifies drafts; a step without any drops them.
    for (s, d) in states.iter_mut().zip(&drafts) {
        if s.prefilled && d.is_empty() {
            s.forced = None;
        }
    }

    // 2. One target forward: (a chunk of) the prompt for new states, [t, drafts] for the others.
    let inputs: Vec<Vec<u32>> = states
        .iter()
        .zip(&drafts)
        .map(|(s, d)| {
            if s.prefilled {
                let mut v = vec![*s.tokens.last().expect("non-empty")];
                v.extend_from_slice(d);
                v
            } else {
                s.tokens[s.prefill_pos..s.prefill_end()].to_vec()
            }
        })
        .collect();
    let batch: Vec<StepInput> = states
        .iter()
        .zip(&inputs)
        .map(|(s, inp)| StepInput {
            seq: s.target_seq,
            tokens: inp,
            start_pos: if s.prefilled {
                s.tokens.len() - 1
            } else {
                s.prefill_pos
            },
            logits: if s.prefilled {
                LogitRows::All
            } else if s.prefill_end() == s.tokens.len() {
                LogitRows::Last
            } else {
                LogitRows::None
            },
        })
        .collect();
    // The grammar masks of each sequence's first row are computed while the target runs.
    let masks: Vec<&mut Constraint> = states
        .iter_mut()
        .filter(|s| s.prefilled || s.prefill_end() == s.tokens.len())
        .filter_map(|s| s.constraint.as_mut())
        .collect();
    let outs = prepare_beside(masks, || target.forward(&batch))?;

    // 3. Verify, roll back, and collect context rows.
    let ntaps_w = draft.config().num_taps() * target.config().hidden_size;
    let mut results = Vec::with_capacity(states.len());
    let mut ctx: Vec<(SeqId, usize, Vec<f32>)> = Vec::with_capacity(states.len());
    for (((s, out), d), inp) in states.iter_mut().zip(&outs).zip(drafts).zip(&inputs) {
        if out.taps.len() != inp.len() * ntaps_w {
            return Err(EngineError::Other(format!(
                "target returned {} tap values for a {}-row step, expected {} per row (set_taps not honoured?)",
                out.taps.len(),
                inp.len(),
                ntaps_w
            )));
        }
        if !s.prefilled {
            ctx.push((s.draft_seq, s.prefill_pos, out.taps.clone()));
            s.prefill_pos += inp.len();
            if s.prefill_pos < s.tokens.len() {
                results.push(StepResult::default());
                continue;
            }
            let tok = match s.constraint.as_mut() {
                Some(c) => {
                    let t = sample(&c.masked(out.row(0))?, &s.sampling, &mut s.rng);
                    c.consume(t)?;
                    t
                }
                None => sample(out.row(0), &s.sampling, &mut s.rng),
            };
            s.tokens.push(tok);
            s.prefilled = true;
            s.stats.num_emitted_tokens += 1;
            results.push(StepResult {
                tokens: vec![tok],
                proposals: vec![],
                stats: StepStats::default(),
            });
            continue;
        }
        let rows: Vec<&[f32]> = (0..=d.len()).map(|i| out.row(i)).collect();
        let v = match s.constraint.as_mut() {
            Some(c) => verify_constrained(&d, &rows, &s.sampling, &mut s.rng, c)?,
            None => verify(&d, &rows, &s.sampling, &mut s.rng),
        };
        let v = s.oracle_verdict(d.len(), v)?;
        let t_len = s.tokens.len();
        // Positions T-1 ..= T-1+a are now committed with K/V; drop the rejected rows.
        target.truncate(s.target_seq, t_len + v.accepted);
        ctx.push((
            s.draft_seq,
            t_len - 1,
            out.taps[..(v.accepted + 1) * ntaps_w].to_vec(),
        ));
        results.push(s.commit(d, v));
    }

    // 4. Draft context for the committed rows.
    let cbatch: Vec<ContextInput> = ctx
        .iter()
        .map(|(seq, start, taps)| ContextInput {
            seq: *seq,
            start_pos: *start,
            taps,
        })
        .collect();
    draft.write_context(&cbatch)?;
    Ok(results)
}

/// Sets `k` of the prefilled states that have a controller: one k for all of them (one verify
/// shape), chosen for the batch ([`super::controller::choose_batch`]).
fn choose_k(states: &mut [&mut SpecState]) {
    let nb = states.iter().filter(|s| s.prefilled).count();
    let mut ctls: Vec<&mut SpecController> = states
        .iter_mut()
        .filter(|s| s.prefilled)
        .filter_map(|s| s.controller.as_mut())
        .collect();
    if ctls.is_empty() {
        return;
    }
    let k = choose_batch(&mut ctls, nb);
    for s in states.iter_mut() {
        if s.prefilled && s.controller.is_some() {
            s.k = k;
        }
    }
}

/// Speculative generation of one request: token-identical to [`crate::generate::generate`] under
/// greedy sampling, and equal in distribution under temperature sampling. With `costs`, k is
/// adaptive (a [`SpecController`] over that step-time table) and `k` is the largest it may choose.
pub fn generate_spec(
    target: &mut dyn Model,
    draft: &mut dyn DraftModel,
    req: &GenerateRequest,
    k: usize,
    keep_history: bool,
    costs: Option<Arc<super::StepCosts>>,
) -> Result<(GenerateResult, SpecStats)> {
    let mut st = SpecState::new(target, draft, &req.prompt, k, req.sampling.clone())?;
    st.keep_history = keep_history;
    st.controller = costs.map(SpecController::new);
    let res = (|| {
        let mut completion = vec![];
        let mut finish = FinishReason::Length;
        'outer: while completion.len() < req.max_tokens {
            let r = step(target, draft, &mut [&mut st])?
                .pop()
                .expect("one result");
            for tok in r.tokens {
                completion.push(tok);
                if is_stop(target, req, tok) {
                    finish = FinishReason::Stop;
                    break 'outer;
                }
                if completion.len() >= req.max_tokens {
                    break 'outer;
                }
            }
        }
        Ok(GenerateResult {
            completion,
            finish_reason: finish,
            step_logits: vec![],
        })
    })();
    st.free(target, draft);
    res.map(|r| (r, st.stats.clone()))
}
