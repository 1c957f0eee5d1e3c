//! `laguna serve`: resolve the recipe/flags into `ServeOptions` and run the server.
use anyhow::{bail, Context, Result};
use laguna_stages::hub::{local_dir, HubEnv};
use laguna_stages::plan::{plan_recipe, PlanOptions};
use laguna_stages::recipe::{Device, Overrides, RecipeArgs};
use laguna_stages::serve::{self, ServeOptions};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub recipe: RecipeArgs,
    /// Require `Authorization: Bearer KEY` on /v1 routes (like vLLM's --api-key).
    #[arg(
        long,
        env = laguna_kernels::env::API_KEY,
        value_name = "KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// Requests allowed to wait for a free slot before new ones get 429 (0: no limit).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub max_waiting: usize,
    /// Turn thinking on for requests that do not set chat_template_kwargs.enable_thinking.
    #[arg(long)]
    pub default_enable_thinking: bool,
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

pub fn run(a: Args) -> Result<()> {
    let r = &a.recipe;
    let env_over = Overrides::from_process_env()?;
    let no_model =
        r.recipe_path(&env).is_none() && r.source.model.is_none() && env_over.model.is_none();
    let opts = if no_model {
        // No recipe and no model: the embedded tiny test model, on CPU.
        if let Some(d) = &r.engine.device {
            if Device::parse(d).map_err(anyhow::Error::msg)? != Device::Cpu {
                bail!("the embedded test model runs on CPU only; pass --model DIR or --recipe R to use --device {d}");
            }
        }
        if r.source.draft.is_some() {
            bail!("--draft needs --model DIR or --recipe R");
        }
        let d = ServeOptions::default();
        let flags = r.overrides()?;
        if flags.max_request_bytes == Some(0) {
            bail!("--max-request-bytes must be positive, e.g. 32MiB");
        }
        ServeOptions {
            model: None,
            host: r.server.host.clone().or(env_over.host).unwrap_or(d.host),
            port: r.server.port.or(env_over.port).unwrap_or(d.port),
            served_model_name: r.server.served_model_name.clone().into_iter().collect(),
            max_model_len: r.engine.max_model_len,
            max_num_seqs: r.engine.max_num_seqs.unwrap_or(d.max_num_seqs),
            max_num_batched_tokens: r.engine.max_num_batched_tokens,
            api_key: a.api_key.clone(),
            max_waiting: a.max_waiting,
            default_enable_thinking: a.default_enable_thinking,
            enable_prefix_caching: !r.server.no_prefix_cache,
            max_request_bytes: flags.max_request_bytes.unwrap_or(d.max_request_bytes),
            ..d
        }
    } else {
        let mut recipe = r.resolve()?;
        let hub = HubEnv::from_process_env();
        let model = local_dir(&hub, &recipe.model).with_context(|| {
            format!(
                "locating {} (run `laguna fetch` first?)",
                recipe.model.label()
            )
        })?;
        let draft = match &recipe.draft {
            Some(d) => Some(local_dir(&hub, d).with_context(|| {
                format!("locating draft {} (run `laguna fetch` first?)", d.label())
            })?),
            None => None,
        };
        super::check_model_dir(&model, "model")?;
        if let Some(d) = &draft {
            super::check_model_dir(d, "draft")?;
        }
        let explicit_device = r.engine.device.is_some() || env_over.device.is_some();
        let device = match recipe.device {
            Device::Cpu => "cpu".to_string(),
            Device::Cuda(_) if explicit_device => recipe.device.to_string(),
            // The default device is cuda; on a machine without a GPU, serve on CPU instead of failing.
            Device::Cuda(_) => match laguna_engine::cuda::gpu_available() {
                Ok(()) => recipe.device.to_string(),
                Err(e) => {
                    eprintln!(
                        "note: no usable GPU ({e}); serving on CPU (pass --device to choose)"
                    );
                    recipe.device = Device::Cpu;
                    "cpu".to_string()
                }
            },
        };
        // The memory plan, printed at start-up; refuse before loading anything when it will not fit.
        let (plan, _) = plan_recipe(&recipe, &hub, &PlanOptions::default())?;
        eprintln!("{plan}");
        plan.check()?;
        ServeOptions {
            model: Some(model),
            draft,
            num_speculative_tokens: recipe
                .spec_k()
                .unwrap_or(laguna_stages::recipe::defaults::NUM_SPECULATIVE_TOKENS),
            device,
            kv_cache_memory_bytes: recipe.kv_cache_memory_bytes.map(|b| b as usize),
            kv_cache_fp8: recipe.kv_cache_dtype == laguna_stages::recipe::KvCacheDtype::Fp8,
            host: recipe.host.clone(),
            port: recipe.port,
            served_model_name: vec![recipe.served_model_name.clone()],
            max_model_len: recipe.max_model_len,
            max_num_seqs: recipe.max_num_seqs,
            max_num_batched_tokens: Some(recipe.max_num_batched_tokens.max(recipe.max_num_seqs)),
            api_key: a.api_key.clone(),
            max_waiting: a.max_waiting,
            default_enable_thinking: a.default_enable_thinking,
            enable_prefix_caching: recipe.enable_prefix_caching,
            max_request_bytes: recipe.max_request_bytes,
        }
    };
    serve::run(opts)?;
    Ok(())
}
