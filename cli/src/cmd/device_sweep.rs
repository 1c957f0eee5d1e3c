//! `laguna device-test --random-configs N --seed S`: the random-config sweep (docs/design/
//! correctness.md). Case i is seed S + i: a random Laguna config (and a DFlash draft for about
//! half), random weights, random prompts and backend options, every check of `sweep::checks`
//! against the CPU engine. One line per case, a table (or `--json`) last; non-zero exit when
//! any case fails.
use super::sweep::backend::Device;
use super::sweep::checks::Limits;
use super::sweep::{config_gen, run_case, CaseReport, SweepSettings};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug, Clone)]
pub struct SweepArgs {
    /// Instead of the fixtures: check N random configs with random weights (the sweep).
    #[arg(long, value_name = "N")]
    pub random_configs: Option<u64>,
    /// First seed of the sweep (case i uses seed + i; a seed reproduces its case exactly).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Device under test for the sweep: cuda, or cpu (the CPU engine checked against itself,
    /// which exercises the harness).
    #[arg(long, default_value = "cuda")]
    pub device: String,
    /// Copy each failing case (configs, weights, prompts, report.json) into DIR/seed-S.
    #[arg(long, value_name = "DIR")]
    pub keep_failures: Option<PathBuf>,
    /// Longest prompt of a case (prompts run from 1 token to past several sliding windows).
    #[arg(long, default_value_t = 1600)]
    pub max_prompt: usize,
    /// Greedy tokens generated per prompt.
    #[arg(long, default_value_t = 16)]
    pub gen_tokens: usize,
    /// Only the logits, batch and greedy checks (no DFlash, no scheduler).
    #[arg(long)]
    pub quick: bool,
}

fn cell(r: &CaseReport, name: &str) -> &'static str {
    match r.checks.iter().find(|c| c.name == name) {
        None => "-",
        Some(c) if c.ok => "OK",
        Some(_) => "FAIL",
    }
}

fn line(r: &CaseReport) -> String {
    let checks: Vec<String> = r
        .checks
        .iter()
        .map(|c| format!("{} {}", c.name, if c.ok { "OK" } else { "FAIL" }))
        .collect();
    let mut s = format!(
        "seed {} [{}] [{}]: {}{} -> {} (worst rel err {:.2e})",
        r.seed,
        r.summary,
        r.opts,
        checks.join(", "),
        r.error
            .as_ref()
            .map_or(String::new(), |e| format!(" ERROR {e}")),
        if r.ok() { "OK" } else { "FAIL" },
        r.worst()
    );
    for c in r.checks.iter().filter(|c| !c.ok) {
        s += &format!("\n    {}: {}", c.name, c.detail);
    }
    s
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()))?;
        } else {
            std::fs::copy(&p, to.join(e.file_name()))?;
        }
    }
    Ok(())
}

/// Runs the sweep; `tol` and `json` are device-test's.
pub fn run(a: &SweepArgs, tol: f64, json: bool) -> Result<()> {
    let n = a.random_configs.unwrap_or(0);
    let device = Device::parse(&a.device)?;
    if device == Device::Cuda {
        if let Err(e) = laguna_engine::cuda::gpu_available() {
            println!("SKIP device-test --random-configs: {e}");
            return Ok(());
        }
    }
    let settings = SweepSettings {
        device,
        tol,
        limits: Limits {
            max_prompt: a.max_prompt.max(2),
            gen: a.gen_tokens.max(1),
        },
        quick: a.quick,
    };
    let root = std::env::temp_dir().join(format!("laguna-sweep-{}", std::process::id()));
    let mut reports = vec![];
    let mut coverage: std::collections::BTreeMap<&str, usize> = Default::default();
    for seed in a.seed..a.seed + n {
        let dir = root.join(format!("seed-{seed}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let case = config_gen::case(seed);
        for f in config_gen::case_features(&case) {
            *coverage.entry(f).or_default() += 1;
        }
        let r = run_case(&case, &settings, &dir);
        println!("{}", line(&r));
        if !r.ok() {
            if let Some(keep) = &a.keep_failures {
                let to = keep.join(format!("seed-{seed}"));
                match copy_dir(&dir, &to) {
                    Ok(()) => println!("    kept in {}", to.display()),
                    Err(e) => println!("    could not keep it in {}: {e:#}", to.display()),
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        reports.push(r);
    }
    let _ = std::fs::remove_dir_all(&root);
    let cov: Vec<String> = coverage.iter().map(|(f, c)| format!("{f} {c}")).collect();
    println!("features (cases): {}", cov.join(", "));
    let failed: Vec<u64> = reports.iter().filter(|r| !r.ok()).map(|r| r.seed).collect();
    if json {
        let cases: Vec<_> = reports.iter().map(CaseReport::json).collect();
        println!(
            "{}",
            serde_json::json!({"device": device.name(), "seed": a.seed, "configs": n,
                "tol": tol, "cases": cases, "failures": failed.len(), "failed_seeds": failed})
        );
    } else {
        println!("\n| seed | config | options | pass | chunked | batch | greedy | spec | sched | worst rel err | result |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for r in &reports {
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2e} | {} |",
                r.seed,
                r.summary,
                r.opts,
                cell(r, "pass"),
                cell(r, "chunked"),
                cell(r, "batch"),
                cell(r, "greedy"),
                cell(r, "spec"),
                cell(r, "sched"),
                r.worst(),
                if r.ok() { "OK" } else { "FAIL" }
            );
        }
        println!(
            "\n{n} configs on {} (seeds {}..{}), {} failed{}",
            device.name(),
            a.seed,
            a.seed + n,
            failed.len(),
            if failed.is_empty() {
                String::new()
            } else {
                format!(": seeds {failed:?}")
            }
        );
    }
    if !failed.is_empty() {
        anyhow::bail!("{} of {n} random configs failed", failed.len());
    }
    Ok(())
}
