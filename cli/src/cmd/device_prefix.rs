//! `laguna device-test` prefix-cache checks: a multi-turn session through the scheduler on the
//! device, with the prefix cache and without (the same model folder loaded twice, one after the
//! other), greedy; the tokens must be equal and the later turns must resume from the cache.
use anyhow::{bail, Result};
use laguna_engine::model::{DecodeItem, LogitRows, Model, SeqId, StepInput};
use laguna_engine::sched::{Backend, Event, GenRequest, Health, SchedConfig, Scheduler};
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
        num_speculative_tokens: 3,
        device: device.into(),
        kv_cache_memory_bytes: Some(2 << 30),
        max_num_seqs: 2,
        ..ServeOptions::default()
    };
    let loader = model_loader(target.to_path_buf(), opts.draft.clone(), 3, device, &opts)?;
    let cfg = SchedConfig {
        max_num_seqs: 2,
        max_num_batched_tokens: 64,
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

/// Three turns (each prompt = the previous prompt, its output and new tokens); (ids, cached) a turn.
fn session(s: &Scheduler, vocab: u32, first: usize) -> Result<Vec<(Vec<u32>, usize)>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut prompt: Vec<u32> = (0..first as u32).map(|i| (17 + 37 * i) % vocab).collect();
    let mut out = vec![];
    for t in 0..3u32 {
        let mut req = GenRequest::greedy(prompt.clone(), 12);
        req.ignore_eos = true;
        let mut st = s.submit(req).map_err(|e| anyhow::anyhow!("{e}"))?;
        let (ids, cached) = rt.block_on(async {
            let mut ids = vec![];
            while let Some(ev) = st.next().await {
                match ev {
                    Event::Delta { ids: d, .. } => ids.extend(d),
                    Event::Finished { usage, .. } => return Ok((ids, usage.cached_tokens)),
                    Event::Error(e) => bail!("{e}"),
                }
            }
            bail!("no Finished event")
        })?;
        prompt.extend(&ids);
        prompt.extend((0..9 + t).map(|i| (101 + 13 * (i + 7 * t)) % vocab));
        out.push((ids, cached));
    }
    Ok(out)
}

/// Cached against cold on one target (and draft) on `device` (cuda for device-test; cpu runs the
/// same harness): equal greedy tokens, turns 2 and 3 resumed.
pub fn check(device: &str, target: &Path, draft: Option<&Path>, first: usize) -> Result<PrefixRow> {
    let cfg = laguna_engine::LagunaConfig::from_file(&target.join("config.json"))?;
    let vocab = cfg.vocab_size as u32;
    let max_len = cfg.max_position_embeddings;
    let name = format!(
        "{}{}",
        target.file_name().unwrap_or_default().to_string_lossy(),
        draft.map_or(String::new(), |d| format!(
            " + {}",
            d.file_name().unwrap_or_default().to_string_lossy()
        ))
    );
    let warm = {
        let s = start(device, target, draft, true, max_len)?;
        session(&s, vocab, first)?
    };
    let cold = {
        let s = start(device, target, draft, false, max_len)?;
        session(&s, vocab, first)?
    };
    let same = warm.iter().zip(&cold).all(|(a, b)| a.0 == b.0);
    let cached: Vec<usize> = warm.iter().map(|w| w.1).collect();
    let resumed = cached[0] == 0 && cached[1] > 0 && cached[2] > cached[1];
    let note = if same {
        String::new()
    } else {
        let i = warm
            .iter()
            .zip(&cold)
            .position(|(a, b)| a.0 != b.0)
            .unwrap_or(0);
        format!("turn {} differs: {:?} vs {:?}", i + 1, warm[i].0, cold[i].0)
    };
    Ok(PrefixRow {
        name,
        ok: same && resumed,
        cached,
        note,
    })
}

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
fn finish(m: &mut dyn Model, seq: SeqId, prompt: &[u32], pos: usize, gen: usize) -> Result<(Vec<f32>, Vec<u32>)> {
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
            .map(|(x, y)| if x.is_finite() { (x - y).abs() } else { f32::INFINITY })
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
        for draft in [None, Some(d.as_path())] {
            let r = super::check("cpu", &t, draft, 20).unwrap();
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
            assert!(r.same_tokens && r.max_diff == 0.0, "pos {} decoded {}: {}", r.pos, r.decoded, r.max_diff);
        }
    }
}
