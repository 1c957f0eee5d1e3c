//! The acceptance oracle of `laguna bench --acceptance`: a DFlash run whose accepted lengths are
//! chosen, with the real draft forward, the real verify and the real bookkeeping.
//!
//! The bench first decodes a reference continuation without the draft (greedy output is
//! deterministic and batch-invariant; a seeded sampled run draws the same tokens from the same
//! logits). In the oracle run the draft still runs (its cost counts), but each step its k
//! proposals are replaced ([`Oracle::proposals`]): the reference's next j tokens, then a token that
//! is certainly not the reference's (`reference + 1 mod vocab`), then the reference again. With
//! greedy verification the target's argmaxes are the reference tokens, so the real verify accepts
//! exactly j and emits the reference's token j + 1 as its correction. With sampling (T > 0) the
//! rejection sampler runs on the verify's rows as usual and its verdict is then replaced by
//! [`Oracle::verdict`] (accept the j reference tokens, emit the reference's next token): the same
//! verdict a draft whose distribution equals the target's for the first j positions (accepted with
//! probability 1) and puts no mass on the target's support at j + 1 (rejected with probability 1)
//! would give, and the emitted tokens are the plain sampled continuation.
//!
//! j per step comes from [`Acceptance`]: a fixed length `A` (j = min(A, k)), or a mean `mean:A`:
//! a per-token acceptance rate alpha = A / (1 + A), so the untruncated accepted length is
//! geometric with mean A (P(L >= i) = alpha^i), drawn per step from a seeded generator, and
//! j = min(L, k) (E[j | k] = alpha + .. + alpha^k: [`super::controller`]'s model with one rate at
//! every draft position).
use super::verify::Verdict;
use crate::error::{EngineError, Result};
use crate::sample::Rng;

/// How many drafts the oracle lets the verify accept per step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Acceptance {
    /// Exactly `min(A, k)` every step.
    Fixed(usize),
    /// Geometric with this untruncated mean (per-token rate A / (1 + A)), truncated at k.
    Mean(f64),
}

impl Acceptance {
    /// `"4"` (fixed) or `"mean:4.03"` (geometric with that mean).
    pub fn parse(s: &str) -> Result<Acceptance> {
        let bad = || {
            EngineError::Other(format!(
                "acceptance `{s}`: want a whole number of accepted drafts per step (`4`) or `mean:A` with A >= 0 (`mean:4.03`)"
            ))
        };
        match s.trim().strip_prefix("mean:") {
            Some(m) => {
                let a: f64 = m.trim().parse().map_err(|_| bad())?;
                if !(a.is_finite() && a >= 0.0) {
                    return Err(bad());
                }
                Ok(Acceptance::Mean(a))
            }
            None => s.trim().parse().map(Acceptance::Fixed).map_err(|_| bad()),
        }
    }

    /// Per-token acceptance rate: the probability that draft i + 1 is accepted given draft i was.
    pub fn alpha(&self) -> f64 {
        match *self {
            Acceptance::Fixed(_) => 1.0,
            Acceptance::Mean(a) => a / (1.0 + a),
        }
    }

    pub fn label(&self) -> String {
        match *self {
            Acceptance::Fixed(a) => format!("{a}"),
            Acceptance::Mean(a) => format!("mean:{a}"),
        }
    }
}

/// Proposals and verdicts that make one sequence accept a chosen number of drafts per step.
#[derive(Debug, Clone)]
pub struct Oracle {
    /// The committed tokens the run will produce: the prompt, then the reference continuation.
    reference: Vec<u32>,
    acceptance: Acceptance,
    rng: Rng,
    vocab: u32,
    /// The accepted length chosen by the last `proposals`.
    planned: usize,
}

impl Oracle {
    /// `reference` = prompt + the continuation without the draft; it must reach k + 1 tokens past
    /// the last committed length the run will verify from.
    pub fn new(reference: Vec<u32>, acceptance: Acceptance, seed: u64, vocab: usize) -> Oracle {
        Oracle {
            reference,
            acceptance,
            rng: Rng::new(seed),
            vocab: vocab as u32,
            planned: 0,
        }
    }

    fn draw(&mut self, k: usize) -> usize {
        match self.acceptance {
            Acceptance::Fixed(a) => a.min(k),
            Acceptance::Mean(_) => {
                let alpha = self.acceptance.alpha();
                let mut j = 0;
                while j < k && self.rng.uniform() < alpha {
                    j += 1;
                }
                j
            }
        }
    }

    /// The k drafts of a step from `committed` (the sequence's committed tokens): reference tokens
    /// for the first j, a wrong one at j + 1, reference tokens after. Errors when the run has left
    /// the reference (the verify is not batch-invariant) or the reference is too short.
    pub fn proposals(&mut self, committed: &[u32], k: usize) -> Result<Vec<u32>> {
        let t = committed.len();
        if self.reference.get(..t) != Some(committed) {
            let at = committed
                .iter()
                .zip(&self.reference)
                .position(|(a, b)| a != b)
                .unwrap_or(t.min(self.reference.len()));
            return Err(EngineError::Other(format!(
                "acceptance oracle: the run left its reference at position {at} (verify rows not identical to decode rows?)"
            )));
        }
        if t + k + 1 > self.reference.len() {
            return Err(EngineError::Other(format!(
                "acceptance oracle: the reference has {} tokens, a step at {t} with k = {k} needs {}",
                self.reference.len(),
                t + k + 1
            )));
        }
        let j = self.draw(k);
        self.planned = j;
        Ok((0..k)
            .map(|i| {
                let r = self.reference[t + i];
                if i == j {
                    (r + 1) % self.vocab
                } else {
                    r
                }
            })
            .collect())
    }

    /// The accepted length the last [`Oracle::proposals`] planned.
    pub fn planned(&self) -> usize {
        self.planned
    }

    /// The verdict of a step of k drafts from `t` committed tokens: accept the planned j drafts
    /// (none when k = 0: no proposals were asked for) and emit the reference's next token.
    pub fn verdict(&self, t: usize, k: usize) -> Verdict {
        let j = self.planned.min(k);
        Verdict {
            tokens: self.reference[t..t + j + 1].to_vec(),
            accepted: j,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fixed_and_mean() {
        assert_eq!(Acceptance::parse("4").unwrap(), Acceptance::Fixed(4));
        assert_eq!(
            Acceptance::parse("mean:4.03").unwrap(),
            Acceptance::Mean(4.03)
        );
        assert!(Acceptance::parse("mean:-1").is_err());
        assert!(Acceptance::parse("x").is_err());
        assert!(Acceptance::parse("4.5").is_err());
    }

    #[test]
    fn proposals_hold_j_reference_tokens_then_a_wrong_one() {
        let reference: Vec<u32> = (0..40).map(|i| (i * 7) % 50).collect();
        let mut o = Oracle::new(reference.clone(), Acceptance::Fixed(3), 1, 50);
        let d = o.proposals(&reference[..10], 6).unwrap();
        assert_eq!(o.planned(), 3);
        assert_eq!(&d[..3], &reference[10..13]);
        assert_ne!(d[3], reference[13]);
        assert_eq!(&d[4..], &reference[14..16]);
        assert_eq!(o.verdict(10, 6).tokens, &reference[10..14]);
        // k below A: everything accepted.
        let d = o.proposals(&reference[..10], 2).unwrap();
        assert_eq!(o.planned(), 2);
        assert_eq!(d, &reference[10..12]);
        // Leaving the reference is an error.
        let mut off = reference[..10].to_vec();
        off[9] += 1;
        assert!(o.proposals(&off, 2).is_err());
        assert!(o.proposals(&reference[..34], 6).is_err());
    }

    #[test]
    fn mean_mode_matches_the_truncated_geometric_mean() {
        // E[min(L, k)] = alpha + .. + alpha^k with alpha = A / (1 + A).
        let reference: Vec<u32> = vec![1; 64];
        for (a, k) in [(1.4, 6), (4.03, 6), (4.03, 15), (2.0, 3)] {
            let mut o = Oracle::new(reference.clone(), Acceptance::Mean(a), 7, 50);
            let n = 40_000;
            let mut sum = 0usize;
            for _ in 0..n {
                o.proposals(&reference[..8], k).unwrap();
                sum += o.planned();
            }
            let alpha: f64 = a / (1.0 + a);
            let want: f64 = (1..=k).map(|i| alpha.powi(i as i32)).sum();
            let got = sum as f64 / n as f64;
            // Standard error of the mean is below sqrt(var / n) <= k / sqrt(n) = 0.075 for k = 15.
            assert!(
                (got - want).abs() < 0.05 * want.max(1.0),
                "A={a} k={k}: {got} vs {want}"
            );
        }
    }
}
