//! `/metrics`: the scheduler snapshot in Prometheus text format under vLLM's metric names.
use laguna_engine::sched::{Histogram, MetricsSnapshot};
use std::fmt::Write;

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn num(v: f64) -> String {
    if v.is_infinite() {
        "+Inf".into()
    } else {
        format!("{v:?}")
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn gauge(out: &mut String, name: &str, help: &str, labels: &str, v: f64) {
    header(out, name, "gauge", help);
    let _ = writeln!(out, "{name}{{{labels}}} {}", num(v));
}

/// Counters are declared without `_total` and sampled with it, as prometheus_client does.
fn counter(out: &mut String, name: &str, help: &str, samples: &[(String, f64)]) {
    header(out, name, "counter", help);
    for (labels, v) in samples {
        let _ = writeln!(out, "{name}_total{{{labels}}} {}", num(*v));
    }
}

fn histogram(out: &mut String, name: &str, help: &str, labels: &str, h: &Histogram) {
    header(out, name, "histogram", help);
    let cum = h.cumulative();
    for (i, b) in h.bounds.iter().enumerate() {
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"{}\"}} {}",
            num(*b),
            num(cum[i] as f64)
        );
    }
    let _ = writeln!(
        out,
        "{name}_bucket{{{labels},le=\"+Inf\"}} {}",
        num(h.count as f64)
    );
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", num(h.count as f64));
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", num(h.sum));
}

pub fn render(m: &MetricsSnapshot, model_name: &str) -> String {
    let l = format!("model_name=\"{}\"", esc(model_name));
    let mut out = String::new();
    gauge(
        &mut out,
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        &l,
        m.num_running as f64,
    );
    gauge(
        &mut out,
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        &l,
        m.num_waiting as f64,
    );
    counter(
        &mut out,
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        &[(l.clone(), m.prompt_tokens_total as f64)],
    );
    counter(
        &mut out,
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        &[(l.clone(), m.generation_tokens_total as f64)],
    );
    let success: Vec<(String, f64)> = m
        .request_success
        .iter()
        .map(|(r, v)| (format!("{l},finished_reason=\"{}\"", esc(r)), *v as f64))
        .collect();
    counter(
        &mut out,
        "vllm:request_success",
        "Count of successfully processed requests.",
        &success,
    );
    histogram(
        &mut out,
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &l,
        &m.time_to_first_token,
    );
    histogram(
        &mut out,
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &l,
        &m.e2e_latency,
    );
    counter(
        &mut out,
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        &[(l.clone(), m.prefix_cache_queries as f64)],
    );
    counter(
        &mut out,
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        &[(l.clone(), m.prefix_cache_hits as f64)],
    );
    counter(
        &mut out,
        "vllm:spec_decode_num_drafts",
        "Number of spec decoding drafts.",
        &[(l.clone(), m.spec_num_drafts as f64)],
    );
    counter(
        &mut out,
        "vllm:spec_decode_num_draft_tokens",
        "Number of draft tokens.",
        &[(l.clone(), m.spec_num_draft_tokens as f64)],
    );
    counter(
        &mut out,
        "vllm:spec_decode_num_accepted_tokens",
        "Number of accepted tokens.",
        &[(l.clone(), m.spec_num_accepted_tokens as f64)],
    );
    let per_pos: Vec<u64> = if m.spec_accepted_per_pos.is_empty() {
        vec![0]
    } else {
        m.spec_accepted_per_pos.clone()
    };
    let pos: Vec<(String, f64)> = per_pos
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("{l},position=\"{i}\""), *v as f64))
        .collect();
    counter(
        &mut out,
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "Accepted tokens per draft position.",
        &pos,
    );
    gauge(
        &mut out,
        "laguna:spec_k",
        "Draft tokens per step of the last DFlash decode step (adaptive k's choice, or the fixed k).",
        &l,
        m.spec_k as f64,
    );
    let ks: Vec<(String, f64)> = m
        .spec_k_steps
        .iter()
        .enumerate()
        .map(|(k, v)| (format!("{l},k=\"{k}\""), *v as f64))
        .collect();
    counter(
        &mut out,
        "laguna:spec_k_steps",
        "DFlash decode steps by draft tokens per step (k = 0: no draft that step).",
        &ks,
    );
    // laguna's own: how hard the batcher works.
    counter(
        &mut out,
        "laguna:engine_steps",
        "Forward steps the engine ran.",
        &[(l.clone(), m.num_steps as f64)],
    );
    gauge(
        &mut out,
        "laguna:max_batch_seqs",
        "Most sequences seen in one forward step.",
        &l,
        m.max_batch_seqs_seen as f64,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn renders_vllm_names() {
        let mut m = MetricsSnapshot {
            num_running: 2,
            prompt_tokens_total: 7,
            ..Default::default()
        };
        m.time_to_first_token.observe(0.05);
        *m.request_success.get_mut("stop").unwrap() += 1;
        let s = render(&m, "tiny");
        assert!(
            s.contains("vllm:num_requests_running{model_name=\"tiny\"} 2.0\n"),
            "{s}"
        );
        assert!(s.contains("vllm:prompt_tokens_total{model_name=\"tiny\"} 7.0\n"));
        assert!(s.contains(
            "vllm:request_success_total{model_name=\"tiny\",finished_reason=\"stop\"} 1.0\n"
        ));
        assert!(s.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.06\"} 1.0\n"
        ));
        assert!(s.contains("vllm:time_to_first_token_seconds_count{model_name=\"tiny\"} 1.0\n"));
        assert!(s.contains("vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"tiny\",position=\"0\"} 0.0\n"));
        assert!(s.contains("# TYPE vllm:e2e_request_latency_seconds histogram"));
    }
}
