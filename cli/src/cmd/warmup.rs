//! `laguna warmup`: compile every CUDA kernel to a cubin for the GPU found (or the arches given)
//! into the on-disk cache, so that loading a model later is instant.
use anyhow::{bail, Result};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Recipe name or file (kernels are the same for every recipe today; accepted for symmetry).
    #[arg(long)]
    pub recipe: Option<String>,
    /// Target architectures (e.g. sm_90a sm_121a); default: the GPUs found.
    #[arg(long, num_args = 1..)]
    pub arch: Vec<String>,
    /// Cache folder (default $XDG_CACHE_HOME/laguna/kernels or ~/.cache/laguna/kernels).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// Instead of warming the cache: compile every kernel for the --arch given with ptxas'
    /// resource report and check it, with what the engine's launches ask for the XS-2.1 model
    /// and its DFlash draft, against the device's limits (known: sm_121a, GB10); exits non-zero
    /// naming each kernel over a limit (docs/design/gb10.md).
    #[arg(long)]
    pub audit: bool,
}

pub fn run(a: Args) -> Result<()> {
    if let Some(r) = &a.recipe {
        eprintln!("recipe {r}: every recipe uses the same kernel set; compiling all of it");
    }
    if !laguna_kernels::nvrtc_available() {
        bail!("{}", laguna_kernels::NO_NVRTC_HELP);
    }
    if a.audit {
        return audit(&a.arch);
    }
    let mut archs = a.arch.clone();
    if archs.is_empty() {
        archs = laguna_engine::cuda::detect_archs().map_err(|e| {
            anyhow::anyhow!("no GPU to take the architecture from ({e}); pass --arch, e.g. --arch sm_90a sm_121a")
        })?;
    }
    for ar in &archs {
        if !ar.starts_with("sm_") {
            bail!("--arch {ar}: expected a real architecture such as sm_90a or sm_121a");
        }
    }
    let root = a
        .cache_dir
        .clone()
        .unwrap_or_else(laguna_kernels::cache_root);
    let t = std::time::Instant::now();
    let res = laguna_kernels::warmup(&root, &archs, !a.json)?;
    let compiled = res.iter().filter(|r| r.compiled).count();
    let (maj, min) = laguna_kernels::nvrtc_version().unwrap_or((0, 0));
    if a.json {
        let items: Vec<_> = res
            .iter()
            .map(|r| serde_json::json!({"module": r.module, "arch": r.arch, "compiled": r.compiled, "bytes": r.bytes, "secs": r.secs}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"cache": root, "nvrtc": format!("{maj}.{min}"), "archs": archs, "compiled": compiled, "cached": res.len() - compiled, "secs": t.elapsed().as_secs_f64(), "modules": items})
        );
    } else {
        for r in &res {
            println!(
                "{:<10} {:<8} {:>8} bytes  {}",
                r.module,
                r.arch,
                r.bytes,
                if r.compiled {
                    format!("compiled in {:.2}s", r.secs)
                } else {
                    "cached".into()
                }
            );
        }
        println!(
            "{} kernel modules for {} ({} compiled, {} cached) with NVRTC {maj}.{min} in {:.2}s -> {}",
            res.len(),
            archs.join(", "),
            compiled,
            res.len() - compiled,
            t.elapsed().as_secs_f64(),
            root.display()
        );
    }
    Ok(())
}

/// The ptxas report of every module, as the launch plan's view of the kernels.
struct Compiled<'a> {
    reports: &'a [laguna_kernels::audit::ModuleReport],
    limits: laguna_kernels::audit::SmLimits,
}

impl Compiled<'_> {
    fn res(&self, name: &str) -> Option<&laguna_kernels::audit::Resources> {
        self.reports
            .iter()
            .flat_map(|m| m.entries.iter())
            .find(|(n, _)| n == name)
            .map(|(_, r)| r)
    }
}

impl laguna_engine::cuda::launch::plan::Kernels for Compiled<'_> {
    fn static_smem(&self, name: &str) -> u32 {
        self.res(name).map_or(0, |r| r.smem)
    }
    fn blocks_per_sm(&self, name: &str, block: u32, dyn_smem: u32) -> u32 {
        self.res(name).map_or(0, |r| {
            laguna_kernels::audit::blocks_per_sm(&self.limits, r, block, dyn_smem).0
        })
    }
}

/// `laguna warmup --arch sm_121a --audit`.
fn audit(archs: &[String]) -> Result<()> {
    use laguna_engine::config::LagunaConfig;
    use laguna_engine::cuda::launch::plan::{asks, Model};
    use laguna_kernels::audit;
    let [arch] = archs else {
        bail!("--audit takes one --arch (e.g. --arch sm_121a)");
    };
    let Some(limits) = audit::limits_for_arch(arch) else {
        bail!("--audit: no device limits known for {arch} (known: sm_121a)");
    };
    let props = laguna_engine::cuda::profile::GB10;
    let t = std::time::Instant::now();
    let reports = audit::report_all(arch, 2)?;
    let k = Compiled {
        reports: &reports,
        limits,
    };
    let xs = LagunaConfig::from_json_str(include_str!(
        "../../../tests/fixtures/reference/laguna-xs-2.1-nvfp4.config.json"
    ))?;
    let draft = LagunaConfig::from_json_str(include_str!(
        "../../../tests/fixtures/reference/laguna-xs-2.1-dflash.config.json"
    ))?;
    let gemm_min_rows = laguna_engine::backend::GEMM_MIN_ROWS;
    let mut all = vec![];
    for (cfg, fp4, noncausal, label) in [
        (&xs, true, false, "xs-2.1"),
        (&draft, false, true, "dflash"),
    ] {
        let m = Model {
            cfg,
            experts_fp4: fp4,
            noncausal,
            label,
        };
        all.extend(asks(&m, &props, &k, gemm_min_rows));
    }
    println!(
        "{:<34} {:>4} {:>9} {:>13} {:>7} {:>6} {:>11}  verdict ({} limits, {arch})",
        "kernel", "regs", "spill B", "smem st+dyn", "threads", "blk/SM", "co-res", limits.name
    );
    let mut failed = vec![];
    for m in &reports {
        for (name, r) in &m.entries {
            let mine: Vec<&audit::Ask> = all.iter().filter(|a| a.kernel == name).collect();
            let v = audit::judge(&limits, m.module, name, r, &mine);
            let (thr, dyn_smem, bps) = match v.worst {
                Some((b, s, n)) => (b.to_string(), s.to_string(), n.to_string()),
                None => ("-".into(), "-".into(), "-".into()),
            };
            let co = v
                .coresident
                .map_or("-".into(), |(g, room)| format!("{g}/{room}"));
            let mut verdict = if v.fails.is_empty() {
                "OK".to_string()
            } else {
                failed.push(name.clone());
                format!("FAIL {}", v.fails.join("; "))
            };
            if mine.is_empty() {
                verdict.push_str(" (not launched for these shapes)");
            }
            for n in &v.notes {
                verdict.push_str(&format!(" [{n}]"));
            }
            println!(
                "{name:<34} {:>4} {:>9} {:>13} {thr:>7} {bps:>6} {co:>11}  {verdict}",
                r.regs,
                format!("{}/{}", r.spill_stores, r.spill_loads),
                format!("{}+{dyn_smem}", r.smem),
            );
        }
        for (f, what) in &m.sm90 {
            failed.push(format!("{}:{f}", m.module));
            println!(
                "{:<34} FAIL {what} in the {arch} PTX (function {f})",
                m.module
            );
        }
    }
    let n: usize = reports.iter().map(|m| m.entries.len()).sum();
    println!(
        "{n} kernels audited for {} ({arch}) in {:.1}s: {} over a limit",
        limits.name,
        t.elapsed().as_secs_f64(),
        failed.len()
    );
    if !failed.is_empty() {
        bail!(
            "kernels over {}'s limits: {}",
            limits.name,
            failed.join(", ")
        );
    }
    Ok(())
}
