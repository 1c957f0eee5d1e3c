use anyhow::Result;
use laguna_stages::fetch::{fetch_recipe, FetchOptions};
use laguna_stages::hub::HubEnv;
use laguna_stages::recipe::{RecipeArgs, SourceArgs};
use std::path::PathBuf;

/// Download the recipe's model and draft at their pinned revisions into the Hugging Face cache
/// (HF_HOME / HF_HUB_CACHE; honours HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE=1).
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Download into this folder instead of the HF cache (with both a model and a draft, each goes
    /// into a sub-folder named after its repo).
    #[arg(long, value_name = "DIR")]
    pub local_dir: Option<PathBuf>,
    /// Hub cache folder (default: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Files downloaded in parallel.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub max_workers: usize,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: Args) -> Result<()> {
    let recipe = RecipeArgs::from(a.source).resolve()?;
    let mut env = HubEnv::from_process_env();
    if let Some(c) = a.cache_dir {
        env.cache_dir = c;
    }
    let opts = FetchOptions {
        local_dir: a.local_dir,
        max_workers: a.max_workers.max(1),
        progress: !a.quiet,
    };
    let reports = fetch_recipe(&recipe, &env, &opts)?;
    for r in &reports {
        println!("fetched {r}");
    }
    Ok(())
}
