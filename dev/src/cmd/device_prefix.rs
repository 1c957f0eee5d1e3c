//! `laguna-dev device-test` prefix-cache checks: a multi-turn session through the scheduler on the
//! device, with the prefix cache and without (the same model folder loaded twice, one after the
//! other), greedy; the tokens must be equal and the later turns must resume from the cache.
use anyhow::{bail, Result};
use laguna_engine::model::{DecodeItem, LogitRows, Model, SeqId, StepInput};
use laguna_engine::sched::{Backend, Event, GenRequest, Health, SchedConfig, Scheduler};
use laguna_stages::recipe::SpecK;
use laguna_stages::serve::{model_loader, ServeOptions};
use std::path::Path;

pub struct PrefixRow {
    pub name: String,
    pub ok: bool,
    pub cached: Vec<usize>,
    pub note: String,
}

fn start(
    device: &str,
    target: &Path,
    draft: Option<&Path>,
    cache: bool,
    max_len: usize,
) -> Result<Scheduler> {
    let opts = ServeOptions {
        model: Some(target.to_path_buf()),
        draft: draft.map(|d| d.to_path_buf()),
        num_speculative_tokens: SpecK::Fixed(3),
        device: device.into(),
        kv_cache_memory_bytes: Some(2 << 30),
        max_num_seqs: 2,
        ..ServeOptions::default()
    };
    let loader = model_loader(
        target.to_path_buf(),
        opts.draft.clone(),
        SpecK::Fixed(3),
        device,
        &opts,
    )?;
    let cfg = SchedConfig {
        max_num_seqs: 2,
        // Passes of at most 16 rows (the snapshot interval below): every pass of both sessions
        // stays under GEMM_MIN_ROWS, where a row's bits do not depend on the pass it is in, so a
        // cached turn and the cold one compute the same rows the same way however their prefills
        // are cut. (With 64-row passes the cold run took the GEMM regime and the cached one,
        // cut at the snapshots, the GEMV regime: on MoE targets with random weights a router
        // near-tie flipped by that rounding moves the logits far past any top-2 gap.)
        max_num_batched_tokens: 16,
        max_model_len: max_len,
        max_waiting: 0,
        prefix_cache: cache,
        prefix_snapshot_every: 16,
    };
    let s = Scheduler::start_loading(cfg, loader, None)?;
    loop {
        match s.health() {
            Health::Ready => return Ok(s),
            Health::Failed(e) => bail!("load failed: {e}"),
            Health::Loading => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

/// One turn of a session: the output, its logprobs (chosen token and the runner-up), and how many
/// prompt tokens came from the cache.
struct Turn {
    ids: Vec<u32>,
    lps: Vec<laguna_engine::sched::TokenLogprob>,
    cached: usize,
}

/// Three turns; each prompt = the previous prompt, an output and new tokens. The output appended
/// is the turn's own, or `forced[t]` (so a second run sees the same prompts as the first). Logprobs
/// only when `logprobs` (a request asking for them takes the generic forward, not the device's
/// decode step).
fn session(
    s: &Scheduler,
    vocab: u32,
    first: usize,
    forced: Option<&[Turn]>,
    logprobs: bool,
) -> Result<Vec<Turn>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut prompt: Vec<u32> = (0..first as u32).map(|i| (17 + 37 * i) % vocab).collect();
    let mut out = vec![];
    for t in 0..3u32 {
        let mut req = GenRequest::greedy(prompt.clone(), 12);
        req.ignore_eos = true;
        req.logprobs = logprobs.then_some(2);
        let mut st = s.submit(req).map_err(|e| anyhow::anyhow!("{e}"))?;
        let turn = rt.block_on(async {
            let (mut ids, mut lps) = (vec![], vec![]);
            while let Some(ev) = st.next().await {
                match ev {
                    Event::Delta {
                        ids: d, logprobs, ..
                    } => {
                        ids.extend(d);
                        lps.extend(logprobs);
                    }
                    Event::Finished { usage, .. } => {
                        return Ok(Turn {
                            ids,
                            lps,
                            cached: usage.cached_tokens,
                        })
                    }
                    Event::Error(e) => bail!("{e}"),
                }
            }
            bail!("no Finished event")
        })?;
        prompt.extend(forced.map_or(&turn.ids, |f| &f[t as usize].ids));
        prompt.extend((0..9 + t).map(|i| (101 + 13 * (i + 7 * t)) % vocab));
        out.push(turn);
    }
    Ok(out)
}

/// A cached turn against the cold one: the outputs agree token by token, or part only where the
/// cold run's two best tokens are within `tol` nats of each other and the cached run took the
/// runner-up (a different prefill split moves logits by rounding, never by more). Some(reason)
/// when they disagree otherwise.
fn compare(warm: &Turn, cold: &Turn, tol: f32) -> Option<String> {
    if warm.ids.len() != cold.ids.len() || cold.lps.len() != cold.ids.len() {
        return Some("output lengths or logprobs differ".into());
    }
    let i = warm.ids.iter().zip(&cold.ids).position(|(w, c)| w != c)?;
    let c = &cold.lps[i];
    let gap = match c.top.get(1) {
        Some(&(second, lp)) if second == warm.ids[i] => c.logprob - lp,
        _ => f32::INFINITY,
    };
    (gap > tol).then(|| {
        format!(
            "token {i}: {} vs {} (cold top-2 gap {gap:.3e})",
            warm.ids[i], cold.ids[i]
        )
    })
}

/// Cached against cold on one target, with each of `drafts` (None: no draft) on `device` (cuda for
/// device-test; cpu runs the same harness): a cold session without a draft first (with logprobs:
/// the reference), then for each draft a cached session on the reference's prompts (without
/// logprobs, so decode takes the device's path); turns 2 and 3 must resume from the cache and give
/// the reference's tokens, or part from them only as [`compare`] allows (tolerance: the CPU 1e-5,
/// the GPU [`GPU_TOL`]). Greedy output does not depend on the draft, so one reference serves all.
pub fn check(
    device: &str,
    target: &Path,
    drafts: &[Option<&Path>],
    first: usize,
) -> Result<Vec<PrefixRow>> {
    let cfg = laguna_engine::LagunaConfig::from_file(&target.join("config.json"))?;
    let vocab = cfg.vocab_size as u32;
    let max_len = cfg.max_position_embeddings;
    let tol = if device == "cpu" { 1e-5 } else { GPU_TOL };
    let cold = {
        let s = start(device, target, None, false, max_len)?;
        session(&s, vocab, first, None, true)?
    };
    let mut rows = vec![];
    for &draft in drafts {
        let name = format!(
            "{}{}",
            target.file_name().unwrap_or_default().to_string_lossy(),
            draft.map_or(String::new(), |d| format!(
                " + {}",
                d.file_name().unwrap_or_default().to_string_lossy()
            ))
        );
        let warm = match start(device, target, draft, true, max_len)
            .and_then(|s| session(&s, vocab, first, Some(&cold), false))
        {
            Ok(w) => w,
            Err(e) => {
                rows.push(PrefixRow {
                    name,
                    ok: false,
                    cached: vec![],
                    note: format!("ERROR {e:#}"),
                });
                continue;
            }
        };
        let mut notes = vec![];
        for (t, (w, c)) in warm.iter().zip(&cold).enumerate() {
            if let Some(why) = compare(w, c, tol) {
                notes.push(format!("turn {} {why}", t + 1));
            }
        }
        let parted = warm
            .iter()
            .zip(&cold)
            .filter(|(w, c)| w.ids != c.ids)
            .count();
        let cached: Vec<usize> = warm.iter().map(|w| w.cached).collect();
        let resumed = cached[0] == 0 && cached[1] > 0 && cached[2] > cached[1];
        let ok = notes.is_empty() && resumed;
        if parted > 0 {
            notes.push(format!("{parted} turn(s) parted at a near tie"));
        }
        rows.push(PrefixRow {
            name,
            ok,
            cached,
            note: notes.join("; "),
        });
    }
    Ok(rows)
}

/// The top-2 gap (nats) below which a cached GPU turn may take the cold turn's runner-up: BF16
/// rounding (docs/design/prefix-cache.md; with every pass under GEMM_MIN_ROWS the turns should
/// agree bit for bit); a wrong restore moves logits by far more, and the store itself is checked
/// bit for bit (`store_check`).
const GPU_TOL: f32 = 2e-2;

/// One resume point of [`store_check`]: the restored sequence against one that never left.
pub struct StoreRow {
    pub pos: usize,
    /// How the first `pos` positions were written: prefill chunks only, or a prefill and then
    /// one-token decode steps (as a finished request's output is).
    pub decoded: usize,
    /// max |logit difference| over the rows after `pos`.
    pub max_diff: f32,
    pub same_tokens: bool,
}

/// Feed one token at the end of `seq` and return the greedy next token (the device's decode step
/// when the backend samples on the device, else a forward and the host's argmax).
fn greedy_step(m: &mut dyn Model, seq: SeqId, tok: u32) -> Result<u32> {
    if m.device_sampling() > 0 {
        let p = laguna_engine::sample::SamplingParams::greedy();
        let item = DecodeItem {
            seq,
            token: tok,
            params: &p,
            u: 0.0,
            prev: None,
        };
        return Ok(m.decode_step(&[item])?[0]);
    }
    let pos = m.seq_len(seq);
    let out = m.forward(&[StepInput {
        seq,
        tokens: &[tok],
        start_pos: pos,
        logits: LogitRows::Last,
    }])?;
    Ok(laguna_engine::sample::argmax(out[0].row(0)) as u32)
}

/// Write `prompt[..pos]` into `seq` as the scheduler does: prefill in `chunk`-token passes, the
/// last `decoded` positions as one-token decode steps.
fn write_prefix(
    m: &mut dyn Model,
    seq: SeqId,
    prompt: &[u32],
    pos: usize,
    decoded: usize,
    chunk: usize,
) -> Result<()> {
    let pre = pos - decoded;
    let mut at = 0;
    while at < pre {
        let n = chunk.min(pre - at);
        m.forward(&[StepInput {
            seq,
            tokens: &prompt[at..at + n],
            start_pos: at,
            logits: LogitRows::None,
        }])?;
        at += n;
    }
    for &t in &prompt[pre..pos] {
        greedy_step(m, seq, t)?;
    }
    Ok(())
}

/// The rest of the prompt after `pos` (logits of every row), then `gen` greedy tokens.
fn finish(
    m: &mut dyn Model,
    seq: SeqId,
    prompt: &[u32],
    pos: usize,
    gen: usize,
) -> Result<(Vec<f32>, Vec<u32>)> {
    let out = m.forward(&[StepInput {
        seq,
        tokens: &prompt[pos..],
        start_pos: pos,
        logits: LogitRows::All,
    }])?;
    let logits = out[0].logits.clone();
    let v = logits.len() / out[0].rows.max(1);
    let mut tok = laguna_engine::sample::argmax(&logits[logits.len() - v..]) as u32;
    let mut toks = vec![tok];
    for _ in 1..gen {
        tok = greedy_step(m, seq, tok)?;
        toks.push(tok);
    }
    Ok((logits, toks))
}

/// The store seam on `device`, without the scheduler: for each resume point, a sequence written up
/// to it, exported (blocks and a snapshot), freed and restored into a new sequence must compute the
/// same logits and greedy tokens for the rest as a sequence written the same way that never left
/// (same passes, so bit for bit on a deterministic backend).
pub fn store_check(
    device: &str,
    target: &Path,
    points: &[(usize, usize)],
    chunk: usize,
) -> Result<Vec<StoreRow>> {
    let dev = laguna_engine::backend::Device::parse(device).map_err(anyhow::Error::msg)?;
    let opts = laguna_engine::backend::LoadOptions {
        kv_cache_bytes: Some(4 << 30),
        max_seqs: 4,
        ..Default::default()
    };
    let mut loaded = laguna_engine::backend::load(dev, &opts, target, None)?;
    let m = loaded.model();
    let vocab = m.config().vocab_size as u32;
    let rest = 24;
    let longest = points.iter().map(|p| p.0).max().unwrap_or(0);
    let prompt: Vec<u32> = (0..(longest + rest) as u32)
        .map(|i| (17 + 37 * i + i * i / 7) % vocab)
        .collect();
    let mut rows = vec![];
    for &(pos, decoded) in points {
        let prompt = &prompt[..pos + rest];
        let c = m.new_seq()?;
        write_prefix(m, c, prompt, pos, decoded, chunk)?;
        let (want, want_toks) = finish(m, c, prompt, pos, 8)?;
        m.free_seq(c);
        let a = m.new_seq()?;
        write_prefix(m, a, prompt, pos, decoded, chunk)?;
        let st = m
            .prefix_store()
            .ok_or_else(|| anyhow::anyhow!("this backend has no prefix store"))?;
        let blocks = (0..pos / st.block_size())
            .map(|i| st.export_block(a, i))
            .collect::<laguna_engine::Result<Vec<_>>>()?;
        let snap = st.export_snapshot(a)?;
        m.free_seq(a);
        let b = m.new_seq()?;
        m.prefix_store()
            .expect("checked")
            .restore(b, &blocks, Some(snap), pos)?;
        let (got, got_toks) = finish(m, b, prompt, pos, 8)?;
        m.free_seq(b);
        let st = m.prefix_store().expect("checked");
        for h in blocks.into_iter().chain([snap]) {
            st.release(h);
        }
        let max_diff = got
            .iter()
            .zip(&want)
            .map(|(x, y)| {
                if x.is_finite() {
                    (x - y).abs()
                } else {
                    f32::INFINITY
                }
            })
            .fold(0f32, f32::max);
        rows.push(StoreRow {
            pos,
            decoded,
            max_diff,
            same_tokens: got_toks == want_toks,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    /// The device-test harness itself, on the CPU reference (what device-test runs on cuda).
    #[test]
    fn harness_passes_on_cpu() {
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures"));
        let (t, d) = (
            root.join("models/swa-yarn-perhead"),
            root.join("drafts/swa-yarn-perhead-causal-w8"),
        );
        if !t.join("config.json").exists() || !d.join("config.json").exists() {
            eprintln!("skipping: fixtures missing");
            return;
        }
        for r in super::check("cpu", &t, &[None, Some(d.as_path())], 20).unwrap() {
            assert!(r.ok, "{} cached {:?} {}", r.name, r.cached, r.note);
        }
    }

    /// The store check itself, on the CPU reference (bit for bit there), at block boundaries,
    /// inside blocks and windows, after decode steps.
    #[test]
    fn store_check_passes_on_cpu() {
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures"));
        let t = root.join("models/swa-yarn-perhead");
        if !t.join("config.json").exists() {
            eprintln!("skipping: fixtures missing");
            return;
        }
        let points = [(1, 0), (15, 0), (16, 0), (17, 0), (40, 5), (41, 11)];
        for r in super::store_check("cpu", &t, &points, 8).unwrap() {
            assert!(
                r.same_tokens && r.max_diff == 0.0,
                "pos {} decoded {}: {}",
                r.pos,
                r.decoded,
                r.max_diff
            );
        }
    }
}
