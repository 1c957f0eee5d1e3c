//! `laguna device-test` prefix-cache checks: a multi-turn session through the scheduler on the
//! device, with the prefix cache and without (the same model folder loaded twice, one after the
//! other), greedy; the tokens must be equal and the later turns must resume from the cache.
use anyhow::{bail, Result};
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
}
