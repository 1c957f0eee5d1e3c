//! The per-case checks of the sweep, on any `dyn Model` against the CPU reference rows:
//! one pass, chunked prefill + 1-row decode steps, batch invariance with a second sequence,
//! greedy tokens through `generate` (the device decode path), speculative decoding token
//! identity, and the scheduler with concurrent requests.
use super::backend::{self, Device, DeviceOpts};
use super::config_gen::Rand;
use crate::cmd::device_test::{argmax, rel_err, top2_gap};
use anyhow::{Context, Result};
use laguna_engine::config::AttnKind;
use laguna_engine::generate::{generate, GenerateRequest};
use laguna_engine::model::{LogitRows, Model, SeqId, StepInput};
use laguna_engine::sample::SamplingParams;
use laguna_engine::sched::{Backend, Event, GenRequest, Health, SchedConfig, Scheduler};
use std::path::{Path, PathBuf};

/// Prompt and generation sizes of a case.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest prompt (prompts run past several sliding windows up to this).
    pub max_prompt: usize,
    /// Greedy tokens generated per prompt.
    pub gen: usize,
}

/// The CPU's rows for one prompt: prompt rows, then its own greedy continuation fed back.
pub struct Reference {
    pub prompt: Vec<u32>,
    /// `gen` greedy tokens.
    pub cont: Vec<u32>,
    /// `[prompt.len() + gen - 1, vocab]`: the logits of `all()`.
    pub logits: Vec<f32>,
    pub vocab: usize,
}

impl Reference {
    /// Prompt + continuation without its last token: the rows whose logits are compared.
    pub fn all(&self) -> Vec<u32> {
        let mut a = self.prompt.clone();
        a.extend_from_slice(&self.cont[..self.cont.len() - 1]);
        a
    }
    /// The row that picks continuation token `step`.
    pub fn pick_row(&self, step: usize) -> &[f32] {
        let i = self.prompt.len() - 1 + step;
        &self.logits[i * self.vocab..(i + 1) * self.vocab]
    }
}

/// One check of a case: pass/fail, worst relative error where it measures one, and what it saw.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub err: f64,
    pub detail: String,
}

/// Prompt lengths from 1 token to past several sliding windows (capped), random tokens.
pub fn prompts(r: &mut Rand, vocab: usize, window: usize, lim: &Limits) -> Vec<Vec<u32>> {
    let cap = lim.max_prompt.max(2);
    let short = if r.chance(0.4) {
        1
    } else {
        r.range(2, 16.min(cap))
    };
    let mid = r.range(2, window.max(32).min(cap));
    let lo = (window + 1).min(cap);
    let long = r.range(lo, (3 * window + window / 2 + 1).min(cap).max(lo));
    [short, mid, long]
        .iter()
        .map(|&n| (0..n).map(|_| r.range(0, vocab - 1) as u32).collect())
        .collect()
}

fn fwd(
    m: &mut dyn Model,
    seq: SeqId,
    tokens: &[u32],
    start: usize,
    l: LogitRows,
) -> Result<Vec<f32>> {
    Ok(m.forward(&[StepInput {
        seq,
        tokens,
        start_pos: start,
        logits: l,
    }])?
    .remove(0)
    .logits)
}

/// Prompt rows in one pass, then `gen` greedy tokens by 1-row steps.
pub fn reference(cpu: &mut dyn Model, prompt: &[u32], gen: usize) -> Result<Reference> {
    let v = cpu.config().vocab_size;
    let s = cpu.new_seq()?;
    let mut logits = fwd(cpu, s, prompt, 0, LogitRows::All)?;
    let mut cont = vec![argmax(&logits[logits.len() - v..]) as u32];
    while cont.len() < gen {
        let t = *cont.last().unwrap();
        let row = fwd(cpu, s, &[t], prompt.len() + cont.len() - 1, LogitRows::All)?;
        cont.push(argmax(&row) as u32);
        logits.extend(row);
    }
    cpu.free_seq(s);
    anyhow::ensure!(
        logits.iter().all(|x| x.is_finite()),
        "the CPU reference has non-finite logits"
    );
    Ok(Reference {
        prompt: prompt.to_vec(),
        cont,
        logits,
        vocab: v,
    })
}

/// (b) One forward over every row, and chunked prefill (random chunks) + 1-row decode steps,
/// against the reference. Returns both checks and the larger absolute error (the measured
/// error the greedy checks allow for).
pub fn logits_checks(
    dev: &mut dyn Model,
    r: &Reference,
    rng: &mut Rand,
    tol: f64,
) -> Result<(Check, Check, f64)> {
    let all = r.all();
    let v = r.vocab;
    let s = dev.new_seq()?;
    let a = fwd(dev, s, &all, 0, LogitRows::All)?;
    dev.free_seq(s);
    let (ea, aa) = rel_err(&a, &r.logits, v);
    let s = dev.new_seq()?;
    let (mut b, mut pos, mut chunks) = (vec![], 0, vec![]);
    while pos < r.prompt.len() {
        let n = rng
            .range(1, (r.prompt.len() / 2).max(1))
            .min(r.prompt.len() - pos);
        b.extend(fwd(dev, s, &r.prompt[pos..pos + n], pos, LogitRows::All)?);
        chunks.push(n);
        pos += n;
    }
    for (i, &t) in all[r.prompt.len()..].iter().enumerate() {
        b.extend(fwd(dev, s, &[t], pos + i, LogitRows::Last)?);
    }
    dev.free_seq(s);
    let (eb, ab) = rel_err(&b, &r.logits, v);
    let rows = all.len();
    let pass = Check {
        name: "pass",
        ok: ea <= tol && a.len() == r.logits.len(),
        err: ea,
        detail: format!("{rows} rows in one forward: rel {ea:.2e} abs {aa:.2e}"),
    };
    let chunked = Check {
        name: "chunked",
        ok: eb <= tol && b.len() == r.logits.len(),
        err: eb,
        detail: format!(
            "prefill chunks {:?} + {} 1-row steps: rel {eb:.2e} abs {ab:.2e}",
            &chunks[..chunks.len().min(8)],
            rows - r.prompt.len()
        ),
    };
    Ok((pass, chunked, aa.max(ab)))
}

/// (c) `main`'s prompt rows computed in one forward with `other`'s equal its solo forward bit
/// for bit (where the backend promises it), and `other`'s rows match the CPU.
pub fn batch_check(
    dev: &mut dyn Model,
    devk: Device,
    o: &DeviceOpts,
    main: &Reference,
    other: &Reference,
    tol: f64,
) -> Result<Check> {
    let v = main.vocab;
    let (p, q) = (main.prompt.len(), other.prompt.len());
    let s = dev.new_seq()?;
    let solo = fwd(dev, s, &main.prompt, 0, LogitRows::All)?;
    dev.free_seq(s);
    let (s1, s2) = (dev.new_seq()?, dev.new_seq()?);
    let outs = dev.forward(&[
        StepInput {
            seq: s2,
            tokens: &other.prompt,
            start_pos: 0,
            logits: LogitRows::All,
        },
        StepInput {
            seq: s1,
            tokens: &main.prompt,
            start_pos: 0,
            logits: LogitRows::All,
        },
    ])?;
    dev.free_seq(s1);
    dev.free_seq(s2);
    let rings = dev.config().sliding_window.is_some()
        && dev
            .config()
            .layers
            .iter()
            .any(|l| l.attn == AttnKind::Sliding);
    let bitwise = backend::bitwise_expected(devk, o, rings, &[(&[p], 0), (&[q, p], 1)]);
    let same = outs[1].logits == solo;
    let (em, _) = rel_err(&outs[1].logits, &main.logits[..p * v], v);
    let (eo, _) = rel_err(&outs[0].logits, &other.logits[..q * v], v);
    let ok = (same || !bitwise) && em <= tol && eo <= tol;
    Ok(Check {
        name: "batch",
        ok,
        err: em.max(eo),
        detail: format!(
            "{p} rows after {q} rows of another sequence: = solo {}{}; rel {em:.2e}, other's rows rel {eo:.2e}",
            if same { "bitwise" } else { "NOT bitwise" },
            if bitwise { "" } else { " (mixed kernel regimes: not promised)" },
        ),
    })
}

/// Whether greedy `tokens` follow the reference: equal up to the first difference, which is
/// allowed only where the CPU's top-2 gap is within twice the measured error. Returns
/// (tokens compared equal, the first difference as (step, gap), ok).
pub fn greedy_verdict(
    tokens: &[u32],
    r: &Reference,
    measured: f64,
) -> (usize, Option<(usize, f64)>, bool) {
    for (i, (&t, &c)) in tokens.iter().zip(&r.cont).enumerate() {
        if t != c {
            let gap = top2_gap(r.pick_row(i));
            return (i, Some((i, gap)), gap <= 2.0 * measured);
        }
    }
    let n = tokens.len().min(r.cont.len());
    (n, None, tokens.len() == r.cont.len())
}

fn greedy_req(prompt: &[u32], gen: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens: gen,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        stop_token_ids: vec![],
    }
}

fn verdicts(name: &'static str, outs: &[(Vec<u32>, &Reference, f64)]) -> Check {
    let mut ok = true;
    let mut parts = vec![];
    for (toks, r, measured) in outs {
        let (same, diff, good) = greedy_verdict(toks, r, *measured);
        ok &= good;
        parts.push(match diff {
            None => format!("{same}/{}", r.cont.len()),
            Some((s, gap)) => format!(
                "{same}/{} (differs at {s}, gap {gap:.2e} {} 2x err {:.2e})",
                r.cont.len(),
                if good { "<=" } else { ">" },
                2.0 * measured
            ),
        });
    }
    Check {
        name,
        ok,
        err: 0.0,
        detail: parts.join(", "),
    }
}

/// (d) Greedy tokens through `generate` (device sampling / decode steps where the backend has
/// them) against the CPU's.
pub fn greedy_check(dev: &mut dyn Model, refs: &[Reference], measured: &[f64]) -> Result<Check> {
    let mut outs = vec![];
    for (r, &m) in refs.iter().zip(measured) {
        let g = generate(dev, &greedy_req(&r.prompt, r.cont.len()), false)?;
        outs.push((g.completion, r, m));
    }
    Ok(verdicts("greedy", &outs))
}

/// (e) With the draft, greedy output equals greedy output without it for every k in
/// 1..block_size (prompts taken in turn).
pub fn spec_check(
    devk: Device,
    tdir: &Path,
    ddir: &Path,
    block: usize,
    refs: &[Reference],
    gen: usize,
    o: &DeviceOpts,
) -> Result<Check> {
    let mut bad = vec![];
    for k in 1..block {
        let prompt = &refs[k % refs.len()].prompt;
        let (ok, detail) = backend::spec_identity(devk, tdir, ddir, prompt, k, gen + k, o)
            .with_context(|| format!("k = {k}"))?;
        if !ok {
            bad.push(format!("k={k}: {detail}"));
        }
    }
    Ok(Check {
        name: "spec",
        ok: bad.is_empty(),
        err: 0.0,
        detail: if bad.is_empty() {
            format!("k = 1..{}: identical", block - 1)
        } else {
            bad.join("; ")
        },
    })
}

/// Drives a future to completion on this thread (the request streams need no runtime).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark()
        }
    }
    let waker = std::sync::Arc::new(Unpark(std::thread::current())).into();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => return v,
            std::task::Poll::Pending => std::thread::park(),
        }
    }
}

/// (f) Every prompt twice at once through the scheduler `serve` runs (with the draft when the
/// case has one), each request's tokens against the CPU's greedy ones.
#[allow(clippy::too_many_arguments)]
pub fn sched_check(
    devk: Device,
    tdir: &Path,
    draft: Option<(PathBuf, usize)>,
    o: &DeviceOpts,
    batched_tokens: usize,
    refs: &[Reference],
    measured: &[f64],
) -> Result<Check> {
    let (dir, opts) = (tdir.to_path_buf(), o.clone());
    let k = draft.as_ref().map(|d| d.1);
    let loader: laguna_engine::sched::ModelLoader = Box::new(move || {
        backend::load(
            devk,
            &dir,
            draft.as_ref().map(|(d, k)| (d.as_path(), *k)),
            &opts,
        )
        .map_err(|e| laguna_engine::EngineError::Other(format!("{e:#}")))
    });
    let sc = SchedConfig {
        max_num_seqs: o.max_seqs,
        max_num_batched_tokens: batched_tokens.max(o.max_seqs),
        max_model_len: 4096,
        max_waiting: 0,
        ..SchedConfig::default()
    };
    let s = Scheduler::start_loading(sc.clone(), loader, None)?;
    let t0 = std::time::Instant::now();
    while s.health() == Health::Loading {
        anyhow::ensure!(
            t0.elapsed().as_secs() < 600,
            "the scheduler's model did not load in 600 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    if let Health::Failed(e) = s.health() {
        anyhow::bail!("scheduler load: {e}");
    }
    let mut streams = vec![];
    for r in refs.iter().chain(refs) {
        let mut req = GenRequest::greedy(r.prompt.clone(), r.cont.len());
        req.ignore_eos = true;
        streams.push(s.submit(req).map_err(|e| anyhow::anyhow!("submit: {e}"))?);
    }
    let mut outs = vec![];
    for (i, st) in streams.into_iter().enumerate() {
        let toks = block_on(async move {
            let mut st = st;
            let mut ids = vec![];
            while let Some(ev) = st.next().await {
                match ev {
                    Event::Delta { ids: d, .. } => ids.extend(d),
                    Event::Finished { .. } => return Ok(ids),
                    Event::Error(e) => return Err(anyhow::anyhow!("request failed: {e}")),
                }
            }
            Err(anyhow::anyhow!("stream ended without Finished"))
        })?;
        let j = i % refs.len();
        outs.push((toks, &refs[j], measured[j]));
    }
    let mut c = verdicts("sched", &outs);
    c.detail = format!(
        "{} requests at once (seqs {}, batch tokens {}{}): {}",
        outs.len(),
        sc.max_num_seqs,
        sc.max_num_batched_tokens,
        k.map_or(String::new(), |k| format!(", DFlash k={k}")),
        c.detail
    );
    Ok(c)
}
