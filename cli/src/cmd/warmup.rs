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
}

pub fn run(a: Args) -> Result<()> {
    if let Some(r) = &a.recipe {
        eprintln!("recipe {r}: every recipe uses the same kernel set; compiling all of it");
    }
    if !laguna_kernels::nvrtc_available() {
        bail!("{}", laguna_kernels::NO_NVRTC_HELP);
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
