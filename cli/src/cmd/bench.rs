//! `laguna bench`: load time, TTFT, warm decode tok/s (median of runs; the decode step is one
//! CUDA graph replay, the host reads only the sampled token), bytes a decode step reads, device
//! copy bandwidth measured in the same run, roofline fraction and a per-kernel time breakdown.
use anyhow::{bail, Context, Result};
use laguna_engine::config::AttnKind;
use laguna_engine::cuda::{CudaModel, CudaOptions};
use laguna_engine::model::{LogitRows, Model, StepInput};
use laguna_engine::sample_check;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long, default_value_t = 2048)]
    pub prompt_len: usize,
    #[arg(long, default_value_t = 256)]
    pub gen: usize,
    /// Timed runs (median reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// K/V pool in GiB (default: planned from free memory).
    #[arg(long)]
    pub pool_gib: Option<f64>,
    /// Rows per prefill pass.
    #[arg(long, default_value_t = 2048)]
    pub max_rows: usize,
    /// K/V element type: bf16 or fp8 (E4M3 with the checkpoint's k_scale / v_scale, else 1.0).
    #[arg(long, default_value = "bf16", value_parser = ["bf16", "fp8"])]
    pub kv_cache_dtype: String,
    /// Sequences with a sliding-window ring (their rings come out of the K/V pool first).
    #[arg(long, default_value_t = 2)]
    pub max_seqs: usize,
    /// One cold run only: prefill the prompt (passes of --max-rows), then decode --gen tokens;
    /// reports TTFT and decode speed at that context. For long prompts (e.g. 262000 with
    /// --pool-gib 12); no warm-up, kernel A/B or breakdown.
    #[arg(long)]
    pub long_context: bool,
    /// Run decode steps eagerly instead of replaying a CUDA graph.
    #[arg(long)]
    pub no_graph: bool,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// DFlash draft folder: also time speculative steps (see `--num-speculative-tokens`, `--sweep-k`).
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// Draft tokens per step with --draft.
    #[arg(long, default_value_t = 6, requires = "draft")]
    pub num_speculative_tokens: usize,
    /// Time several k with --draft: a range `1..15` (inclusive) or a list `1,3,6,15`; with
    /// --acceptance also `auto` (the adaptive controller), e.g. `1,2,4,6,8,15,auto`.
    #[arg(long, visible_alias = "spec-k", requires = "draft")]
    pub sweep_k: Option<String>,
    /// With --draft: measured DFlash at oracle acceptance instead of the draft's own. A list of
    /// accepted drafts per step: `A` exactly min(A, k) every step, `mean:A` a seeded geometric
    /// accepted length with mean A (per-token rate A/(1+A)) truncated at k; e.g.
    /// `1,2,3,4,5,6,mean:1.4,mean:4.03`. The real draft forward and verify run; the proposals are
    /// the plain decode's tokens up to the planned rejection (docs/design/dflash.md).
    #[arg(long, requires = "draft")]
    pub acceptance: Option<String>,
    /// With --acceptance: sampling temperature (0 = greedy; > 0 runs the sampled DFlash path).
    #[arg(long, default_value_t = 0.0, requires = "acceptance")]
    pub temperature: f32,
    /// A synthetic agent session through the scheduler with the prefix cache: per turn, TTFT
    /// cold and cached (see the `--agent-*` options; `--max-rows` is the step's token budget).
    #[arg(long)]
    pub agent_replay: bool,
    /// --agent-replay: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cuda")]
    pub device: String,
    /// --agent-replay: turns of the session.
    #[arg(long, default_value_t = 8)]
    pub agent_turns: usize,
    /// --agent-replay: prompt tokens of the first turn.
    #[arg(long, default_value_t = 8192)]
    pub agent_first: usize,
    /// --agent-replay: prompt tokens of the last turn (turns grow linearly).
    #[arg(long, default_value_t = 65536)]
    pub agent_last: usize,
    /// --agent-replay: tokens generated each turn.
    #[arg(long, default_value_t = 300)]
    pub agent_output: usize,
    /// --agent-replay: instead of the session, resume at each of these cached context lengths
    /// (e.g. `32768,131072`) with `--agent-new` new tokens: the cached turn's TTFT against the
    /// time to prefill only the new tokens there (cold C + new minus cold C).
    #[arg(long, value_delimiter = ',')]
    pub agent_resume: Vec<usize>,
    /// --agent-resume: new tokens after the cached context.
    #[arg(long, default_value_t = 2048)]
    pub agent_new: usize,
    /// Constrained decoding: decode through the scheduler with and without a JSON-schema grammar
    /// (this schema file, or a built-in one) and report tok/s and the mask time per token (on
    /// the CPU when there is no GPU).
    #[arg(long, num_args = 0..=1, value_name = "SCHEMA_JSON")]
    pub grammar: Option<Option<PathBuf>>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

pub fn run(a: Args) -> Result<()> {
    if a.agent_replay {
        return agent_replay(&a);
    }
    if let Some(schema) = a.grammar.clone() {
        return super::bench_grammar::run(&a.model, schema, a.prompt_len, a.gen, a.runs, a.json);
    }
    if let Err(e) = laguna_engine::cuda::gpu_available() {
        bail!("laguna bench needs a CUDA GPU: {e}");
    }
    let mut m = load(&a)?;
    let cfg = m.config().clone();
    let v = cfg.vocab_size;
    let bw = m.copy_bandwidth(2 << 30)?;
    let prompt = random_prompt(a.prompt_len, v);
    if a.long_context {
        return long_run(&mut m, &prompt, &a);
    }
    let mut greedy = greedy_runs(&mut m, &prompt, &a)?;
    let step_rows = decode_step_rows(&mut m, &prompt, &a)?;
    let grid = sample_check::grid(v, 11, |rows, items| m.sample_logits(rows, items))?;
    let tok_s_plain = median(&mut greedy.tps.clone());
    let (oracle, spec_rows) = dflash_rows(&mut m, &prompt, &a, 1e3 / tok_s_plain)?;
    let prof = kernel_profiles(&mut m, &prompt, &greedy.tokens)?;
    let finite = greedy.finite && prof.finite;
    let ttft = median(&mut greedy.ttfts);
    let tok_s = median(&mut greedy.tps);
    // Bytes per decode step at the mean context of the timed decode.
    let kv_bytes = kv_bytes_per_step(&m, &cfg, a.prompt_len + a.gen / 2);
    let bytes = m.decode_weight_bytes + kv_bytes;
    let roofline = bytes as f64 * tok_s / bw;
    // The same fraction for the serving path: `decode_step` greedy, one sequence, pipelined (what
    // `laguna serve` and `generate` run once a prompt is in; no host round trip between steps).
    let roofline_serving = step_rows
        .iter()
        .find(|r| r.0 == "greedy, 1 sequence, pipelined")
        .map(|r| bytes as f64 * r.1 / bw);
    let kernel_total: f64 = prof.decode.iter().map(|b| b.1).sum();
    let gb10 = super::bench_gb10::from_bench(
        &m,
        &a,
        bw,
        &step_rows,
        greedy.replay_ms,
        tok_s,
        spec_rows.as_deref(),
    )?;
    let greedy_fnv = fnv64(&greedy.tokens);
    let report = Report {
        ttft,
        tok_s,
        bytes,
        kv_bytes,
        bw,
        roofline,
        roofline_serving,
        finite,
        greedy_tokens: greedy.tokens.len(),
        greedy_fnv,
        replay_ms: greedy.replay_ms,
        kernel_total,
        prof,
        step_rows,
        grid,
        spec_rows,
        gb10,
        oracle,
    };
    if a.json {
        report.print_json(&m, &a);
    } else {
        report.print_table(&m, &a, v);
    }
    if !finite {
        bail!("non-finite logits");
    }
    if report.grid.mismatches > 0 {
        bail!(
            "the device sampler picked a different token than the host sampler in {} of {} cases",
            report.grid.mismatches,
            report.grid.cases
        );
    }
    Ok(())
}

/// `--agent-replay`: the agent-session replay of bench_agent.rs.
fn agent_replay(a: &Args) -> Result<()> {
    super::bench_agent::run(&super::bench_agent::Replay {
        model: a.model.clone(),
        draft: a.draft.clone(),
        k: a.num_speculative_tokens,
        device: a.device.clone(),
        pool_bytes: a.pool_gib.map(|g| (g * (1u64 << 30) as f64) as usize),
        kv_fp8: a.kv_cache_dtype == "fp8",
        max_rows: a.max_rows,
        turns: a.agent_turns,
        first: a.agent_first,
        last: a.agent_last,
        output: a.agent_output,
        resume: a.agent_resume.clone(),
        new: a.agent_new,
        json: a.json,
    })
}

/// The model on the GPU with the bench's options, its load and K/V sizes reported on stderr.
fn load(a: &Args) -> Result<CudaModel> {
    let opts = CudaOptions {
        kv_pool_bytes: a.pool_gib.map(|g| (g * (1u64 << 30) as f64) as usize),
        max_rows: a.max_rows,
        graphs: !a.no_graph,
        progress: !a.json,
        max_seqs: a.max_seqs,
        kv_fp8: a.kv_cache_dtype == "fp8",
        ..Default::default()
    };
    let m = CudaModel::load(&a.model, opts)
        .with_context(|| format!("loading {}", a.model.display()))?;
    eprintln!(
        "loaded {:.2} GB of weights in {:.1}s on {} ({})",
        m.weight_bytes as f64 / 1e9,
        m.load_secs,
        m.device_name(),
        m.arch()
    );
    let (pages, ps, pool_bytes) = m.kv_pool();
    let (ring, ring_seqs, ring_bytes) = m.kv_rings();
    eprintln!(
        "K/V ({}): {} positions per sequence, pool {} pages x {ps} = {} positions ({:.2} GiB), rings {ring} slots x {ring_seqs} sequences ({:.3} GiB)",
        a.kv_cache_dtype,
        m.kv_capacity(),
        pages,
        pages * ps,
        pool_bytes as f64 / (1u64 << 30) as f64,
        ring_bytes as f64 / (1u64 << 30) as f64
    );
    Ok(m)
}

/// Deterministic pseudo-random prompt of `len` tokens below `vocab`, above the first 16 ids.
fn random_prompt(len: usize, vocab: usize) -> Vec<u32> {
    let mut x = 0x2545F4914F6CDD1Du64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % (vocab as u64 - 16)) as u32 + 16
        })
        .collect()
}

/// What the timed greedy runs measured (the warm-up run excluded).
struct GreedyRuns {
    ttfts: Vec<f64>,
    tps: Vec<f64>,
    /// The last step's graph replayed back to back, ms a step.
    replay_ms: Option<f64>,
    finite: bool,
    /// The last timed run's tokens: the prefill's, then one a decode step.
    tokens: Vec<u32>,
}

/// `runs` + 1 greedy runs (the first a warm-up): a prefill of the prompt (TTFT), then `gen`
/// `decode_greedy` steps.
fn greedy_runs(m: &mut CudaModel, prompt: &[u32], a: &Args) -> Result<GreedyRuns> {
    let mut ttfts = vec![];
    let mut tps = vec![];
    let mut replay_ms: Option<f64> = None;
    let mut finite = true;
    let mut tokens_out = vec![];
    for run in 0..a.runs + 1 {
        let s = m.new_seq()?;
        let t0 = std::time::Instant::now();
        let out = m
            .forward(&[StepInput {
                seq: s,
                tokens: prompt,
                start_pos: 0,
                logits: LogitRows::Last,
            }])?
            .remove(0);
        let ttft = t0.elapsed().as_secs_f64();
        finite &= out.logits.iter().all(|x| x.is_finite());
        let mut tok = out
            .logits
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &x)| if x > b.1 { (i, x) } else { b },
            )
            .0 as u32;
        let t1 = std::time::Instant::now();
        let mut toks = vec![tok];
        let mut none = None;
        for _ in 0..a.gen {
            tok = m.decode_greedy(s, tok, &mut none)?;
            toks.push(tok);
        }
        let dt = t1.elapsed().as_secs_f64();
        // The last run: the same graph replayed back to back (no host work in between), so the
        // decode row's time splits into the GPU's step and the host's share between steps.
        if run == a.runs && !a.no_graph {
            replay_ms = m.replay_decode_graph(64)?;
            // LAGUNA_STAMP builds: where the replayed step's time goes, launch by launch.
            if let Some(t) = m.decode_timeline()? {
                eprintln!("decode step timeline (LAGUNA_STAMP):\n{t}");
            }
        }
        m.free_seq(s);
        if run == 0 {
            continue; // warm-up (graph capture, first-touch)
        }
        ttfts.push(ttft);
        tps.push(a.gen as f64 / dt);
        tokens_out = toks;
    }
    Ok(GreedyRuns {
        ttfts,
        tps,
        replay_ms,
        finite,
        tokens: tokens_out,
    })
}

/// The serving path: `Model::decode_step` (what `laguna serve` and `generate` run once the
/// prompt is in) with tokens drawn on the device, 1 and 4 sequences, greedy and T = 0.8 /
/// top-p 0.95. Rows of (label, tok/s, ms a step).
fn decode_step_rows(
    m: &mut CudaModel,
    prompt: &[u32],
    a: &Args,
) -> Result<Vec<(String, f64, f64)>> {
    use laguna_engine::model::DecodeItem;
    use laguna_engine::sample::{Rng, SamplingParams};
    let mut rows = vec![];
    let greedy = SamplingParams::greedy();
    let hot = SamplingParams {
        temperature: 0.8,
        top_k: 0,
        top_p: 0.95,
        seed: Some(1),
    };
    let many = a.max_seqs.clamp(1, 4);
    for (label, nseq, sp) in [
        ("greedy, 1 sequence", 1usize, &greedy),
        ("T 0.8 top-p 0.95, 1 sequence", 1, &hot),
        ("T 0.8 top-p 0.95, --max-seqs sequences", many, &hot),
    ] {
        // Each case twice from the same prompt and Rng: one `decode_step` a token (host reads
        // each token before the next step), then pipelined as the server and `generate` run
        // it (`decode_launch` of step i + 1, fed on the device, before `decode_collect` of
        // step i). Both must draw the same tokens.
        let mut drawn: Vec<Vec<u32>> = vec![];
        for pipelined in [false, true] {
            let mut rng = Rng::new(7);
            let mut seqs = vec![];
            for _ in 0..nseq {
                let s = m.new_seq()?;
                m.forward(&[StepInput {
                    seq: s,
                    tokens: prompt,
                    start_pos: 0,
                    logits: LogitRows::None,
                }])?;
                seqs.push(s);
            }
            let mut toks: Vec<u32> = vec![prompt[0]; nseq];
            let mut all = vec![];
            let steps = 4 + a.gen;
            let mut t0 = std::time::Instant::now();
            for i in 0..steps {
                if i == 4 && !pipelined {
                    t0 = std::time::Instant::now();
                }
                let us: Vec<f64> = (0..nseq).map(|_| rng.uniform()).collect();
                let items: Vec<DecodeItem> = (0..nseq)
                    .map(|j| DecodeItem {
                        seq: seqs[j],
                        token: toks[j],
                        params: sp,
                        u: us[j],
                        prev: (pipelined && i > 0).then_some(j),
                    })
                    .collect();
                if pipelined {
                    m.decode_launch(&items)?;
                    if i > 0 {
                        all.extend(m.decode_collect()?);
                    }
                    if i == 4 {
                        t0 = std::time::Instant::now();
                    }
                } else {
                    toks = m.decode_step(&items)?;
                    all.extend(&toks);
                }
            }
            if pipelined {
                all.extend(m.decode_collect()?);
            }
            let dt = t0.elapsed().as_secs_f64();
            for s in seqs {
                m.free_seq(s);
            }
            drawn.push(all);
            rows.push((
                format!("{label}{}", if pipelined { ", pipelined" } else { "" }),
                nseq as f64 * a.gen as f64 / dt,
                1e3 * dt / a.gen as f64,
            ));
        }
        if drawn[0] != drawn[1] {
            anyhow::bail!(
                "decode_step ({label}): the pipelined steps drew other tokens than one step at a time"
            );
        }
    }
    Ok(rows)
}

/// With `--draft`: the acceptance oracle's table (with `--acceptance`) or the DFlash step rows.
fn dflash_rows(
    m: &mut CudaModel,
    prompt: &[u32],
    a: &Args,
    decode_step_ms: f64,
) -> Result<(
    Option<super::bench_oracle::Oracled>,
    Option<Vec<super::bench_draft::KRow>>,
)> {
    let oracle = match (&a.draft, &a.acceptance) {
        (Some(dir), Some(acc)) => Some(super::bench_oracle::run(
            m,
            dir,
            &super::bench_oracle::parse_acceptances(acc)?,
            &super::bench_oracle::parse_k_choices(
                a.sweep_k
                    .as_deref()
                    .unwrap_or(&a.num_speculative_tokens.to_string()),
            )?,
            prompt,
            a.gen,
            a.temperature,
            decode_step_ms,
        )?),
        _ => None,
    };
    let spec_rows = match &a.draft {
        Some(_) if oracle.is_some() => None,
        Some(dir) => {
            let ks = match &a.sweep_k {
                Some(s) => super::bench_draft::parse_ks(s)?,
                None => vec![a.num_speculative_tokens],
            };
            Some(super::bench_draft::run(
                m,
                dir,
                &ks,
                prompt,
                a.gen,
                decode_step_ms,
            )?)
        }
        None => None,
    };
    Ok((oracle, spec_rows))
}

/// The per-kernel profiles: one prefill, and [`PROFILED_STEPS`] eager decode steps.
struct KernelProfiles {
    /// The teacher-forced decode logits were finite.
    finite: bool,
    /// (kernel, ms, launches) of one prefill of the prompt.
    prefill: Vec<(String, f64, usize)>,
    /// (kernel, ms, launches) over [`PROFILED_STEPS`] eager decode steps.
    decode: Vec<(String, f64, usize)>,
}

const PROFILED_STEPS: usize = 16;

/// A finite check of decode logits (one teacher-forced step through the Model trait), then the
/// per-kernel breakdowns of one prefill and of [`PROFILED_STEPS`] eager decode steps.
fn kernel_profiles(
    m: &mut CudaModel,
    prompt: &[u32],
    tokens_out: &[u32],
) -> Result<KernelProfiles> {
    let s = m.new_seq()?;
    m.forward(&[StepInput {
        seq: s,
        tokens: prompt,
        start_pos: 0,
        logits: LogitRows::None,
    }])?;
    let o = m.forward(&[StepInput {
        seq: s,
        tokens: &tokens_out[..8.min(tokens_out.len())],
        start_pos: prompt.len(),
        logits: LogitRows::All,
    }])?;
    let finite = o[0].logits.iter().all(|x| x.is_finite());
    // Per-kernel breakdown of one prefill.
    m.set_profiling(true);
    let sp = m.new_seq()?;
    m.forward(&[StepInput {
        seq: sp,
        tokens: prompt,
        start_pos: 0,
        logits: LogitRows::Last,
    }])?;
    let prefill = m.take_profile();
    m.set_profiling(false);
    m.free_seq(sp);
    // Per-kernel breakdown over 16 eager decode steps.
    let mut prof = Some(laguna_engine::cuda::Prof::default());
    let mut tok = *tokens_out.last().unwrap_or(&1);
    for _ in 0..PROFILED_STEPS {
        tok = m.decode_greedy(s, tok, &mut prof)?;
    }
    let decode = prof.unwrap().summary();
    m.free_seq(s);
    Ok(KernelProfiles {
        finite,
        prefill,
        decode,
    })
}

/// K/V bytes a decode step reads at context `ctx` (sliding layers capped at the window).
fn kv_bytes_per_step(
    m: &CudaModel,
    cfg: &laguna_engine::config::LagunaConfig,
    ctx: usize,
) -> usize {
    let kvw = cfg.num_kv_heads * cfg.head_dim;
    cfg.layers
        .iter()
        .map(|l| {
            let n = match (l.attn, cfg.sliding_window) {
                (AttnKind::Sliding, Some(w)) => ctx.min(w),
                _ => ctx,
            };
            n * kvw * 2 * if m.kv_fp8() { 1 } else { 2 }
        })
        .sum()
}

/// The greedy tokens as one FNV-1a 64 fingerprint: two kernel sets that give the same bits give
/// the same value (greedy decoding of random weights turns any rounding difference into other
/// tokens within a few steps), so an A/B of bit-identical families shows equal fingerprints.
fn fnv64(tokens: &[u32]) -> u64 {
    tokens.iter().fold(0xcbf29ce484222325u64, |h, t| {
        t.to_le_bytes()
            .iter()
            .fold(h, |h, b| (h ^ *b as u64).wrapping_mul(0x100000001b3))
    })
}

/// Everything `laguna bench` prints, as JSON or as a table.
struct Report {
    ttft: f64,
    tok_s: f64,
    bytes: usize,
    kv_bytes: usize,
    bw: f64,
    roofline: f64,
    roofline_serving: Option<f64>,
    finite: bool,
    greedy_tokens: usize,
    greedy_fnv: u64,
    replay_ms: Option<f64>,
    kernel_total: f64,
    prof: KernelProfiles,
    step_rows: Vec<(String, f64, f64)>,
    grid: sample_check::SampleCheck,
    spec_rows: Option<Vec<super::bench_draft::KRow>>,
    gb10: Option<super::bench_gb10::Projection>,
    oracle: Option<super::bench_oracle::Oracled>,
}

impl Report {
    fn print_json(&self, m: &CudaModel, a: &Args) {
        let Report {
            ttft,
            tok_s,
            bytes,
            kv_bytes,
            bw,
            roofline,
            roofline_serving,
            finite,
            greedy_fnv,
            replay_ms,
            kernel_total,
            ..
        } = *self;
        let steps = PROFILED_STEPS;
        let ks: Vec<_> = self.prof.decode
            .iter()
            .map(|(n, t, c)| serde_json::json!({"kernel": n, "ms_per_step": t / steps as f64, "launches_per_step": *c as f64 / steps as f64}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"device": m.device_name(), "arch": m.arch(), "load_s": m.load_secs, "weight_bytes": m.weight_bytes,
                "prompt_len": a.prompt_len, "gen": a.gen, "ttft_ms": ttft * 1e3, "decode_tok_s": tok_s, "bytes_per_token": bytes,
                "weight_bytes_per_token": m.decode_weight_bytes, "kv_bytes_per_token": kv_bytes,
                "copy_bw_bytes_s": bw, "roofline_fraction": roofline, "roofline_fraction_serving": roofline_serving, "finite": finite, "greedy_tokens": self.greedy_tokens, "greedy_fnv64": format!("{greedy_fnv:016x}"), "graphs": !a.no_graph, "kernels": ks,
                "kernel_ms_per_step_eager": kernel_total / steps as f64, "decode_graph_replay_ms": replay_ms,
                "prefill_kernels": self.prof.prefill.iter().map(|(n, t, c)| serde_json::json!({"kernel": n, "ms": t, "launches": c})).collect::<Vec<_>>(),
                "dflash": self.spec_rows.as_ref().map(|r| super::bench_draft::to_json(r)), "gb10_projection": self.gb10.as_ref().map(|g| g.to_json()),
                "dflash_oracle": self.oracle.as_ref().map(super::bench_oracle::to_json)})
        );
    }

    fn print_table(&self, m: &CudaModel, a: &Args, v: usize) {
        let Report {
            ttft,
            tok_s,
            bytes,
            kv_bytes,
            bw,
            roofline,
            roofline_serving,
            finite,
            greedy_fnv,
            replay_ms,
            kernel_total,
            ..
        } = *self;
        let steps = PROFILED_STEPS;
        let prefill_kernels = &self.prof.prefill;
        let ptot: f64 = prefill_kernels.iter().map(|b| b.1).sum();
        println!(
            "per-kernel time of one {}-token prefill (CUDA events):",
            a.prompt_len
        );
        for (n, t, c) in prefill_kernels {
            println!(
                "  {:<20} {:>9.3} ms  {:>5.1}%  {:>5} launches",
                n,
                t,
                100.0 * t / ptot.max(1e-9),
                c
            );
        }
        println!("per-kernel time per decode step (eager, CUDA events):");
        for (n, t, c) in &self.prof.decode {
            println!(
                "  {:<20} {:>8.3} ms  {:>5.1}%  {:>4} launches",
                n,
                t / steps as f64,
                100.0 * t / kernel_total.max(1e-9),
                c / steps
            );
        }
        println!("\n| metric | value |\n|---|---|");
        println!("| device | {} ({}) |", m.device_name(), m.arch());
        let (stag, peak) = m.moe_stagger();
        println!(
            "| moe_block_1 issue stagger | {stag} ns a warp (peak DRAM {:.2} TB/s) |",
            peak / 1e12
        );
        println!(
            "| load | {:.1} s ({:.2} GB) |",
            m.load_secs,
            m.weight_bytes as f64 / 1e9
        );
        println!("| TTFT ({} tokens) | {:.1} ms |", a.prompt_len, ttft * 1e3);
        println!(
            "| decode (median of {}, {} tokens, graphs {}) | {:.1} tok/s |",
            a.runs, a.gen, !a.no_graph, tok_s
        );
        println!(
            "| bytes per decode step | {:.3} GB (weights {:.3} + KV {:.3}) |",
            bytes as f64 / 1e9,
            m.decode_weight_bytes as f64 / 1e9,
            kv_bytes as f64 / 1e9
        );
        if let Some(ms) = replay_ms {
            println!(
                "| decode graph replayed back to back (64 x the last step; no host in between) | {ms:.3} ms/step ({:.1} tok/s; host between steps {:.1} us) |",
                1e3 / ms,
                (1e3 / tok_s - ms) * 1e3
            );
        }
        println!("| copy bandwidth (read+write) | {:.2} TB/s |", bw / 1e12);
        println!("| roofline fraction | {:.1}% |", roofline * 100.0);
        if let Some(r) = roofline_serving {
            println!(
                "| roofline fraction, serving path (decode_step greedy, 1 sequence, pipelined) | {:.1}% |",
                r * 100.0
            );
        }
        println!(
            "| eager kernel time per step | {:.3} ms |",
            kernel_total / steps as f64
        );
        println!("| finite | {finite} |");
        println!(
            "| greedy tokens ({}, FNV-1a 64) | {greedy_fnv:016x} |",
            self.greedy_tokens
        );
        for (label, tps, ms) in &self.step_rows {
            println!(
                "| decode_step ({label}, {} tokens each) | {tps:.1} tok/s ({ms:.3} ms/step) |",
                a.gen
            );
        }
        let grid = &self.grid;
        println!(
            "| device sampler = host sampler (vocab {v}: 5 logit shapes x T x top-k x top-p x 3 draws) | {} of {} differ |",
            grid.mismatches, grid.cases
        );
        for d in &grid.detail {
            println!("|   differs | {d} |");
        }
        if let Some(r) = &self.spec_rows {
            super::bench_draft::print_table(r, 1e3 / tok_s);
        }
        if let Some(g) = &self.gb10 {
            g.print();
        }
        if let Some(o) = &self.oracle {
            super::bench_oracle::print_table(o);
        }
    }
}

/// `--long-context`: one cold prefill of the whole prompt, then `gen` greedy decode steps.
fn long_run(m: &mut CudaModel, prompt: &[u32], a: &Args) -> Result<()> {
    let n = prompt.len();
    if n + a.gen > m.kv_capacity() {
        bail!("a {n}-token prompt + {} tokens does not fit the K/V pool ({} positions); give a larger --pool-gib", a.gen, m.kv_capacity());
    }
    let s = m.new_seq()?;
    let t0 = std::time::Instant::now();
    let out = m
        .forward(&[StepInput {
            seq: s,
            tokens: prompt,
            start_pos: 0,
            logits: LogitRows::Last,
        }])?
        .remove(0);
    let ttft = t0.elapsed().as_secs_f64();
    let mut finite = out.logits.iter().all(|x| x.is_finite());
    let mut tok = laguna_engine::sample::argmax(&out.logits) as u32;
    let mut none = None;
    // First steps capture the graph; time the rest.
    let warm = 4.min(a.gen);
    for _ in 0..warm {
        tok = m.decode_greedy(s, tok, &mut none)?;
    }
    let t1 = std::time::Instant::now();
    for _ in warm..a.gen {
        tok = m.decode_greedy(s, tok, &mut none)?;
    }
    let dt = t1.elapsed().as_secs_f64();
    let steps = a.gen - warm;
    let o = m.forward(&[StepInput {
        seq: s,
        tokens: &[tok],
        start_pos: n + a.gen,
        logits: LogitRows::All,
    }])?;
    finite &= o[0].logits.iter().all(|x| x.is_finite());
    m.free_seq(s);
    let tok_s = steps as f64 / dt.max(1e-9);
    if a.json {
        println!(
            "{}",
            serde_json::json!({"device": m.device_name(), "prompt_len": n, "kv_cache_dtype": a.kv_cache_dtype, "kv_positions": m.kv_capacity(),
                "ttft_s": ttft, "prefill_tok_s": n as f64 / ttft, "decode_steps": steps, "decode_tok_s": tok_s, "finite": finite})
        );
    } else {
        println!("\n| metric | value |\n|---|---|");
        println!("| device | {} ({}) |", m.device_name(), m.arch());
        println!(
            "| prompt | {n} tokens, K/V {} ({} positions per sequence) |",
            a.kv_cache_dtype,
            m.kv_capacity()
        );
        println!(
            "| TTFT (cold, passes of {} rows) | {:.1} s ({:.0} tok/s) |",
            a.max_rows,
            ttft,
            n as f64 / ttft
        );
        println!(
            "| decode at {n}+ context ({steps} steps after {warm}) | {:.1} tok/s ({:.2} ms/step) |",
            tok_s,
            1e3 / tok_s
        );
        println!("| finite | {finite} |");
    }
    if !finite {
        bail!("non-finite logits");
    }
    Ok(())
}
