//! The extension point for speculative decoding (DFlash lives in `crate::spec`).
//!
//! Per decode step the scheduler asks the driver for up to `k` draft tokens for a sequence, feeds
//! the target `[last, d1..dk]` (k+1 rows, logits for all), samples every row with the request's own
//! sampler and keeps drafts while they equal the sampled token. The sequence then emits
//! 1..=k+1 tokens in that step (the accepted drafts plus the target's own next token) and the
//! target's KV is truncated back to the committed length. Sample-and-compare keeps the output
//! distribution (and, for seeded or greedy requests, the exact tokens) identical to plain decoding,
//! because each position consumes exactly one draw, as without drafts.
use crate::model::SeqId;

pub trait SpecDriver: Send {
    /// Most draft tokens proposed per step (DFlash block size - 1).
    fn max_draft(&self) -> usize;
    /// Target layers whose residual streams the driver needs (set on the model at start).
    fn taps(&self) -> Vec<usize> {
        vec![]
    }
    /// Up to `max_draft()` tokens that should follow `tokens` (prompt + committed output, the last
    /// of which is not yet in the target's KV). An empty list means "decode normally".
    fn propose(&mut self, seq: SeqId, tokens: &[u32]) -> Vec<u32>;
    /// After each target forward of this sequence: rows `start_pos..start_pos+n` were run
    /// (prefill chunk or verify block), `taps` holds their tap residuals (`[n, taps*hidden]`,
    /// empty without taps) and the first `kept` rows were committed (the rest were rejected).
    fn observe(&mut self, seq: SeqId, start_pos: usize, taps: &[f32], kept: usize);
    /// The sequence finished or was cancelled.
    fn free_seq(&mut self, seq: SeqId);
}

/// Outcome of verifying one draft block.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// Tokens the sequence emits this step (accepted drafts + one target token).
    pub tokens: Vec<u32>,
    /// How many drafts were accepted (`tokens.len() - 1`).
    pub accepted: usize,
}

/// Sample-and-compare verification. `sample_row(i)` samples the target's token after row `i`.
pub fn verify(drafts: &[u32], mut sample_row: impl FnMut(usize) -> u32) -> Verified {
    let mut tokens = Vec::with_capacity(drafts.len() + 1);
    for i in 0..=drafts.len() {
        let t = sample_row(i);
        tokens.push(t);
        if i == drafts.len() || t != drafts[i] {
            break;
        }
    }
    let accepted = tokens.len() - 1;
    Verified { tokens, accepted }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn verify_accepts_matching_prefix() {
        let target = [5, 6, 7, 8];
        assert_eq!(
            verify(&[5, 6, 9], |i| target[i]),
            Verified {
                tokens: vec![5, 6, 7],
                accepted: 2
            }
        );
        assert_eq!(
            verify(&[5, 6, 7], |i| target[i]),
            Verified {
                tokens: vec![5, 6, 7, 8],
                accepted: 3
            }
        );
        assert_eq!(
            verify(&[1], |i| target[i]),
            Verified {
                tokens: vec![5],
                accepted: 0
            }
        );
        assert_eq!(
            verify(&[], |i| target[i]),
            Verified {
                tokens: vec![5],
                accepted: 0
            }
        );
    }
}
