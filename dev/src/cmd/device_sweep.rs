//! `laguna-dev device-test --random-configs N --seed S`: the random-config sweep (docs/design/
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
    /// Run every case in this process instead of a child process each (a child keeps a kernel
    /// trap, a sticky CUDA error or a crash to its own case).
    #[arg(long)]
    pub in_process: bool,
    /// A case taking longer than this many seconds (in its child process) is killed and failed.
    #[arg(long, default_value_t = 900)]
    pub case_timeout: u64,
    /// Folder for the cases' files (a child process is handed its parent's).
    #[arg(long, hide = true)]
    pub work_dir: Option<PathBuf>,
}

/// Runs case `seed` in a child `laguna-dev device-test` process; its JSON line is the report, and a
/// crash, a timeout or no report is a failure of that case.
fn run_child(a: &SweepArgs, tol: f64, seed: u64, root: &Path) -> CaseReport {
    use std::io::Read;
    let failed = |e: String| CaseReport {
        seed,
        summary: String::new(),
        opts: String::new(),
        checks: vec![],
        error: Some(e),
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return failed(format!("no path to this executable: {e}")),
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("device-test")
        .args(["--random-configs", "1", "--seed", &seed.to_string()])
        .args(["--device", &a.device, "--tol", &tol.to_string()])
        .args(["--max-prompt", &a.max_prompt.to_string()])
        .args(["--gen-tokens", &a.gen_tokens.to_string()])
        .args(["--json", "--in-process", "--work-dir"])
        .arg(root)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if a.quick {
        cmd.arg("--quick");
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return failed(format!("could not start a child process: {e}")),
    };
    let pipe = |mut p: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut b = vec![];
            let _ = p.read_to_end(&mut b);
            String::from_utf8_lossy(&b).to_string()
        })
    };
    let out = pipe(Box::new(child.stdout.take().unwrap()));
    let err = pipe(Box::new(child.stderr.take().unwrap()));
    let t0 = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if t0.elapsed().as_secs() >= a.case_timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(50)),
            Err(e) => return failed(format!("waiting for the child process: {e}")),
        }
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    let report = out
        .lines()
        .last()
        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .and_then(|v| CaseReport::from_json(&v["cases"][0]));
    match (status, report) {
        (Some(_), Some(r)) => r,
        (None, _) => failed(format!(
            "killed after {} s (--case-timeout)",
            a.case_timeout
        )),
        (Some(s), None) => {
            let tail: String = err
                .chars()
                .rev()
                .take(600)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            failed(format!(
                "the case's process ended ({s}) without a report: {tail}"
            ))
        }
    }
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
    let root = a.work_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("laguna-sweep-{}", std::process::id()))
    });
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
        let mut r = if a.in_process {
            run_case(&case, &settings, &dir)
        } else {
            run_child(a, tol, seed, &root)
        };
        if r.summary.is_empty() {
            r.summary = config_gen::case_summary(&case);
        }
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
        if a.work_dir.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        reports.push(r);
    }
    if a.work_dir.is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
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
