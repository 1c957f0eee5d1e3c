//! Speculative-decoding counters with vLLM's semantics (`v1/spec_decode/metrics.py`):
//!
//! | field | vLLM counter |
//! |---|---|
//! | `num_drafts` | `spec_decode_num_drafts` (verifications with >= 1 draft token) |
//! | `num_draft_tokens` | `spec_decode_num_draft_tokens` |
//! | `num_accepted_tokens` | `spec_decode_num_accepted_tokens` (bonus/correction token excluded) |
//! | `num_accepted_tokens_per_pos[i]` | `spec_decode_num_accepted_tokens_per_pos{position=i}` (drafts whose accepted length > i) |
//!
//! Mean acceptance length = 1 + accepted / drafts. Counters are additive: aggregate per-sequence
//! stats (or per-step [`StepStats`]) with [`SpecStats::merge`] / [`SpecStats::observe`].
use serde_json::{json, Value};

/// What one verification step did for one sequence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepStats {
    /// Draft tokens verified this step (0 when no draft was scheduled).
    pub num_draft_tokens: usize,
    /// Draft tokens accepted this step.
    pub num_accepted_tokens: usize,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecStats {
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// Length k (grows to the longest draft seen).
    pub num_accepted_tokens_per_pos: Vec<u64>,
    /// Tokens produced by the sequence, including the prefill's first token, before any
    /// stop/max_tokens truncation: `1 + steps + accepted` for one sequence.
    pub num_emitted_tokens: u64,
    /// Verification steps (with or without drafts).
    pub num_steps: u64,
    /// Per step, in order: accepted draft tokens (only when history is kept).
    pub acceptance_lengths: Vec<usize>,
    /// Per step, in order: the draft tokens proposed and verified (only when history is kept).
    pub proposals: Vec<Vec<u32>>,
}

impl SpecStats {
    pub fn with_k(k: usize) -> Self {
        SpecStats {
            num_accepted_tokens_per_pos: vec![0; k],
            ..Default::default()
        }
    }

    /// Record one verification step.
    pub fn observe(&mut self, s: &StepStats) {
        self.num_steps += 1;
        if s.num_draft_tokens > 0 {
            self.num_drafts += 1;
            self.num_draft_tokens += s.num_draft_tokens as u64;
            self.num_accepted_tokens += s.num_accepted_tokens as u64;
            if self.num_accepted_tokens_per_pos.len() < s.num_draft_tokens {
                self.num_accepted_tokens_per_pos
                    .resize(s.num_draft_tokens, 0);
            }
            for c in self
                .num_accepted_tokens_per_pos
                .iter_mut()
                .take(s.num_accepted_tokens)
            {
                *c += 1;
            }
        }
    }

    /// Add another sequence's (or engine's) counters; histories are concatenated.
    pub fn merge(&mut self, o: &SpecStats) {
        self.num_drafts += o.num_drafts;
        self.num_draft_tokens += o.num_draft_tokens;
        self.num_accepted_tokens += o.num_accepted_tokens;
        if self.num_accepted_tokens_per_pos.len() < o.num_accepted_tokens_per_pos.len() {
            self.num_accepted_tokens_per_pos
                .resize(o.num_accepted_tokens_per_pos.len(), 0);
        }
        for (a, b) in self
            .num_accepted_tokens_per_pos
            .iter_mut()
            .zip(&o.num_accepted_tokens_per_pos)
        {
            *a += b;
        }
        self.num_emitted_tokens += o.num_emitted_tokens;
        self.num_steps += o.num_steps;
        self.acceptance_lengths
            .extend_from_slice(&o.acceptance_lengths);
        self.proposals.extend(o.proposals.iter().cloned());
    }

    /// accepted / drafted (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.num_draft_tokens == 0 {
            0.0
        } else {
            self.num_accepted_tokens as f64 / self.num_draft_tokens as f64
        }
    }

    /// 1 + accepted / drafts (vLLM's "mean acceptance length"; 1 when nothing was drafted).
    pub fn mean_acceptance_length(&self) -> f64 {
        if self.num_drafts == 0 {
            1.0
        } else {
            1.0 + self.num_accepted_tokens as f64 / self.num_drafts as f64
        }
    }

    /// per_pos[i] / drafts.
    pub fn per_position_rates(&self) -> Vec<f64> {
        self.num_accepted_tokens_per_pos
            .iter()
            .map(|&c| {
                if self.num_drafts == 0 {
                    0.0
                } else {
                    c as f64 / self.num_drafts as f64
                }
            })
            .collect()
    }

    /// The `"spec"` object of `laguna generate --json`.
    pub fn to_json(&self) -> Value {
        json!({
            "drafts": self.num_drafts,
            "draft_tokens": self.num_draft_tokens,
            "accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": self.num_accepted_tokens_per_pos,
            "acceptance_lengths": self.acceptance_lengths,
            "proposals": self.proposals,
        })
    }

    /// One human line, in the spirit of vLLM's `SpecDecoding metrics:` log line.
    pub fn summary(&self) -> String {
        let rates: Vec<String> = self
            .per_position_rates()
            .iter()
            .map(|r| format!("{r:.3}"))
            .collect();
        format!(
            "SpecDecoding metrics: Mean acceptance length: {:.2}, Accepted: {} tokens, Drafted: {} tokens, Drafts: {}, Per-position acceptance rate: [{}], Avg Draft acceptance rate: {:.1}%",
            self.mean_acceptance_length(),
            self.num_accepted_tokens,
            self.num_draft_tokens,
            self.num_drafts,
            rates.join(", "),
            100.0 * self.acceptance_rate()
        )
    }
}
