use anyhow::Result;
use laguna_stages::hub::HubEnv;
use laguna_stages::plan::{plan_recipe, PlanOptions};
use laguna_stages::recipe::{overrides::parse_bytes, EngineArgs, RecipeArgs, SourceArgs};
use std::path::PathBuf;

/// Print the memory plan (weights, KV pool, sliding rings, activations, total vs cap and free
/// memory) and fail, before anything is loaded, when it does not fit.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Use this config.json for the model (e.g. before `laguna fetch`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Use this config.json for the draft.
    #[arg(long, value_name = "FILE")]
    pub draft_config: Option<PathBuf>,
    /// Plan for a device with this much memory (bytes or e.g. 128GiB) instead of probing this machine.
    #[arg(long, value_name = "BYTES")]
    pub device_memory: Option<String>,
    /// With --device-memory: plan it as unified memory shared with the host (DGX Spark's GB10):
    /// the peak during load counts the checkpoint's file pages in flight.
    #[arg(long, requires = "device_memory")]
    pub unified_memory: bool,
    /// Hub cache folder (default: $HF_HUB_CACHE, else $HF_HOME/hub).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    let recipe = RecipeArgs::engine(a.source, a.engine).resolve()?;
    let mut env = HubEnv::from_process_env();
    if let Some(c) = a.cache_dir {
        env.cache_dir = c;
    }
    let device_memory = a
        .device_memory
        .as_deref()
        .map(parse_bytes)
        .transpose()
        .map_err(|m| anyhow::anyhow!("--device-memory {m}"))?;
    let opts = PlanOptions {
        config: a.config,
        draft_config: a.draft_config,
        device_memory,
        unified: a.unified_memory,
    };
    let (plan, sources) = plan_recipe(&recipe, &env, &opts)?;
    println!("model config: {}", sources.model_config);
    if let Some(d) = &sources.draft_config {
        println!("draft config: {d}");
    }
    println!("{plan}");
    plan.check()?;
    println!("plan: fits");
    Ok(())
}
