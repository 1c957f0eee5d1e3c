use anyhow::{bail, Result};
use laguna_stages::hub::HubEnv;
use laguna_stages::recipe::{RecipeArgs, SourceArgs};
use laguna_stages::verify::{verify_recipe, VerifyOptions};
use std::path::PathBuf;

/// Check a fetched checkpoint: files complete, hashes match the Hub, safetensors headers sound,
/// tensors as the config implies (NVFP4 triplets included), draft compatible with the target.
/// Exits non-zero naming each bad file. `--model DIR [--draft DIR]` checks folders directly
/// (a folder may be a snapshot of the HF cache: linked blobs are checked against their names).
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Skip SHA-256 hashing (sizes, headers and the inventory are still checked).
    #[arg(long)]
    pub fast: bool,
    /// Hub cache folder (default: $HF_HUB_CACHE, else $HF_HOME/hub).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: Args) -> Result<()> {
    let mut env = HubEnv::from_process_env();
    if let Some(c) = &a.cache_dir {
        env.cache_dir = c.clone();
    }
    let opts = VerifyOptions {
        fast: a.fast,
        progress: !a.quiet,
        ..Default::default()
    };
    let recipe = RecipeArgs::from(a.source).resolve()?;
    let report = verify_recipe(&recipe, &env, &opts)?;
    println!("{report}");
    if !report.ok() {
        let problems = report.problems();
        bail!(
            "verify failed ({} problem(s)):\n  {}",
            problems.len(),
            problems.join("\n  ")
        );
    }
    Ok(())
}
