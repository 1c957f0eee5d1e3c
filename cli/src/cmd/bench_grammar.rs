//! `laguna bench --grammar [SCHEMA.json]`: what constrained decoding costs. The same prompt is
//! decoded through the scheduler (as `laguna serve` runs it) three ways: plain (the device
//! sampling path on CUDA), plain with logprobs (host sampling: the path constrained rows take,
//! so the difference to it is the grammar's own cost), and under a JSON-schema grammar (the
//! server's grammar for `response_format` json_schema). Reports decode tok/s of each and the
//! mask time per token (computed beside the forward pass; what is left after the forward is
//! applying it).
use anyhow::{anyhow, bail, Context, Result};
use laguna_engine::config::LagunaConfig;
use laguna_engine::grammar::GrammarEnv;
use laguna_engine::sched::{Backend, Event, GenRequest, SchedConfig, Scheduler};
use laguna_engine::tokenizer::Tokenizer;
use laguna_stages::serve::constrain::{compile_with, Demand};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// A schema whose output never completes before `--gen` tokens: records in an array with a
/// lower bound on its length.
fn default_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "array",
        "minItems": 100000,
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "name": {"type": "string", "maxLength": 24},
                "score": {"type": "number"},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
                "ok": {"type": "boolean"}
            },
            "required": ["id", "name", "score", "tags", "ok"],
            "additionalProperties": false
        }
    })
}

struct Row {
    mode: &'static str,
    tokens: usize,
    ttft_ms: f64,
    tok_s: f64,
    mask_us: Option<f64>,
}

/// One request to the end: (tokens, TTFT ms, decode tok/s after the first token).
async fn decode(s: &Scheduler, req: GenRequest) -> Result<(usize, f64, f64)> {
    use laguna_engine::sched::Backend;
    let t0 = Instant::now();
    let mut st = s.submit(req).map_err(|e| anyhow!("{e}"))?;
    let (mut n, mut first) = (0usize, None);
    loop {
        match st.next().await {
            Some(Event::Delta { ids, .. }) => {
                n += ids.len();
                first.get_or_insert_with(Instant::now);
            }
            Some(Event::Finished { .. }) | None => break,
            Some(Event::Error(e)) => bail!("the request failed: {e}"),
        }
    }
    let first = first.ok_or_else(|| anyhow!("no token came back"))?;
    let ttft = (first - t0).as_secs_f64() * 1e3;
    let dec = first.elapsed().as_secs_f64();
    Ok((n, ttft, (n.saturating_sub(1)) as f64 / dec.max(1e-9)))
}

pub fn run(
    model: &Path,
    schema: Option<PathBuf>,
    prompt_len: usize,
    gen: usize,
    runs: usize,
    json: bool,
) -> Result<()> {
    let cfg = LagunaConfig::from_file(&model.join("config.json"))?;
    let tok = Tokenizer::from_dir(model)?.ok_or_else(|| {
        anyhow!(
            "{} has no tokenizer.json (a grammar needs one)",
            model.display()
        )
    })?;
    let schema = match schema {
        Some(p) => serde_json::from_str(
            &std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?,
        )
        .with_context(|| format!("{} is not JSON", p.display()))?,
        None => default_schema(),
    };
    let t = Instant::now();
    let env = GrammarEnv::new(&tok, cfg.vocab_size, &cfg.eos_token_ids)?;
    let env_ms = t.elapsed().as_secs_f64() * 1e3;
    let device = if laguna_engine::cuda::gpu_available().is_ok() {
        "cuda"
    } else {
        "cpu"
    };
    let opts = laguna_stages::serve::ServeOptions {
        device: device.into(),
        max_num_seqs: 1,
        ..Default::default()
    };
    let loader = laguna_stages::serve::model_loader(
        model.to_path_buf(),
        None,
        laguna_stages::recipe::SpecK::Fixed(1),
        device,
        &opts,
    )?;
    let sc = SchedConfig {
        max_num_seqs: 1,
        max_num_batched_tokens: 2048,
        max_model_len: prompt_len + gen + 1,
        max_waiting: 0,
        ..SchedConfig::default()
    };
    let s = Scheduler::start_loading(sc, loader, Some(Arc::new(tok)))?;
    loop {
        match s.health() {
            laguna_engine::sched::Health::Ready => break,
            laguna_engine::sched::Health::Failed(e) => {
                anyhow::bail!("the model failed to load: {e}")
            }
            laguna_engine::sched::Health::Loading => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
        }
    }
    let v = cfg.vocab_size as u64;
    let mut x = 0x2545F4914F6CDD1Du64;
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % (v - 16)) as u32 + 16
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut rows = vec![];
    for mode in ["plain", "plain+logprobs", "grammar"] {
        let (mut toks, mut ttfts, mut tps, mut masks) = (vec![], vec![], vec![], vec![]);
        for run in 0..runs + 1 {
            let mut req = GenRequest::greedy(prompt.clone(), gen);
            req.ignore_eos = true;
            let mut stats = None;
            match mode {
                "plain+logprobs" => req.logprobs = Some(0),
                "grammar" => {
                    let c = compile_with(&env, &Demand::Json(schema.clone()), false)
                        .map_err(|e| anyhow!("the schema: {}", e.message))?;
                    stats = Some(c.stats());
                    req.constraint = Some(c);
                }
                _ => {}
            }
            let (n, ttft, tp) = rt.block_on(decode(&s, req))?;
            if run == 0 {
                continue; // warm-up
            }
            if let Some(st) = stats {
                let (count, secs) = st.get();
                masks.push(secs * 1e6 / count.max(1) as f64);
            }
            toks.push(n as f64);
            ttfts.push(ttft);
            tps.push(tp);
        }
        rows.push(Row {
            mode,
            tokens: median(&mut toks) as usize,
            ttft_ms: median(&mut ttfts),
            tok_s: median(&mut tps),
            mask_us: (!masks.is_empty()).then(|| median(&mut masks)),
        });
    }
    eprintln!(
        "grammar bench on {device}: prompt {prompt_len}, gen {gen}, median of {runs}; grammar engine built in {env_ms:.0} ms"
    );
    for r in &rows {
        eprintln!(
            "  {:<15} {:>5} tokens  TTFT {:>8.2} ms  decode {:>8.2} tok/s ({:.3} ms/token){}",
            r.mode,
            r.tokens,
            r.ttft_ms,
            r.tok_s,
            1e3 / r.tok_s.max(1e-9),
            r.mask_us
                .map(|m| format!("  mask {m:.1} us/token (beside the forward)"))
                .unwrap_or_default()
        );
    }
    if json {
        let out: Vec<_> = rows
            .iter()
            .map(|r| serde_json::json!({"mode": r.mode, "tokens": r.tokens, "ttft_ms": r.ttft_ms, "tok_s": r.tok_s, "mask_us_per_token": r.mask_us}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"device": device, "prompt_len": prompt_len, "gen": gen, "grammar_env_ms": env_ms, "rows": out})
        );
    }
    Ok(())
}
