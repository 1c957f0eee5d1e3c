//! The random-config sweep of `laguna-dev device-test --random-configs N`: random Laguna configs
//! (`config_gen`), random weights (`synth::write_checkpoint`), and the checks of one case
//! (`checks`) on a device (`backend`) against the CPU engine. `run_case` runs one case and never
//! panics: a failure or panic becomes a failed check of that case.
pub mod backend;
pub mod checks;
pub mod config_gen;

use anyhow::{Context, Result};
use backend::{Device, DeviceOpts};
use checks::{Check, Limits, Reference};
use config_gen::{Case, Rand};
use laguna_engine::config::{AttnKind, LagunaConfig};
use laguna_engine::spec::DraftConfig;
use std::path::Path;

/// What one case did.
#[derive(Debug, Clone)]
pub struct CaseReport {
    pub seed: u64,
    pub summary: String,
    pub opts: String,
    pub checks: Vec<Check>,
    /// Setup failures and panics (the case fails).
    pub error: Option<String>,
}

impl CaseReport {
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.checks.iter().all(|c| c.ok)
    }
    /// Worst relative logits error over the checks that measure one.
    pub fn worst(&self) -> f64 {
        self.checks.iter().fold(0.0, |m, c| m.max(c.err))
    }
    pub fn json(&self) -> serde_json::Value {
        let checks: serde_json::Map<String, serde_json::Value> = self
            .checks
            .iter()
            .map(|c| {
                (
                    c.name.to_string(),
                    serde_json::json!({"ok": c.ok, "rel_err": c.err, "detail": c.detail}),
                )
            })
            .collect();
        serde_json::json!({"seed": self.seed, "config": self.summary, "opts": self.opts,
            "checks": checks, "worst_rel_err": self.worst(), "ok": self.ok(), "error": self.error})
    }
}

/// The names of the checks, in the order a case runs them.
pub const CHECKS: [&str; 6] = ["pass", "chunked", "batch", "greedy", "spec", "sched"];

impl CaseReport {
    /// Reads back what `json` wrote (a case run in a child process).
    pub fn from_json(v: &serde_json::Value) -> Option<CaseReport> {
        let checks = v["checks"]
            .as_object()?
            .iter()
            .map(|(k, c)| Check {
                name: CHECKS
                    .iter()
                    .find(|n| **n == k.as_str())
                    .copied()
                    .unwrap_or("other"),
                ok: c["ok"].as_bool().unwrap_or(false),
                err: c["rel_err"].as_f64().unwrap_or(f64::NAN),
                detail: c["detail"].as_str().unwrap_or("").to_string(),
            })
            .collect();
        Some(CaseReport {
            seed: v["seed"].as_u64()?,
            summary: v["config"].as_str().unwrap_or("").to_string(),
            opts: v["opts"].as_str().unwrap_or("").to_string(),
            checks,
            error: v["error"].as_str().map(str::to_string),
        })
    }
}

/// Sweep-wide settings.
#[derive(Debug, Clone)]
pub struct SweepSettings {
    pub device: Device,
    pub tol: f64,
    pub limits: Limits,
    /// Skip the DFlash and scheduler checks (quick CI runs).
    pub quick: bool,
}

/// Runs one case in `dir` (its checkpoints, prompts and report are written there); a panic
/// anywhere is caught and reported with the seed.
pub fn run_case(c: &Case, s: &SweepSettings, dir: &Path) -> CaseReport {
    let mut rep = CaseReport {
        seed: c.seed,
        summary: String::new(),
        opts: String::new(),
        checks: vec![],
        error: None,
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        case_checks(c, s, dir, &mut rep)
    }));
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => rep.error = Some(format!("{e:#}")),
        Err(p) => rep.error = Some(format!("panic: {}", panic_text(&*p))),
    }
    let _ = std::fs::write(
        dir.join("report.json"),
        serde_json::to_vec_pretty(&rep.json()).unwrap_or_default(),
    );
    rep
}

fn case_checks(c: &Case, s: &SweepSettings, dir: &Path, rep: &mut CaseReport) -> Result<()> {
    // Weights.
    let tdir = dir.join("target");
    let text = serde_json::to_string_pretty(&c.target)?;
    let so = crate::cmd::synth::SynthOptions {
        seed: c.seed,
        correction_bias_amp: c.bias_amp,
        ..Default::default()
    };
    crate::cmd::synth::write_checkpoint(&text, &tdir, &so).context("synth target")?;
    let t = LagunaConfig::from_value(c.target.clone())?;
    let ddir = dir.join("draft");
    let d = match &c.draft {
        Some(dv) => {
            crate::cmd::synth::write_checkpoint(&serde_json::to_string_pretty(dv)?, &ddir, &so)
                .context("synth draft")?;
            Some(DraftConfig::from_value(dv.clone())?)
        }
        None => None,
    };
    rep.summary = config_gen::summary(&t, d.as_ref(), c.nvfp4);
    let mut r = Rand::new(c.seed ^ 0xC0FF_EE00_D15E_A5E5);
    let mut o = DeviceOpts::random(&mut r, d.as_ref().map(|d| d.block_size));
    let block = d.as_ref().map_or(0, |d| d.block_size);
    o.fit_pool(&t, s.limits.max_prompt + 2 * s.limits.gen + block);
    rep.opts = o.summary();
    // Prompts past several windows of the smallest window in play.
    let window = if t.layers.iter().any(|l| l.attn == AttnKind::Sliding) {
        t.sliding_window.unwrap_or(512)
    } else {
        64
    };
    let window = d
        .as_ref()
        .and_then(|d| d.window)
        .map_or(window, |w| w.min(window));
    let prompts = checks::prompts(&mut r, t.vocab_size, window, &s.limits);
    // (a) the CPU reference.
    let mut cpu = backend::load_reference(&tdir)?;
    let refs: Vec<Reference> = prompts
        .iter()
        .map(|p| checks::reference(cpu.as_mut(), p, s.limits.gen))
        .collect::<Result<_>>()?;
    drop(cpu);
    let pj: Vec<_> = refs
        .iter()
        .map(|r| serde_json::json!({"prompt_ids": r.prompt, "cpu_greedy_ids": r.cont}))
        .collect();
    std::fs::write(dir.join("prompts.json"), serde_json::to_vec_pretty(&pj)?)?;
    write_reference(&tdir, &refs[refs.len() - 1])?;
    // (b), (c), (d) on one device model.
    let mut dev = backend::load(s.device, &tdir, None, &o)?.model;
    let mut measured = vec![];
    let (mut pass, mut chunked) = (vec![], vec![]);
    for rf in &refs {
        let (a, b, m) = checks::logits_checks(dev.as_mut(), rf, &mut r, s.tol)?;
        pass.push(a);
        chunked.push(b);
        measured.push(m);
    }
    rep.checks.push(merge("pass", pass));
    rep.checks.push(merge("chunked", chunked));
    let batch = attempt("batch", || {
        let mut batch = vec![];
        for i in 0..refs.len() {
            let other = &refs[(i + 1) % refs.len()];
            batch.push(checks::batch_check(
                dev.as_mut(),
                s.device,
                &o,
                &refs[i],
                other,
                s.tol,
            )?);
        }
        Ok(merge("batch", batch))
    });
    rep.checks.push(batch);
    rep.checks.push(attempt("greedy", || {
        checks::greedy_check(dev.as_mut(), &refs, &measured)
    }));
    drop(dev);
    if s.quick {
        return Ok(());
    }
    // (e) DFlash token identity for every k, (f) the scheduler.
    let mut k = None;
    if let Some(d) = &d {
        rep.checks.push(attempt("spec", || {
            checks::spec_check(
                s.device,
                &tdir,
                &ddir,
                d.block_size,
                &refs,
                s.limits.gen,
                &o,
            )
        }));
        k = Some(r.range(1, d.block_size - 1));
    }
    let batched = if r.chance(0.5) { r.range(16, 64) } else { 2048 };
    rep.checks.push(attempt("sched", || {
        let draft = k.map(|k| (ddir.clone(), k));
        checks::sched_check(s.device, &tdir, draft, &o, batched, &refs, &measured)
    }));
    Ok(())
}

/// `reference.safetensors` of the fixture format (`prompt_ids`, `greedy_ids`, I64) for the
/// longest prompt, so that a kept case runs under `laguna-dev device-test --fixtures DIR/target`.
/// The greedy ids are the CPU engine's (metadata `source`); a committed fixture takes its
/// reference from transformers (tests/fixtures/make_fixtures.py).
fn write_reference(tdir: &Path, r: &Reference) -> Result<()> {
    let bytes =
        |ids: &[u32]| -> Vec<u8> { ids.iter().flat_map(|&t| (t as i64).to_le_bytes()).collect() };
    let (p, g) = (bytes(&r.prompt), bytes(&r.cont));
    let views = vec![
        (
            "greedy_ids",
            safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![r.cont.len()], &g)?,
        ),
        (
            "prompt_ids",
            safetensors::tensor::TensorView::new(
                safetensors::Dtype::I64,
                vec![r.prompt.len()],
                &p,
            )?,
        ),
    ];
    let meta = [(
        "source".to_string(),
        "laguna CPU engine greedy (device-test --random-configs)".to_string(),
    )];
    let out = safetensors::tensor::serialize(views, Some(meta.into_iter().collect()))?;
    std::fs::write(tdir.join("reference.safetensors"), out)?;
    Ok(())
}

/// A check that could not run is a failed check (the case's other checks still run).
fn attempt(name: &'static str, f: impl FnOnce() -> Result<Check>) -> Check {
    let failed = |detail: String| Check {
        name,
        ok: false,
        err: 0.0,
        detail,
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => failed(format!("ERROR {e:#}")),
        Err(p) => failed(format!("PANIC {}", panic_text(&*p))),
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}

/// One check from the same check on several prompts: worst error, every detail.
fn merge(name: &'static str, cs: Vec<Check>) -> Check {
    Check {
        name,
        ok: cs.iter().all(|c| c.ok),
        err: cs.iter().fold(0.0, |m, c| m.max(c.err)),
        detail: cs
            .iter()
            .map(|c| c.detail.clone())
            .collect::<Vec<_>>()
            .join(" | "),
    }
}

#[cfg(test)]
mod tests;
