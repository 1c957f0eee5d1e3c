//! `laguna bench --agent-replay`: a synthetic coding-agent session through the scheduler with the
//! prefix cache (docs/design/prefix-cache.md). Each turn's prompt is the previous prompt, the
//! previous output (what the model generated, as a client sends it back) and new tokens, growing
//! linearly from `--agent-first` to `--agent-last` tokens over `--agent-turns` turns; each turn
//! generates `--agent-output` tokens. Per turn, TTFT of the cached turn (the session's prompt,
//! resumed from the cache) and of a cold prompt of the same length (its first token changed, so
//! nothing in the cache matches it), then the sums. With `--agent-resume C1,C2,..`: per context
//! length C, the TTFT of a turn resumed from C cached tokens with `--agent-new` new ones, against
//! the time to prefill only those new tokens at C (cold C + new, minus cold C, in the same run).
use anyhow::{bail, Context, Result};
use laguna_engine::sched::{Backend, Event, GenRequest, Health, SchedConfig, Scheduler};
use laguna_stages::recipe::SpecK;
use laguna_stages::serve::{model_loader, ServeOptions};
use std::time::Instant;

/// Session shape and where it runs.
pub struct Replay {
    pub model: std::path::PathBuf,
    pub draft: Option<std::path::PathBuf>,
    pub k: usize,
    pub device: String,
    pub pool_bytes: Option<usize>,
    pub kv_fp8: bool,
    pub max_rows: usize,
    pub turns: usize,
    pub first: usize,
    pub last: usize,
    pub output: usize,
    /// Cached context lengths to resume at (the `--agent-resume` mode; empty: the session).
    pub resume: Vec<usize>,
    /// New tokens after each resume point.
    pub new: usize,
    pub json: bool,
}

struct Turn {
    prompt: usize,
    cached: usize,
    ttft_cached: f64,
    ttft_cold: f64,
}

/// Submit and wait for the first token; returns (TTFT in s, cached tokens, generated ids).
fn timed(
    s: &Scheduler,
    rt: &tokio::runtime::Runtime,
    req: GenRequest,
) -> Result<(f64, usize, Vec<u32>)> {
    let t0 = Instant::now();
    let mut st = s.submit(req).map_err(|e| anyhow::anyhow!("submit: {e}"))?;
    rt.block_on(async {
        let mut ttft = None;
        let mut ids = vec![];
        while let Some(ev) = st.next().await {
            match ev {
                Event::Delta { ids: d, .. } => {
                    ttft.get_or_insert(t0.elapsed().as_secs_f64());
                    ids.extend(d);
                }
                Event::Finished { usage, .. } => {
                    return Ok((ttft.unwrap_or(0.0), usage.cached_tokens, ids));
                }
                Event::Error(e) => bail!("the engine failed: {e}"),
            }
        }
        bail!("the request ended without finishing")
    })
}

/// The scheduler with the prefix cache on, one sequence at a time, for sessions up to `max_len`;
/// and the model's vocabulary size.
fn start(r: &Replay, max_len: usize) -> Result<(Scheduler, u64)> {
    let cfg = laguna_engine::LagunaConfig::from_file(&r.model.join("config.json"))
        .with_context(|| format!("reading {}", r.model.display()))?;
    if max_len > cfg.max_position_embeddings {
        bail!(
            "the session reaches {max_len} positions, more than the model's max_position_embeddings ({})",
            cfg.max_position_embeddings
        );
    }
    let opts = ServeOptions {
        model: Some(r.model.clone()),
        draft: r.draft.clone(),
        num_speculative_tokens: SpecK::Fixed(r.k),
        device: r.device.clone(),
        kv_cache_memory_bytes: r.pool_bytes,
        kv_cache_fp8: r.kv_fp8,
        max_num_seqs: 1,
        ..ServeOptions::default()
    };
    let loader = model_loader(
        r.model.clone(),
        r.draft.clone(),
        SpecK::Fixed(r.k),
        &r.device,
        &opts,
    )?;
    let sched_cfg = SchedConfig {
        max_num_seqs: 1,
        max_num_batched_tokens: r.max_rows.max(1),
        max_model_len: max_len,
        max_waiting: 0,
        prefix_cache: true,
        ..SchedConfig::default()
    };
    let s = Scheduler::start_loading(sched_cfg, loader, None)?;
    loop {
        match s.health() {
            Health::Ready => return Ok((s, cfg.vocab_size as u64)),
            Health::Failed(e) => bail!("the model failed to load: {e}"),
            Health::Loading => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}

/// Fresh prompt tokens (xorshift over the vocabulary above the first 16 ids).
struct Fresh {
    x: u64,
    v: u64,
}

impl Fresh {
    fn take(&mut self, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| {
                self.x ^= self.x << 13;
                self.x ^= self.x >> 7;
                self.x ^= self.x << 17;
                (self.x % (self.v - 16)) as u32 + 16
            })
            .collect()
    }
}

pub fn run(r: &Replay) -> Result<()> {
    if !r.resume.is_empty() {
        return resume(r);
    }
    if r.turns == 0 || r.first == 0 || r.last < r.first {
        bail!("--agent-turns must be >= 1 and --agent-first <= --agent-last");
    }
    let (s, v) = start(r, r.last + r.output + 1)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut fresh = Fresh {
        x: 0x9E3779B97F4A7C15,
        v,
    };
    let mut prompt: Vec<u32> = vec![];
    let mut rows = vec![];
    for t in 0..r.turns {
        let len = if r.turns == 1 {
            r.first
        } else {
            r.first + (r.last - r.first) * t / (r.turns - 1)
        };
        if prompt.len() < len {
            let more = fresh.take(len - prompt.len());
            prompt.extend(more);
        }
        let mut req = GenRequest::greedy(prompt.clone(), r.output);
        req.ignore_eos = true;
        let (ttft_cached, cached, ids) = timed(&s, &rt, req)?;
        // Cold: the same length, nothing in common with the cache (first token changed, to a
        // different one each turn, so no cold prompt extends an earlier one).
        let mut cold = prompt.clone();
        cold[0] = ((cold[0] as u64 + 1 + t as u64) % v) as u32;
        let mut req = GenRequest::greedy(cold, 1);
        req.ignore_eos = true;
        let (ttft_cold, cold_cached, _) = timed(&s, &rt, req)?;
        if cold_cached > 0 {
            bail!(
                "the cold prompt of turn {} found {cold_cached} cached tokens",
                t + 1
            );
        }
        rows.push(Turn {
            prompt: prompt.len(),
            cached,
            ttft_cached,
            ttft_cold,
        });
        eprintln!(
            "turn {}: {} prompt tokens, {} cached: TTFT cold {:.3} s, cached {:.3} s",
            t + 1,
            prompt.len(),
            cached,
            ttft_cold,
            ttft_cached
        );
        prompt.extend(ids);
    }
    report(&rows, r, &s)
}

/// `--agent-resume`: per cached context length C, three requests on fresh tokens: a cold prompt
/// of C tokens (it fills the cache), the turn after it (C + its output + new tokens, resumed from
/// the cache), and a cold prompt as long as that turn (first token changed). The new tokens'
/// prefill at C is the difference of the two cold TTFTs; the target is cached <= 1.2x that.
fn resume(r: &Replay) -> Result<()> {
    let top = r.resume.iter().max().copied().unwrap_or(0);
    if r.resume.contains(&0) || r.new < 2 {
        bail!("--agent-resume lengths must be >= 1 and --agent-new >= 2");
    }
    let (s, v) = start(r, top + r.new + 2)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut fresh = Fresh {
        x: 0x2545F4914F6CDD1D,
        v,
    };
    // One short request first, so no timed one pays for first-use setup.
    let mut req = GenRequest::greedy(fresh.take(64.min(top)), 1);
    req.ignore_eos = true;
    timed(&s, &rt, req)?;
    println!(
        "resume on {} ({}): {} new tokens after the cached context",
        r.model.display(),
        r.device,
        r.new
    );
    println!("| cached context | cached | TTFT cold C (s) | TTFT cold C+new (s) | new-token prefill (s) | TTFT cached (s) | ratio |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for &c in &r.resume {
        let first = fresh.take(c);
        let mut req = GenRequest::greedy(first.clone(), 1);
        req.ignore_eos = true;
        let (cold_c, _, out) = timed(&s, &rt, req)?;
        let turn = [first, out, fresh.take(r.new - 1)].concat();
        let mut req = GenRequest::greedy(turn.clone(), 1);
        req.ignore_eos = true;
        let (cached_t, cached, _) = timed(&s, &rt, req)?;
        let mut cold = turn;
        cold[0] = ((cold[0] as u64 + 1) % v) as u32;
        let mut req = GenRequest::greedy(cold, 1);
        req.ignore_eos = true;
        let (cold_cn, hit, _) = timed(&s, &rt, req)?;
        if hit > 0 {
            bail!("the cold prompt at {c} found {hit} cached tokens");
        }
        let only_new = cold_cn - cold_c;
        println!(
            "| {c} | {cached} | {cold_c:.3} | {cold_cn:.3} | {only_new:.3} | {cached_t:.3} | {:.2}x |",
            cached_t / only_new.max(1e-9)
        );
    }
    Ok(())
}

fn report(rows: &[Turn], r: &Replay, s: &Scheduler) -> Result<()> {
    println!(
        "agent replay on {} ({}): {} turns, {} -> {} prompt tokens, {} output tokens a turn",
        r.model.display(),
        r.device,
        r.turns,
        r.first,
        r.last,
        r.output
    );
    println!("| turn | prompt | cached | new | TTFT cold (s) | TTFT cached (s) | speed-up |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let (mut sc, mut sw, mut sp, mut sn) = (0.0, 0.0, 0, 0);
    for (i, t) in rows.iter().enumerate() {
        println!(
            "| {} | {} | {} | {} | {:.3} | {:.3} | {:.2}x |",
            i + 1,
            t.prompt,
            t.cached,
            t.prompt - t.cached,
            t.ttft_cold,
            t.ttft_cached,
            t.ttft_cold / t.ttft_cached.max(1e-9)
        );
        sc += t.ttft_cold;
        sw += t.ttft_cached;
        sp += t.prompt;
        sn += t.prompt - t.cached;
    }
    println!(
        "| sum | {sp} | {} | {sn} | {sc:.3} | {sw:.3} | {:.2}x |",
        sp - sn,
        sc / sw.max(1e-9)
    );
    let m = s.metrics();
    eprintln!(
        "prefix cache: {} of {} queried prompt tokens hit (cold prompts included)",
        m.prefix_cache_hits, m.prefix_cache_queries
    );
    if r.json {
        let turns: Vec<_> = rows
            .iter()
            .map(|t| serde_json::json!({"prompt": t.prompt, "cached": t.cached, "ttft_cold_s": t.ttft_cold, "ttft_cached_s": t.ttft_cached}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"agent_replay": {"device": r.device, "turns": turns,
                "sum_ttft_cold_s": sc, "sum_ttft_cached_s": sw, "prompt_tokens": sp, "new_tokens": sn}})
        );
    }
    Ok(())
}
