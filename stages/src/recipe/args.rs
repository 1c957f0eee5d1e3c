//! Recipe flags shared by every stage subcommand (`#[command(flatten)]` them). Flags beat
//! `LAGUNA_*` variables, which beat the recipe file, which beats the defaults.
use super::overrides::{model_spec, parse_bytes, Overrides};
use super::{Device, KvCacheDtype, Recipe, RecipeError, Result, SpecK};
use std::path::PathBuf;

/// Where the model and draft come from (every stage).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SourceArgs {
    /// Recipe file (TOML, see recipes/README.md). Env: LAGUNA_RECIPE.
    #[arg(long, value_name = "FILE")]
    pub recipe: Option<PathBuf>,
    /// Target model: a Hub repo (org/name) or a local folder. Env: LAGUNA_MODEL.
    #[arg(long, value_name = "REPO|DIR")]
    pub model: Option<String>,
    /// Revision (branch, tag or commit) of the model repo. Env: LAGUNA_MODEL_REVISION.
    #[arg(long, value_name = "REV")]
    pub revision: Option<String>,
    /// Draft model (Hub repo or folder); `none` disables speculation. Env: LAGUNA_DRAFT.
    #[arg(long, value_name = "REPO|DIR|none")]
    pub draft: Option<String>,
    /// Revision of the draft repo. Env: LAGUNA_DRAFT_REVISION.
    #[arg(long, value_name = "REV")]
    pub draft_revision: Option<String>,
}

/// How the engine runs them (plan, serve).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EngineArgs {
    /// cpu, cuda or cuda:N. Env: LAGUNA_DEVICE.
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
    /// Longest prompt + completion in tokens. Env: LAGUNA_MAX_MODEL_LEN.
    #[arg(long, value_name = "TOKENS")]
    pub max_model_len: Option<usize>,
    /// Fraction of device memory laguna may use. Env: LAGUNA_GPU_MEMORY_UTILIZATION.
    #[arg(long, value_name = "FRACTION")]
    pub gpu_memory_utilization: Option<f64>,
    /// KV cache budget (bytes, or e.g. 12GiB). Env: LAGUNA_KV_CACHE_MEMORY_BYTES.
    #[arg(long, value_name = "BYTES")]
    pub kv_cache_memory_bytes: Option<String>,
    /// auto, bf16 or fp8. Env: LAGUNA_KV_CACHE_DTYPE.
    #[arg(long, value_name = "DTYPE")]
    pub kv_cache_dtype: Option<String>,
    /// Most sequences in flight. Env: LAGUNA_MAX_NUM_SEQS.
    #[arg(long, value_name = "N")]
    pub max_num_seqs: Option<usize>,
    /// Most tokens in one engine step. Env: LAGUNA_MAX_NUM_BATCHED_TOKENS.
    #[arg(long, value_name = "N")]
    pub max_num_batched_tokens: Option<usize>,
    /// Speculative decoding method (dflash). Env: LAGUNA_SPECULATIVE_METHOD.
    #[arg(long, value_name = "METHOD")]
    pub speculative_method: Option<String>,
    /// Draft tokens proposed per step: K >= 1, or `auto` (adaptive k up to the draft's
    /// block_size - 1, from step times measured at load). Env: LAGUNA_NUM_SPECULATIVE_TOKENS.
    #[arg(long, value_name = "K|auto")]
    pub num_speculative_tokens: Option<String>,
    /// Hard cap on device memory (bytes, or e.g. 40GiB). Env: LAGUNA_MEMORY_CAP_BYTES.
    #[arg(long, value_name = "BYTES")]
    pub memory_cap_bytes: Option<String>,
}

/// How the server listens (serve).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServerArgs {
    /// Name clients use in the `model` field. Env: LAGUNA_SERVED_MODEL_NAME.
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// Address to listen on. Env: LAGUNA_HOST.
    #[arg(long, value_name = "HOST")]
    pub host: Option<String>,
    /// Port to listen on. Env: LAGUNA_PORT.
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
    /// Prefill every prompt in full: no prefix cache (recipe: enable_prefix_caching = false).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Request bodies over this size get a 413 (bytes, or e.g. 64MiB; default 32MiB).
    #[arg(long, value_name = "BYTES")]
    pub max_request_bytes: Option<String>,
}

/// Every recipe flag. Each subcommand flattens only the groups it uses and fills the rest with
/// defaults (`From<SourceArgs>`), so `--help` lists only what it reads.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RecipeArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub server: ServerArgs,
}

impl From<SourceArgs> for RecipeArgs {
    fn from(source: SourceArgs) -> Self {
        RecipeArgs {
            source,
            ..Default::default()
        }
    }
}

impl RecipeArgs {
    /// Source and engine flags (no server flags).
    pub fn engine(source: SourceArgs, engine: EngineArgs) -> Self {
        RecipeArgs {
            source,
            engine,
            ..Default::default()
        }
    }
}

fn invalid(flag: &str, msg: String) -> RecipeError {
    RecipeError::Invalid {
        origin: "command line".into(),
        field: flag.into(),
        msg,
    }
}

impl RecipeArgs {
    /// The flags as an override layer (relative paths against the current folder).
    pub fn overrides(&self) -> Result<Overrides> {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        let mut o = Overrides::default();
        if let Some(m) = &self.source.model {
            o.model = Some(model_spec(m, &cwd, "command line", "--model")?);
        }
        o.model_revision = self.source.revision.clone();
        if let Some(d) = &self.source.draft {
            o.draft = Some(model_spec(d, &cwd, "command line", "--draft")?);
        }
        o.draft_revision = self.source.draft_revision.clone();
        o.served_model_name = self.server.served_model_name.clone();
        if let Some(d) = &self.engine.device {
            o.device = Some(Device::parse(d).map_err(|m| invalid("--device", m))?);
        }
        o.max_model_len = self.engine.max_model_len;
        o.gpu_memory_utilization = self.engine.gpu_memory_utilization;
        if let Some(b) = &self.engine.kv_cache_memory_bytes {
            o.kv_cache_memory_bytes =
                Some(parse_bytes(b).map_err(|m| invalid("--kv-cache-memory-bytes", m))?);
        }
        if let Some(d) = &self.engine.kv_cache_dtype {
            o.kv_cache_dtype =
                Some(KvCacheDtype::parse(d).map_err(|m| invalid("--kv-cache-dtype", m))?);
        }
        o.max_num_seqs = self.engine.max_num_seqs;
        o.max_num_batched_tokens = self.engine.max_num_batched_tokens;
        o.speculative_method = self.engine.speculative_method.clone();
        if let Some(k) = &self.engine.num_speculative_tokens {
            o.num_speculative_tokens =
                Some(SpecK::parse(k).map_err(|m| invalid("--num-speculative-tokens", m))?);
        }
        if let Some(b) = &self.engine.memory_cap_bytes {
            o.memory_cap_bytes =
                Some(parse_bytes(b).map_err(|m| invalid("--memory-cap-bytes", m))?);
        }
        o.host = self.server.host.clone();
        o.port = self.server.port;
        if self.server.no_prefix_cache {
            o.enable_prefix_caching = Some(false);
        }
        if let Some(b) = &self.server.max_request_bytes {
            o.max_request_bytes =
                Some(parse_bytes(b).map_err(|m| invalid("--max-request-bytes", m))?);
        }
        Ok(o)
    }

    /// The recipe file: `--recipe`, else `LAGUNA_RECIPE`.
    pub fn recipe_path(&self, env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
        self.source.recipe.clone().or_else(|| {
            env(laguna_kernels::env::RECIPE)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
        })
    }

    /// Resolve the final recipe with the process environment.
    pub fn resolve(&self) -> Result<Recipe> {
        let env = |k: &str| std::env::var(k).ok();
        let path = self.recipe_path(&env);
        Recipe::resolve(path.as_deref(), &env, &self.overrides()?)
    }
}
