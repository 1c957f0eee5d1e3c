//! `laguna bench --draft DIR --acceptance LIST --spec-k LIST`: measured DFlash tok/s at chosen
//! acceptance (`engine::spec::oracle`). A reference continuation is decoded without the draft;
//! then, for each acceptance A and each k (or `auto`, the adaptive controller with the step-time
//! table measured here first, as `laguna serve` does), one sequence runs `--gen` tokens through
//! `spec::step` (the fused device step when greedy, the generic driver when sampling) with the
//! real draft forward and verify, its proposals replaced so each step accepts the planned number.
//! Reports wall ms per step, accepted drafts per step, tok/s and its ratio to the same run's
//! no-draft decode with the same sampling: the greedy decode row for greedy runs, a plain
//! sampled decode measured here (`sampled_decode_ms`) for T > 0.
use super::bench_draft::parse_ks;
use anyhow::{Context, Result};
use laguna_engine::cuda::draft::CudaDraft;
use laguna_engine::cuda::CudaModel;
use laguna_engine::generate::{generate, GenerateRequest};
use laguna_engine::model::Model;
use laguna_engine::sample::SamplingParams;
use laguna_engine::spec::{
    step, Acceptance, DraftModel, Oracle, SpecController, SpecState, StepCosts,
};
use std::path::Path;
use std::sync::Arc;

/// A k column: fixed, or the adaptive controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KChoice {
    Fixed(usize),
    Auto,
}

/// `1,2,4,6,8,15`, `1..15`, `1..6,8,auto`: fixed k values and/or `auto`.
pub fn parse_k_choices(s: &str) -> Result<Vec<KChoice>> {
    let mut v = vec![];
    for part in s.split(',') {
        match part.trim() {
            "auto" => v.push(KChoice::Auto),
            p => v.extend(parse_ks(p)?.into_iter().map(KChoice::Fixed)),
        }
    }
    Ok(v)
}

/// `1,2,3,mean:4.03`.
pub fn parse_acceptances(s: &str) -> Result<Vec<Acceptance>> {
    s.split(',')
        .map(|x| Acceptance::parse(x).map_err(anyhow::Error::from))
        .collect()
}

pub struct Row {
    pub acceptance: Acceptance,
    pub k: KChoice,
    pub steps: usize,
    pub step_ms: f64,
    pub accepted_per_step: f64,
    pub mean_k: f64,
    pub tok_s: f64,
    pub ratio: f64,
}

pub struct Oracled {
    pub temperature: f32,
    /// The greedy no-draft decode step (the bench's decode row).
    pub decode_step_ms: f64,
    /// The no-draft decode step the rows are compared with: greedy for greedy runs, plain
    /// sampled decoding at the runs' settings for T > 0.
    pub baseline_step_ms: f64,
    pub costs: Option<StepCosts>,
    pub rows: Vec<Row>,
}

/// One oracle run of `gen` tokens; returns (steps, wall ms, accepted, drafted k summed, emitted).
#[allow(clippy::too_many_arguments)]
fn one(
    m: &mut CudaModel,
    d: &mut CudaDraft,
    prompt: &[u32],
    reference: &[u32],
    acc: Acceptance,
    k: KChoice,
    costs: Option<&Arc<StepCosts>>,
    sampling: &SamplingParams,
    gen: usize,
) -> Result<(usize, f64, usize, usize, usize)> {
    let k_max = d.config().block_size - 1;
    let k0 = match k {
        KChoice::Fixed(k) => k,
        KChoice::Auto => costs.map(|c| c.k_max()).unwrap_or(k_max),
    };
    let vocab = m.config().vocab_size;
    let mut s = SpecState::new(m, d, prompt, k0, sampling.clone())?;
    s.oracle = Some(Oracle::new(reference.to_vec(), acc, 1, vocab));
    if let (KChoice::Auto, Some(c)) = (k, costs) {
        s.controller = Some(SpecController::new(c.clone()));
    }
    let r = (|| -> Result<(usize, f64, usize, usize, usize)> {
        step(m, d, &mut [&mut s])?; // the prefill
        let t0 = std::time::Instant::now();
        let (mut steps, mut accepted, mut drafted, mut emitted) = (0, 0, 0, 0);
        while s.completion().len() < gen {
            let r = step(m, d, &mut [&mut s])?.pop().expect("one result");
            steps += 1;
            accepted += r.stats.num_accepted_tokens;
            drafted += r.stats.num_draft_tokens;
            emitted += r.tokens.len();
        }
        Ok((
            steps,
            t0.elapsed().as_secs_f64() * 1e3,
            accepted,
            drafted,
            emitted,
        ))
    })();
    s.free(m, d);
    r
}

#[allow(clippy::too_many_arguments)]
pub fn run(
    m: &mut CudaModel,
    dir: &Path,
    accs: &[Acceptance],
    ks: &[KChoice],
    prompt: &[u32],
    gen: usize,
    temperature: f32,
    decode_step_ms: f64,
) -> Result<Oracled> {
    let mut d = CudaDraft::load(dir, m)
        .with_context(|| format!("loading DFlash draft from {}", dir.display()))?;
    let k_max = d.config().block_size - 1;
    for k in ks {
        if let KChoice::Fixed(k) = k {
            d.config().check_k(*k)?;
        }
    }
    let sampling = SamplingParams {
        temperature,
        top_k: 0,
        top_p: 1.0,
        seed: Some(1),
    };
    // The reference: the plain continuation, long enough for the last step's k + 1 rows.
    let reference = generate(
        m,
        &GenerateRequest {
            prompt: prompt.to_vec(),
            max_tokens: gen + k_max + 1,
            sampling: sampling.clone(),
            ignore_eos: true,
            stop_token_ids: vec![],
        },
        false,
    )?
    .completion;
    let reference: Vec<u32> = prompt.iter().chain(&reference).copied().collect();
    // Sampled rows against sampled decoding (the reference's run captured its graphs).
    let baseline_step_ms = if temperature > 0.0 {
        // Plain decoding as without a draft: no taps.
        m.set_taps(&[]);
        m.set_taps_on_device(false)?;
        let ms = sampled_decode_ms(m, prompt, &sampling, gen)?;
        eprintln!(
            "no-draft sampled decode (T = {temperature}): {ms:.3} ms/step (greedy {decode_step_ms:.3})"
        );
        ms
    } else {
        decode_step_ms
    };
    let costs = if ks.contains(&KChoice::Auto) {
        let t0 = std::time::Instant::now();
        let c = StepCosts::measure(m, &mut d, k_max, &[1], prompt.len(), 2, 8)?;
        eprintln!(
            "step-time table (batch 1, k = 0..={k_max}) measured in {:.1} s: {:?} ms",
            t0.elapsed().as_secs_f64(),
            c.for_batch(1)
                .iter()
                .map(|x| (x * 1e3).round() / 1e3)
                .collect::<Vec<_>>()
        );
        Some(Arc::new(c))
    } else {
        None
    };
    let mut rows = vec![];
    for &acc in accs {
        for &k in ks {
            // A short run first: graph capture for this k (and the controller's ks).
            one(
                m,
                &mut d,
                prompt,
                &reference,
                acc,
                k,
                costs.as_ref(),
                &sampling,
                16.min(gen),
            )?;
            let (steps, ms, accepted, drafted, emitted) = one(
                m,
                &mut d,
                prompt,
                &reference,
                acc,
                k,
                costs.as_ref(),
                &sampling,
                gen,
            )?;
            let steps_f = steps.max(1) as f64;
            let tok_s = emitted as f64 / (ms / 1e3);
            let row = Row {
                acceptance: acc,
                k,
                steps,
                step_ms: ms / steps_f,
                accepted_per_step: accepted as f64 / steps_f,
                mean_k: drafted as f64 / steps_f,
                tok_s,
                ratio: tok_s * baseline_step_ms / 1e3,
            };
            eprintln!(
                "A={} k={}: {:.3} ms/step, {:.2} accepted/step (mean k {:.2}), {:.1} tok/s = {:.2}x no-draft decode (same sampling)",
                acc.label(),
                k_label(k),
                row.step_ms,
                row.accepted_per_step,
                row.mean_k,
                row.tok_s,
                row.ratio
            );
            rows.push(row);
        }
    }
    m.set_taps(&[]);
    m.set_taps_on_device(false)?;
    Ok(Oracled {
        temperature,
        decode_step_ms,
        baseline_step_ms,
        costs: costs.map(|c| (*c).clone()),
        rows,
    })
}

/// Plain (no draft) decoding's step at `sampling`, ms: `generate` (the device sampler,
/// pipelined, as `laguna serve` decodes) of `gen` + 1 tokens less that of 1 token (the prefill
/// and the first token), the median of three pairs.
fn sampled_decode_ms(
    m: &mut dyn Model,
    prompt: &[u32],
    sampling: &SamplingParams,
    gen: usize,
) -> Result<f64> {
    let mut timed = |max_tokens: usize| -> Result<f64> {
        let req = GenerateRequest {
            prompt: prompt.to_vec(),
            max_tokens,
            sampling: sampling.clone(),
            ignore_eos: true,
            stop_token_ids: vec![],
        };
        let t0 = std::time::Instant::now();
        let n = generate(m, &req, false)?.completion.len();
        anyhow::ensure!(
            n == max_tokens,
            "sampled decode stopped at {n} of {max_tokens} tokens"
        );
        Ok(t0.elapsed().as_secs_f64() * 1e3)
    };
    let mut per_step = vec![];
    for _ in 0..3 {
        let long = timed(gen + 1)?;
        let short = timed(1)?;
        per_step.push((long - short) / gen.max(1) as f64);
    }
    per_step.sort_by(f64::total_cmp);
    Ok(per_step[1])
}

fn k_label(k: KChoice) -> String {
    match k {
        KChoice::Fixed(k) => k.to_string(),
        KChoice::Auto => "auto".into(),
    }
}

pub fn print_table(o: &Oracled) {
    println!(
        "\nDFlash at oracle acceptance (batch 1, {}; `x no-draft` against no-draft {} decode {:.3} ms/step = {:.1} tok/s in the same run{}; `mean:A`: geometric accepted length with mean A, truncated at k):",
        if o.temperature > 0.0 {
            format!("T = {}", o.temperature)
        } else {
            "greedy".into()
        },
        if o.temperature > 0.0 { "sampled" } else { "greedy" },
        o.baseline_step_ms,
        1e3 / o.baseline_step_ms,
        if o.temperature > 0.0 {
            format!(" (greedy {:.3} ms/step)", o.decode_step_ms)
        } else {
            String::new()
        }
    );
    println!("| A | k | ms/step | accepted/step | mean k | tok/s | x no-draft |");
    println!("|---|---|---|---|---|---|---|");
    for r in &o.rows {
        println!(
            "| {} | {} | {:.3} | {:.2} | {:.2} | {:.1} | {:.2} |",
            r.acceptance.label(),
            k_label(r.k),
            r.step_ms,
            r.accepted_per_step,
            r.mean_k,
            r.tok_s,
            r.ratio
        );
    }
}

pub fn to_json(o: &Oracled) -> serde_json::Value {
    serde_json::json!({
        "temperature": o.temperature,
        "decode_step_ms": o.decode_step_ms,
        "baseline_step_ms": o.baseline_step_ms,
        "baseline": if o.temperature > 0.0 { "sampled" } else { "greedy" },
        "step_costs_ms": o.costs.as_ref().map(|c| c.by_batch.clone()),
        "rows": o.rows.iter().map(|r| serde_json::json!({
            "acceptance": r.acceptance.label(), "k": k_label(r.k), "steps": r.steps,
            "step_ms": r.step_ms, "accepted_per_step": r.accepted_per_step, "mean_k": r.mean_k,
            "tok_s": r.tok_s, "ratio_to_decode": r.ratio})).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_choices_and_acceptances() {
        assert_eq!(
            parse_k_choices("1,2,auto").unwrap(),
            vec![KChoice::Fixed(1), KChoice::Fixed(2), KChoice::Auto]
        );
        assert_eq!(parse_k_choices("auto").unwrap(), vec![KChoice::Auto]);
        assert_eq!(parse_k_choices("1..3").unwrap().len(), 3);
        assert_eq!(parse_k_choices("1..3,6,auto").unwrap().len(), 5);
        assert!(parse_k_choices("x").is_err());
        assert_eq!(
            parse_acceptances("1,mean:4.03").unwrap(),
            vec![Acceptance::Fixed(1), Acceptance::Mean(4.03)]
        );
        assert!(parse_acceptances("1,mean:x").is_err());
    }

    /// The sampled baseline on the CPU engine (a fixture): plain sampled decoding runs its
    /// `gen` + 1 and 1 tokens (EOS ignored) and gives a positive per-step time.
    #[test]
    fn sampled_baseline_times_plain_decoding() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/models/swa-yarn-perhead");
        if !dir.join("config.json").exists() {
            return;
        }
        let mut m = laguna_engine::cpu::CpuModel::load(&dir).unwrap();
        let sampling = SamplingParams {
            temperature: 0.8,
            top_k: 0,
            top_p: 1.0,
            seed: Some(1),
        };
        let ms = sampled_decode_ms(&mut m, &[1, 2, 3, 4], &sampling, 8).unwrap();
        assert!(ms.is_finite() && ms > 0.0, "{ms}");
    }
}
