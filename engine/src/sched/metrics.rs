//! Scheduler counters and histograms, read by the server's `/metrics` (vLLM names are applied there).
use std::collections::BTreeMap;

/// vLLM's buckets for `vllm:time_to_first_token_seconds`.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's buckets for the request-latency histograms (`vllm:e2e_request_latency_seconds`).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Upper bounds, ascending (the `+Inf` bucket is implied).
    pub bounds: Vec<f64>,
    /// Per-bucket counts (not cumulative), one more than `bounds` (the last is `+Inf`).
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Histogram {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }
    pub fn observe(&mut self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }
    /// Cumulative counts per bound, then `+Inf` (what Prometheus `_bucket` lines show).
    pub fn cumulative(&self) -> Vec<u64> {
        let mut acc = 0;
        self.counts
            .iter()
            .map(|c| {
                acc += c;
                acc
            })
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct MetricsSnapshot {
    pub num_running: usize,
    pub num_waiting: usize,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub time_to_first_token: Histogram,
    pub e2e_latency: Histogram,
    /// Finished requests by reason ("stop", "length", "abort", "error").
    pub request_success: BTreeMap<String, u64>,
    pub spec_num_drafts: u64,
    pub spec_num_draft_tokens: u64,
    pub spec_num_accepted_tokens: u64,
    /// Accepted draft tokens by position in the draft (0-based).
    pub spec_accepted_per_pos: Vec<u64>,
    /// Drafts per step of the last DFlash decode step (the adaptive k's choice, or the fixed k),
    /// and DFlash decode steps by k.
    pub spec_k: usize,
    pub spec_k_steps: Vec<u64>,
    /// Forward steps run and rows they carried (for debugging the batcher).
    pub num_steps: u64,
    pub max_batch_seqs_seen: usize,
    /// Prompt tokens looked up in the prefix cache, and those found (vLLM's
    /// `prefix_cache_queries` / `prefix_cache_hits`, in tokens).
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
}

impl Default for MetricsSnapshot {
    fn default() -> Self {
        let mut request_success = BTreeMap::new();
        for r in ["stop", "length", "abort"] {
            request_success.insert(r.to_string(), 0);
        }
        MetricsSnapshot {
            num_running: 0,
            num_waiting: 0,
            prompt_tokens_total: 0,
            generation_tokens_total: 0,
            time_to_first_token: Histogram::new(TTFT_BUCKETS),
            e2e_latency: Histogram::new(LATENCY_BUCKETS),
            request_success,
            spec_num_drafts: 0,
            spec_num_draft_tokens: 0,
            spec_num_accepted_tokens: 0,
            spec_accepted_per_pos: vec![],
            spec_k: 0,
            spec_k_steps: vec![],
            num_steps: 0,
            max_batch_seqs_seen: 0,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn histogram_buckets() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(0.1);
        h.observe(5.0);
        assert_eq!(h.cumulative(), vec![2, 3, 4]);
        assert_eq!(h.count, 4);
        assert!((h.sum - 5.65).abs() < 1e-9);
    }
}
