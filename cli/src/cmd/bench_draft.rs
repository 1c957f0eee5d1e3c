//! `laguna bench --draft DIR`: DFlash steps on the device (batch 1, greedy, the device loop), one row
//! per k: wall time per step, its split into draft / verify / context (CUDA events between the
//! step's three graphs, from a second pass with timing on), accepted tokens per step, measured
//! tok/s, and the step's ratio to the no-draft decode step measured earlier in the same run. With
//! random weights acceptance is ~0, so the table also gives the projected tok/s at a = 4.03
//! accepted drafts per step (the 5.03 tokens per step of the real pair at k = 6), labelled so.
use anyhow::{bail, Context, Result};
use laguna_engine::generate::GenerateRequest;
use laguna_engine::model::device::{DeviceModel, LoopTiming};
use laguna_engine::sample::SamplingParams;
use std::path::Path;

/// Accepted draft tokens per step used for the projection (seed: 5.03 tokens per step at k = 6).
pub const PROJECTED_ACCEPT: f64 = 4.03;

pub struct KRow {
    pub k: usize,
    pub steps: usize,
    pub step_ms: f64,
    pub draft_ms: f64,
    pub verify_ms: f64,
    pub ctx_ms: f64,
    pub accepted_per_step: f64,
    pub tok_s: f64,
    pub ratio: f64,
    pub projected_tok_s: f64,
}

/// Parse "6", "1..15" or "1,3,6,15".
pub fn parse_ks(s: &str) -> Result<Vec<usize>> {
    let s = s.trim();
    if let Some((a, b)) = s.split_once("..") {
        let a: usize = a.trim().parse().context("--sweep-k start")?;
        let b: usize = b
            .trim_start_matches('=')
            .trim()
            .parse()
            .context("--sweep-k end")?;
        if a == 0 || b < a {
            bail!("--sweep-k wants a range like 1..15 (inclusive), got {s}");
        }
        return Ok((a..=b).collect());
    }
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .with_context(|| format!("--sweep-k: `{x}` is not a number"))
        })
        .collect()
}

pub fn run(
    m: &mut dyn DeviceModel,
    dir: &Path,
    ks: &[usize],
    prompt: &[u32],
    gen: usize,
    decode_step_ms: f64,
) -> Result<Vec<KRow>> {
    let mut d = m
        .load_draft(dir)
        .with_context(|| format!("loading DFlash draft from {}", dir.display()))?;
    eprintln!(
        "draft loaded: {:.2} GB read per propose (layers + fc + lm_head)",
        d.step_weight_bytes() as f64 / 1e9
    );
    let req = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens: gen,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        stop_token_ids: vec![],
    };
    let mut rows = vec![];
    for &k in ks {
        // Warm-up (graph capture), then a timed pass without events, then one with events.
        d.generate_on_device(
            m,
            &GenerateRequest {
                max_tokens: 8.min(gen),
                ..req.clone()
            },
            k,
            false,
            LoopTiming::Wall,
        )?;
        let r = d.generate_on_device(m, &req, k, false, LoopTiming::Wall)?;
        let steps = r.times.steps.max(1);
        let step_ms = r.times.wall_ms / steps as f64;
        let emitted = r.completion.len().saturating_sub(1).max(1);
        let tok_s = emitted as f64 / (r.times.wall_ms / 1e3);
        let t = d.generate_on_device(m, &req, k, false, LoopTiming::Segments)?;
        let ts = t.times.steps.max(1) as f64;
        rows.push(KRow {
            k,
            steps,
            step_ms,
            draft_ms: t.times.draft_ms / ts,
            verify_ms: t.times.verify_ms / ts,
            ctx_ms: t.times.ctx_ms / ts,
            accepted_per_step: r.stats.num_accepted_tokens as f64 / steps as f64,
            tok_s,
            ratio: step_ms / decode_step_ms,
            projected_tok_s: (1.0 + PROJECTED_ACCEPT.min(k as f64)) / (step_ms / 1e3),
        });
        let x = rows.last().unwrap();
        eprintln!(
            "k={k}: step {:.3} ms ({:.2}x decode) = draft {:.3} + verify {:.3} + context {:.3} (+ host); accepted {:.2}/step; {:.1} tok/s measured; projected {:.1} tok/s at a={}",
            x.step_ms, x.ratio, x.draft_ms, x.verify_ms, x.ctx_ms, x.accepted_per_step, x.tok_s, x.projected_tok_s, PROJECTED_ACCEPT.min(k as f64)
        );
    }
    // Per-kernel breakdown of eager steps at k = 6 (the seed's k) when timed, else the last k.
    if let Some(&k) = ks.iter().find(|&&k| k == 6).or(ks.last()) {
        let r = d.generate_on_device(
            m,
            &GenerateRequest {
                max_tokens: 17,
                ..req.clone()
            },
            k,
            false,
            LoopTiming::Kernels,
        )?;
        let steps = r.times.steps.max(1) as f64;
        if let Some(ps) = r.kernels {
            for (name, v) in ["propose", "verify", "context"].into_iter().zip(ps) {
                let tot: f64 = v.iter().map(|x| x.1).sum();
                eprintln!("k={k} {name} (eager, per step): {:.3} ms", tot / steps);
                for (n, t, c) in v {
                    eprintln!(
                        "    {:<22} {:>8.3} ms {:>6.1} launches",
                        n,
                        t / steps,
                        c as f64 / steps
                    );
                }
            }
        }
    }
    m.set_taps(&[]);
    m.set_taps_on_device(false)?;
    Ok(rows)
}

pub fn print_table(rows: &[KRow], decode_step_ms: f64) {
    println!(
        "\nDFlash steps (batch 1, greedy; no-draft decode step {:.3} ms in the same run):",
        decode_step_ms
    );
    println!("| k | step ms | x decode | draft ms | verify ms | context ms | host+other ms | accepted/step | tok/s measured | tok/s projected (a=4.03) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let other = r.step_ms - r.draft_ms - r.verify_ms - r.ctx_ms;
        println!(
            "| {} | {:.3} | {:.2} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} | {:.1} | {:.1} (projection) |",
            r.k, r.step_ms, r.ratio, r.draft_ms, r.verify_ms, r.ctx_ms, other, r.accepted_per_step, r.tok_s, r.projected_tok_s
        );
    }
}

pub fn to_json(rows: &[KRow]) -> serde_json::Value {
    serde_json::Value::Array(
        rows.iter()
            .map(|r| {
                serde_json::json!({"k": r.k, "steps": r.steps, "step_ms": r.step_ms, "ratio_to_decode": r.ratio, "draft_ms": r.draft_ms,
                "verify_ms": r.verify_ms, "context_ms": r.ctx_ms, "accepted_per_step": r.accepted_per_step, "tok_s": r.tok_s,
                "projected_tok_s": r.projected_tok_s, "projected_accept": PROJECTED_ACCEPT})
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::parse_ks;

    #[test]
    fn k_lists_and_ranges() {
        assert_eq!(parse_ks("6").unwrap(), vec![6]);
        assert_eq!(parse_ks("1..4").unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(parse_ks("1..=3").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_ks("1,3,6,15").unwrap(), vec![1, 3, 6, 15]);
        assert!(parse_ks("5..2").is_err());
        assert!(parse_ks("x").is_err());
    }
}
