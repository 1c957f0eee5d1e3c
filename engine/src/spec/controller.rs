//! Adaptive k (`--num-speculative-tokens auto`): each step, choose the number of drafts that
//! maximises the expected tokens per second from each sequence's recent acceptance and the
//! measured step time at each k on this device.
//!
//! Model. A step with k drafts emits 1 + min(L, k) tokens, L the run of drafts the target would
//! accept with unlimited k, so
//!
//! ```text
//!   E(k) = 1 + S(1) + .. + S(k),   S(i) = P(L >= i) = h(1) h(2) .. h(i)
//! ```
//!
//! with h(i) the probability that draft i is accepted once draft i - 1 was. With `cost[k]` the
//! time of a step with k drafts (`cost[0]`: a decode step that still writes the draft's context,
//! so drafting can resume at any step), the best k maximises `E(k) / cost[k]`. When every h(i)
//! is one rate alpha this is the geometric run `E(alpha, k) = 1 + alpha + .. + alpha^k`
//! ([`expected_tokens`]), whose closed forms the tests check: drafting (k = 1) beats decoding iff
//! `alpha > cost[1] / cost[0] - 1`, and k + 1 beats k iff `alpha^(k+1) * cost[k] > (cost[k+1] -
//! cost[k]) * E(alpha, k)`. Real drafts are not geometric: DFlash proposes a block, and its
//! accepted lengths cluster (a fixed length is the extreme: h = 1 up to it, then 0), so the
//! controller estimates each h(i) on its own ([`AcceptCurve`]).
//!
//! Estimate. A step with k drafts and a accepted reached positions 1..=min(a + 1, k) and passed
//! 1..=a. h(i) = passed(i) / reached(i), both exponentially decaying sums (factor [`DECAY`] per
//! drafting step), with a prior of [`PRIOR_WEIGHT`] steps at h(i - 1) ([`PRIOR_H`] for i = 1): a
//! position no step reached yet continues the curve (a draft accepting all it was given is tried
//! at a larger k), and one not reached lately drifts back towards its neighbour and is tried
//! again.
//!
//! Hysteresis: the controller leaves its current k only for one whose expected rate is more than
//! [`HYSTERESIS`] higher. At k = 0 nothing is learnt, so every [`PROBE_EVERY`]-th step drafts at
//! the best k >= 1 (a probe) and its outcome updates the estimate; so does the first step of a
//! sequence no drafting step has measured yet.
//!
//! A batched step has one k for all its sequences (one verify shape); [`choose_batch`] picks the
//! k that maximises the batch's summed expected tokens over the step time at that batch size.
use super::draft::DraftModel;
use super::driver::SpecState;
use crate::error::Result;
use crate::model::Model;
use crate::sample::SamplingParams;
use std::sync::Arc;

/// Per-step decay of the acceptance counts (an effective memory of ~20 drafting steps).
pub const DECAY: f64 = 0.95;
/// The prior of every position: PRIOR_WEIGHT steps at the estimate of the position before it,
/// PRIOR_H for the first draft.
pub const PRIOR_H: f64 = 0.7;
pub const PRIOR_WEIGHT: f64 = 2.0;
/// Switch k only for an expected rate this much higher (relative).
pub const HYSTERESIS: f64 = 0.02;
/// At k = 0, draft every this many steps to re-measure acceptance.
pub const PROBE_EVERY: usize = 32;

/// Expected tokens a step emits with k drafts when every draft is accepted with probability
/// alpha once the one before it was (the geometric case of [`AcceptCurve::expected`]).
pub fn expected_tokens(alpha: f64, k: usize) -> f64 {
    (0..=k).map(|i| alpha.powi(i as i32)).sum()
}

/// One sequence's acceptance by draft position: `reached[i - 1]` and `passed[i - 1]`, the
/// decayed counts of steps that verified draft i with every draft before it accepted, and of
/// those that accepted draft i too.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptCurve {
    reached: Vec<f64>,
    passed: Vec<f64>,
}

impl AcceptCurve {
    /// No step seen yet: every position at the prior.
    pub fn new(k_max: usize) -> AcceptCurve {
        AcceptCurve {
            reached: vec![0.0; k_max],
            passed: vec![0.0; k_max],
        }
    }

    /// The curve of a sequence whose every draft is accepted with probability h(i) (`h[i - 1]`)
    /// once the one before it was, as if seen over `weight` steps at each position.
    pub fn from_rates(h: &[f64], weight: f64) -> AcceptCurve {
        AcceptCurve {
            reached: vec![weight; h.len()],
            passed: h.iter().map(|h| h * weight).collect(),
        }
    }

    /// A step verified k drafts and accepted the first `accepted`.
    pub fn observe(&mut self, k: usize, accepted: usize) {
        if k == 0 {
            return;
        }
        self.reached.iter_mut().for_each(|x| *x *= DECAY);
        self.passed.iter_mut().for_each(|x| *x *= DECAY);
        let reached = (accepted + 1).min(k).min(self.reached.len());
        for i in 0..reached {
            self.reached[i] += 1.0;
            if i < accepted {
                self.passed[i] += 1.0;
            }
        }
    }

    /// h(1..=n), the estimated chances that draft i is accepted once draft i - 1 was: each
    /// position's counts with a prior of [`PRIOR_WEIGHT`] steps at the position before's estimate
    /// ([`PRIOR_H`] for the first), so positions no step reached continue the curve's last rate.
    pub fn rates(&self, n: usize) -> Vec<f64> {
        let mut prior = PRIOR_H;
        (0..n.min(self.reached.len()))
            .map(|i| {
                prior = (self.passed[i] + prior * PRIOR_WEIGHT) / (self.reached[i] + PRIOR_WEIGHT);
                prior
            })
            .collect()
    }

    /// E(0..=k_max): the expected tokens of a step with k drafts, 1 + S(1) + .. + S(k), for every
    /// k at once (past the curve's positions E stays at its last value).
    pub fn expected_by_k(&self, k_max: usize) -> Vec<f64> {
        let rates = self.rates(k_max);
        let mut e = Vec::with_capacity(k_max + 1);
        let (mut s, mut sum) = (1.0, 1.0);
        e.push(sum);
        for k in 1..=k_max {
            if let Some(h) = rates.get(k - 1) {
                s *= h;
                sum += s;
            }
            e.push(sum);
        }
        e
    }

    /// E(k) alone ([`AcceptCurve::expected_by_k`]).
    pub fn expected(&self, k: usize) -> f64 {
        self.expected_by_k(k)[k]
    }
}

/// Step time by k, per batch size, measured on this device ([`StepCosts::measure`]).
/// `by_batch[i] = (batch size, ms per step at k = 0..=k_max)`, sorted by batch.
#[derive(Debug, Clone, PartialEq)]
pub struct StepCosts {
    pub by_batch: Vec<(usize, Vec<f64>)>,
}

impl StepCosts {
    /// Step times at batch size `nb`: the largest measured batch size <= nb (the smallest
    /// measured one below it).
    pub fn for_batch(&self, nb: usize) -> &[f64] {
        let i = self
            .by_batch
            .iter()
            .rposition(|(b, _)| *b <= nb)
            .unwrap_or(0);
        &self.by_batch[i].1
    }

    /// Times greedy DFlash steps through [`super::step`] (so the fused device step where the
    /// backend has one, exactly what decoding runs) for k = 0..=k_max at each batch size: per
    /// (batch, k), `warm` untimed steps (graph capture) then `steps` timed ones, on throwaway
    /// sequences with a `prompt_len`-token prompt. On the CPU this measures the CPU engine the same
    /// way (cheap on fixture models, slow on real ones: prefer fixed k there).
    ///
    /// No sequence grows past [`StepCosts::positions`]`(prompt_len, k_max, warm, steps)`: the
    /// sequences start over (prompt again) before a k whose steps could run past it.
    pub fn measure(
        target: &mut dyn Model,
        draft: &mut dyn DraftModel,
        k_max: usize,
        batches: &[usize],
        prompt_len: usize,
        warm: usize,
        steps: usize,
    ) -> Result<StepCosts> {
        draft.config().check_k(k_max)?;
        let vocab = target.config().vocab_size as u32;
        let prompt: Vec<u32> = (0..prompt_len as u32)
            .map(|i| 1 + (i * 7919) % (vocab - 1))
            .collect();
        let limit = Self::positions(prompt_len, k_max, warm, steps);
        let mut by_batch = vec![];
        for &nb in batches {
            let mut states: Vec<SpecState> = vec![];
            let r = (|| -> Result<Vec<f64>> {
                let mut ms = vec![];
                for k in 0..=k_max {
                    let grow = (warm + steps) * (k + 1);
                    if states.is_empty() || states.iter().any(|s| s.tokens.len() + grow > limit) {
                        states.iter().for_each(|s| s.free(target, draft));
                        states.clear();
                        for _ in 0..nb {
                            let s = SpecState::new(
                                target,
                                draft,
                                &prompt,
                                k_max,
                                SamplingParams::greedy(),
                            )?;
                            states.push(s);
                        }
                        // The prefill step.
                        super::step(target, draft, &mut states.iter_mut().collect::<Vec<_>>())?;
                    }
                    let mut refs: Vec<&mut SpecState> = states.iter_mut().collect();
                    refs.iter_mut().for_each(|s| s.k = k);
                    // A step near the end of the context drafts fewer than k (k_eff): it would
                    // time a smaller k than its column says.
                    let full = |r: &[super::StepResult]| -> Result<()> {
                        match r.iter().find(|r| r.stats.num_draft_tokens != k) {
                            Some(r) => Err(crate::error::EngineError::Other(format!(
                                "measuring step times at k = {k}: a step drafted {} (the context \
                                 ends; size the measurement with StepCosts::fit)",
                                r.stats.num_draft_tokens
                            ))),
                            None => Ok(()),
                        }
                    };
                    for _ in 0..warm {
                        full(&super::step(target, draft, &mut refs)?)?;
                    }
                    let t0 = std::time::Instant::now();
                    let mut results = Vec::with_capacity(steps);
                    for _ in 0..steps {
                        results.push(super::step(target, draft, &mut refs)?);
                    }
                    ms.push(t0.elapsed().as_secs_f64() * 1e3 / steps.max(1) as f64);
                    results.iter().try_for_each(|r| full(r))?;
                }
                Ok(ms)
            })();
            states.iter().for_each(|s| s.free(target, draft));
            by_batch.push((nb, r?));
        }
        by_batch.sort_by_key(|x| x.0);
        Ok(StepCosts { by_batch })
    }

    /// [`StepCosts::measure`] within a context of `max_len` positions: at the k and prompt
    /// length [`StepCosts::fit`] allows (a prompt of up to `want_prompt` tokens), or
    /// [`StepCosts::decode_only`] without measuring when no drafting step fits. Returns the table
    /// and that fit.
    #[allow(clippy::too_many_arguments)]
    pub fn measure_within(
        target: &mut dyn Model,
        draft: &mut dyn DraftModel,
        k_max: usize,
        batches: &[usize],
        want_prompt: usize,
        max_len: usize,
        warm: usize,
        steps: usize,
    ) -> Result<(StepCosts, CostsFit)> {
        let fit = Self::fit(max_len, want_prompt, k_max, warm, steps);
        if fit.k_max == 0 {
            return Ok((Self::decode_only(), fit));
        }
        let costs = Self::measure(
            target,
            draft,
            fit.k_max,
            batches,
            fit.prompt_len,
            warm,
            steps,
        )?;
        Ok((costs, fit))
    }

    /// The most positions a sequence of [`StepCosts::measure`] holds: the prompt, the prefill
    /// step's token and one k_max block of steps emitting k_max + 1 tokens each.
    pub fn positions(prompt_len: usize, k_max: usize, warm: usize, steps: usize) -> usize {
        prompt_len + 1 + (warm + steps) * (k_max + 1)
    }

    /// What a measurement fits in a context of `max_len` positions (the sizing rule of
    /// `Loaded::step_costs`): the largest k <= `k_max` whose steps fit beside a one-token prompt
    /// ([`StepCosts::positions`]), then the longest prompt up to `want_prompt` beside them. k = 0
    /// when not even k = 1 fits: the table is then [`StepCosts::decode_only`].
    pub fn fit(
        max_len: usize,
        want_prompt: usize,
        k_max: usize,
        warm: usize,
        steps: usize,
    ) -> CostsFit {
        let k = (1..=k_max)
            .rev()
            .find(|&k| Self::positions(1, k, warm, steps) <= max_len)
            .unwrap_or(0);
        let room = max_len.saturating_sub(Self::positions(0, k, warm, steps));
        CostsFit {
            prompt_len: want_prompt.min(room).max(1),
            k_max: k,
            wanted_k: k_max,
            max_len,
            needed: Self::positions(1, k_max.min(k + 1), warm, steps),
        }
    }

    /// The table of a context too short to measure a drafting step in: k = 0 alone, so the
    /// controller always decodes (its one entry is never compared with another).
    pub fn decode_only() -> StepCosts {
        StepCosts {
            by_batch: vec![(1, vec![1.0])],
        }
    }

    /// The largest k the table covers.
    pub fn k_max(&self) -> usize {
        self.by_batch
            .iter()
            .map(|(_, c)| c.len().saturating_sub(1))
            .min()
            .unwrap_or(0)
    }
}

/// What [`StepCosts::fit`] lets a measurement use in a given context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostsFit {
    /// The measuring sequences' prompt length.
    pub prompt_len: usize,
    /// The largest k measured; 0: no drafting step fits, the controller decodes.
    pub k_max: usize,
    /// The k asked for, the context, and the positions the smallest k that did not fit needs.
    pub wanted_k: usize,
    pub max_len: usize,
    pub needed: usize,
}

impl CostsFit {
    /// What the measurement gave up to fit its context, if anything (a line for the log).
    pub fn note(&self) -> Option<String> {
        let (k, max_len, needed) = (self.k_max, self.max_len, self.needed);
        if k == self.wanted_k {
            None
        } else if k == 0 {
            Some(format!(
                "adaptive k: a {max_len}-position context leaves no room to measure a drafting \
                 step ({needed} positions at k = 1); the controller decodes without drafts (k = 0)"
            ))
        } else {
            Some(format!(
                "adaptive k: a {max_len}-position context fits measuring k <= {k} (k = {} needs \
                 {needed} positions); the controller chooses k <= {k}",
                k + 1
            ))
        }
    }
}

/// The k in `lo..cost.len()` with the highest `sum_b E_b(k) / cost[k]` (`e(b, k)`: sequence b's
/// expected tokens at k), and that rate.
fn best(n: usize, e: impl Fn(usize, usize) -> f64, cost: &[f64], lo: usize) -> (usize, f64) {
    let rate = |k: usize| (0..n).map(|b| e(b, k)).sum::<f64>() / cost[k];
    (lo..cost.len())
        .map(|k| (k, rate(k)))
        .fold((lo, f64::MIN), |b, x| if x.1 > b.1 { x } else { b })
}

/// The k maximising expected tokens per unit time for one sequence at geometric acceptance alpha.
pub fn best_k(alpha: f64, cost: &[f64]) -> usize {
    best(1, |_, k| expected_tokens(alpha, k), cost, 0).0
}

/// One sequence's acceptance estimate and current k.
#[derive(Debug, Clone)]
pub struct SpecController {
    costs: Arc<StepCosts>,
    k: usize,
    curve: AcceptCurve,
    at_zero: usize,
    /// Whether a drafting step of this sequence was observed yet.
    seen: bool,
}

impl SpecController {
    /// Starts at the best k for the prior acceptance at batch size 1 (at least 1, so the first
    /// steps measure the sequence).
    pub fn new(costs: Arc<StepCosts>) -> SpecController {
        let curve = AcceptCurve::new(costs.k_max());
        let cost = costs.for_batch(1);
        let e = curve.expected_by_k(cost.len() - 1);
        let k = best(1, |_, k| e[k], cost, 0).0.max(1).min(costs.k_max());
        SpecController {
            costs,
            k,
            curve,
            at_zero: 0,
            seen: false,
        }
    }

    /// The acceptance estimate by draft position.
    pub fn curve(&self) -> &AcceptCurve {
        &self.curve
    }

    /// The k this sequence runs at (0: plain decode steps).
    pub fn k(&self) -> usize {
        self.k
    }

    pub fn k_max(&self) -> usize {
        self.costs.k_max()
    }

    /// A step verified `k` drafts and accepted `accepted` of them.
    pub fn observe(&mut self, k: usize, accepted: usize) {
        self.seen |= k > 0;
        self.curve.observe(k, accepted);
    }

    /// The k for the next step of this sequence alone (batch size `nb`).
    pub fn choose(&mut self, nb: usize) -> usize {
        choose_batch(&mut [self], nb)
    }
}

/// The one k for a batched step of these sequences (their current k is the previous step's):
/// the best k for the summed expected tokens, with hysteresis against the first sequence's
/// current k and probes from k = 0. Sets every controller's k to the choice.
pub fn choose_batch(ctls: &mut [&mut SpecController], nb: usize) -> usize {
    let Some(first) = ctls.first() else {
        return 0;
    };
    let cost = first.costs.for_batch(nb).to_vec();
    // Each sequence's E(k) for every k, once for the three searches below.
    let es: Vec<Vec<f64>> = ctls
        .iter()
        .map(|c| c.curve.expected_by_k(cost.len() - 1))
        .collect();
    let e = |b: usize, k: usize| es[b][k];
    let cur = first.k.min(cost.len() - 1);
    let (bk, brate) = best(es.len(), e, &cost, 0);
    let cur_rate = best(es.len(), e, &cost[..=cur], cur).1;
    let mut k = if brate > cur_rate * (1.0 + HYSTERESIS) {
        bk
    } else {
        cur
    };
    let mut probe = false;
    // A table of k = 0 alone (StepCosts::decode_only) has nothing to probe.
    // A sequence not measured yet probes at once (its acceptance is only the prior).
    if k == 0 && cost.len() > 1 {
        let n = first.at_zero + 1;
        if n >= PROBE_EVERY || ctls.iter().any(|c| !c.seen) {
            probe = true;
            k = best(es.len(), e, &cost, 1).0;
        }
    }
    for c in ctls.iter_mut() {
        c.at_zero = if k == 0 { c.at_zero + 1 } else { 0 };
        // A probe drafts once; the next choice starts again from k = 0.
        c.k = if probe { 0 } else { k };
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(c: Vec<f64>) -> Arc<StepCosts> {
        Arc::new(StepCosts {
            by_batch: vec![(1, c)],
        })
    }

    #[test]
    fn expected_tokens_closed_form() {
        for alpha in [0.0, 0.3, 0.8, 0.99] {
            for k in 0..16 {
                let want = (1.0 - f64::powi(alpha, k as i32 + 1)) / (1.0 - alpha);
                assert!((expected_tokens(alpha, k) - want).abs() < 1e-9);
            }
        }
        assert_eq!(expected_tokens(1.0, 6), 7.0);
    }

    /// Step times shaped like a device's: a decode step, then a draft forward plus a verify that
    /// grows with k.
    fn linear(c0: f64, c_draft: f64, c1: f64, k_max: usize) -> Vec<f64> {
        (0..=k_max)
            .map(|k| {
                if k == 0 {
                    c0
                } else {
                    c0 + c_draft + c1 * k as f64
                }
            })
            .collect()
    }

    #[test]
    fn best_k_matches_the_closed_forms() {
        for (c0, cd, c1) in [(2.08, 1.0, 0.5), (1.0, 0.2, 0.05), (1.0, 2.0, 0.01)] {
            let cost = linear(c0, cd, c1, 15);
            for i in 0..=100 {
                let alpha = i as f64 / 100.0;
                let k = best_k(alpha, &cost);
                // Drafting pays at all iff some k >= 1 beats decode; at the margin k=0 vs 1:
                // alpha > cost[1]/cost[0] - 1.
                if k == 0 {
                    assert!(
                        alpha <= cost[1] / cost[0] - 1.0 + 1e-12 || {
                            // k = 1 loses but a larger k might not: check every k explicitly.
                            (1..=15).all(|j| expected_tokens(alpha, j) / cost[j] <= 1.0 / cost[0])
                        }
                    );
                }
                // Local optimality by the marginal condition: k + 1 does not beat k, k - 1 does not
                // beat k.
                let e = |k: usize| expected_tokens(alpha, k);
                if k < 15 {
                    assert!(
                        alpha.powi(k as i32 + 1) * cost[k]
                            <= (cost[k + 1] - cost[k]) * e(k) + 1e-12,
                        "alpha {alpha} k {k}: k+1 is better"
                    );
                }
                // Global: no k has a higher rate.
                for j in 0..=15 {
                    assert!(e(j) / cost[j] <= e(k) / cost[k] + 1e-12);
                }
            }
            // Full acceptance with a draft cheaper than a token: the largest k.
            assert_eq!(best_k(1.0, &cost), 15);
            // No acceptance: decode.
            assert_eq!(best_k(0.0, &cost), 0);
        }
        // Threshold for k = 1 with a two-entry table: cost[1]/cost[0] - 1 = 0.5.
        let cost = vec![1.0, 1.5];
        assert_eq!(best_k(0.49, &cost), 0);
        assert_eq!(best_k(0.51, &cost), 1);
    }

    /// The steps of a sequence whose accepted length at k drafts is `accept(k)`: tokens per ms
    /// over `steps` steps, with the controller choosing k (None) or at a fixed k.
    fn simulate(
        cost: &[f64],
        fixed: Option<usize>,
        steps: usize,
        mut accept: impl FnMut(usize) -> usize,
    ) -> f64 {
        let mut ctl = SpecController::new(costs(cost.to_vec()));
        let (mut tokens, mut ms) = (0.0, 0.0);
        for _ in 0..steps {
            let k = fixed.unwrap_or_else(|| ctl.choose(1));
            let a = accept(k);
            ctl.observe(k, a);
            tokens += (a + 1) as f64;
            ms += cost[k];
        }
        tokens / ms
    }

    /// Step times by k measured on an H100 (synthetic XS-2.1 + DFlash draft, batch 1, 2K prompt:
    /// the bench's step-time table, docs/PERF.md).
    const H100: [f64; 16] = [
        2.634, 4.334, 4.813, 5.296, 5.738, 6.198, 6.633, 7.112, 7.756, 8.213, 8.784, 9.159, 9.519,
        9.947, 10.304, 10.688,
    ];

    /// A draft that always gets exactly A accepted (the bench's `--acceptance A`): the controller
    /// comes within 5 % of the best fixed k, found by trying every k, for A = 1..=9 (the
    /// geometric-only estimate it replaced stayed 12-18 % below on the H100 table). Short of the
    /// issue's 3 %: the positions past A drift back to their neighbour's rate and are re-tried.
    #[test]
    fn fixed_length_acceptance_reaches_the_best_fixed_k() {
        for cost in [H100.to_vec(), linear(2.08, 1.5, 0.4, 15)] {
            for a in 1..=9 {
                let rate = |fixed| simulate(&cost, fixed, 400, |k: usize| a.min(k));
                let best = (0..cost.len()).map(|k| rate(Some(k))).fold(0.0, f64::max);
                let auto = rate(None);
                assert!(
                    auto >= 0.95 * best,
                    "A {a}: auto {auto} best fixed {best} ({cost:?})"
                );
            }
        }
    }

    /// Geometric acceptance (the bench's `--acceptance mean:A`, per-draft rate A / (1 + A)),
    /// averaged over seeds: within 7 % of the best fixed k (the estimate of each position is
    /// noisy over the ~20 steps it remembers; the old estimate was 5-10 % below), and within 3 %
    /// of decoding without drafts.
    #[test]
    fn geometric_acceptance_comes_near_the_best_fixed_k() {
        for mean in [0.0, 0.3, 1.0, 1.4, 2.0, 3.0, 4.03, 5.0, 6.0] {
            let alpha = mean / (1.0 + mean);
            let rate = |fixed: Option<usize>| {
                (0..8)
                    .map(|seed| {
                        let mut rng = crate::sample::Rng::new(seed);
                        simulate(&H100, fixed, 300, |k| {
                            (0..k).take_while(|_| rng.uniform() < alpha).count()
                        })
                    })
                    .sum::<f64>()
                    / 8.0
            };
            let fixed: Vec<f64> = (0..H100.len()).map(|k| rate(Some(k))).collect();
            let best = fixed.iter().cloned().fold(0.0, f64::max);
            let auto = rate(None);
            assert!(
                auto >= 0.93 * best,
                "mean {mean}: auto {auto} best fixed {best}"
            );
            assert!(
                auto >= 0.97 * fixed[0],
                "mean {mean}: auto {auto} decode {}",
                fixed[0]
            );
        }
    }

    #[test]
    fn controller_tracks_acceptance_and_falls_back_to_decode() {
        let c = costs(linear(2.08, 1.5, 0.4, 15));
        let cost = c.for_batch(1).to_vec();
        let mut ctl = SpecController::new(c.clone());
        // Every draft up to the ninth accepted: k -> the best k for 1 + min(9, k) tokens a step.
        for _ in 0..60 {
            let k = ctl.choose(1);
            ctl.observe(k, k.min(9));
        }
        let rate = |k: usize| (1 + k.min(9)) as f64 / cost[k];
        let best = (0..cost.len()).map(rate).fold(0.0, f64::max);
        assert!(rate(ctl.k()) * (1.0 + HYSTERESIS) >= best, "k {}", ctl.k());
        // No acceptance: k = 0 within a few steps, then a probe every PROBE_EVERY + 1 steps.
        let mut ks = vec![];
        for _ in 0..(4 * PROBE_EVERY) {
            let k = ctl.choose(1);
            ctl.observe(k, 0);
            ks.push(k);
        }
        let first_zero = ks
            .iter()
            .position(|&k| k == 0)
            .expect("falls back to decode");
        assert!(first_zero < 30, "{ks:?}");
        let probes: Vec<usize> = ks[first_zero..]
            .iter()
            .enumerate()
            .filter(|(_, &k)| k > 0)
            .map(|(i, _)| i)
            .collect();
        assert!(probes.len() >= 2, "{ks:?}");
        for w in probes.windows(2) {
            assert_eq!(w[1] - w[0], PROBE_EVERY, "{ks:?}");
        }
        // Acceptance comes back: a probe sees it and drafting resumes.
        for _ in 0..(3 * PROBE_EVERY) {
            let k = ctl.choose(1);
            ctl.observe(k, k);
        }
        assert!(ctl.k() > 0);
    }

    /// A new sequence drafts its first step even where the prior says decode: its acceptance is
    /// measured before the controller settles on k = 0.
    #[test]
    fn a_new_sequence_is_measured_first() {
        // Drafting costs 3x a decode step: at the prior (h = 0.7) k = 0 is best.
        let c = costs(linear(1.0, 2.0, 0.1, 8));
        let mut ctl = SpecController::new(c.clone());
        assert_eq!(
            best(1, |_, k| ctl.curve.expected(k), c.for_batch(1), 0).0,
            0
        );
        let k = ctl.choose(1);
        assert!(k > 0);
        ctl.observe(k, 0);
        assert_eq!(ctl.choose(1), 0);
    }

    /// Counts of one rate at every position: the curve is that geometric run.
    #[test]
    fn a_uniform_curve_is_the_geometric_run() {
        for alpha in [0.0, 0.4, 0.9] {
            let c = AcceptCurve::from_rates(&[alpha; 15], 1e9);
            for k in 0..=15 {
                assert!((c.expected(k) - expected_tokens(alpha, k)).abs() < 1e-6);
            }
        }
        // And a step updates exactly the positions it reached.
        let mut c = AcceptCurve::new(6);
        c.observe(6, 2);
        let h = c.rates(6);
        assert!(h[0] > PRIOR_H && h[1] > PRIOR_H && h[2] < PRIOR_H, "{h:?}");
    }

    #[test]
    fn hysteresis_holds_k_near_a_tie() {
        // Two k with rates within 1 %: the controller keeps whichever it has.
        let cost = vec![1.0, 1.0, 1.1];
        let c = costs(cost.clone());
        let mut ctl = SpecController::new(c);
        ctl.k = 1;
        // alpha with E(a,2)/1.1 = 1.005 * E(a,1)/1.0 (a ~ 0.38).
        let a = {
            let (mut lo, mut hi) = (0.0f64, 1.0f64);
            for _ in 0..60 {
                let m = (lo + hi) / 2.0;
                if expected_tokens(m, 2) / 1.1 < 1.005 * expected_tokens(m, 1) {
                    lo = m
                } else {
                    hi = m
                }
            }
            hi
        };
        ctl.curve = AcceptCurve::from_rates(&[a, a], 1e9);
        assert_eq!(best_k(a, &cost), 2);
        assert_eq!(ctl.choose(1), 1, "within hysteresis: stays");
    }

    /// The sizing rule by hand: 2 + 6 steps of k + 1 tokens beside the prompt and the
    /// prefill's token (`positions`); the prompt gives way first, then k, then k = 0 alone.
    #[test]
    fn fit_sizes_the_measurement_to_the_context() {
        let fit = |max_len, want| StepCosts::fit(max_len, want, 15, 2, 6);
        let at = |f: CostsFit| (f.prompt_len, f.k_max);
        // Room for everything: 1024 + 1 + 8 x 16 = 1153 positions.
        assert_eq!(at(fit(4096, 1024)), (1024, 15));
        assert_eq!(at(fit(1153, 1024)), (1024, 15));
        assert_eq!(fit(4096, 1024).note(), None);
        // The prompt shrinks: 1024 - 129 = 895.
        assert_eq!(at(fit(1024, 1024)), (895, 15));
        // k = 15 needs 1 + 1 + 128 = 130 positions; 130 fits it with a one-token prompt.
        assert_eq!(at(fit(130, 1024)), (1, 15));
        // The fixtures' 128: k = 14 needs 1 + 1 + 120 = 122, leaving a 7-token prompt.
        let f = fit(128, 1024);
        assert_eq!(at(f), (7, 14));
        assert_eq!(f.needed, 130);
        assert!(
            f.note().unwrap().contains("fits measuring k <= 14"),
            "{:?}",
            f.note()
        );
        // k = 1 needs 1 + 1 + 16 = 18.
        assert_eq!(at(fit(18, 1024)), (1, 1));
        let f = fit(17, 1024);
        assert_eq!(f.k_max, 0);
        assert_eq!(f.needed, 18);
        assert!(f.note().unwrap().contains("k = 0"), "{:?}", f.note());
        assert_eq!(fit(1, 1024).k_max, 0);
        // A short wanted prompt is kept as it is.
        assert_eq!(at(fit(4096, 5)), (5, 15));
    }

    /// A context with no room to draft: the controller decodes every step and never probes.
    #[test]
    fn decode_only_table_never_drafts() {
        let c = Arc::new(StepCosts::decode_only());
        assert_eq!(c.k_max(), 0);
        let mut ctl = SpecController::new(c);
        assert_eq!(ctl.k(), 0);
        for _ in 0..(4 * PROBE_EVERY) {
            let k = ctl.choose(1);
            assert_eq!(k, 0);
            ctl.observe(k, 0);
        }
    }

    #[test]
    fn batch_choice_sums_expected_tokens() {
        let c = Arc::new(StepCosts {
            by_batch: vec![(1, linear(2.0, 1.0, 0.3, 8)), (4, linear(2.5, 1.2, 1.0, 8))],
        });
        assert_eq!(c.for_batch(3), c.by_batch[0].1.as_slice());
        assert_eq!(c.for_batch(9), c.by_batch[1].1.as_slice());
        let mut a = SpecController::new(c.clone());
        let mut b = SpecController::new(c.clone());
        a.curve = AcceptCurve::from_rates(&[0.9; 8], 1e9);
        b.curve = AcceptCurve::from_rates(&[0.1; 8], 1e9);
        (a.seen, b.seen) = (true, true);
        let k = choose_batch(&mut [&mut a, &mut b], 4);
        let cost = c.for_batch(4);
        let rate = |k: usize| (expected_tokens(0.9, k) + expected_tokens(0.1, k)) / cost[k];
        for j in 0..=8 {
            assert!(rate(j) <= rate(k) * (1.0 + HYSTERESIS) + 1e-12);
        }
        assert_eq!(a.k(), k);
        assert_eq!(b.k(), k);
    }
}
