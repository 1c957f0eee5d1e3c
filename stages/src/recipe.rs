//! Recipes: one TOML file that drives `fetch`, `verify`, `plan`, `warmup` and `serve`.
//!
//! Every field can be overridden by a CLI flag and a `LAGUNA_*` environment variable; the precedence
//! is flag > env > recipe > default. The schema is documented in `recipes/README.md`.
mod args;
mod file;
pub mod overrides;

pub use args::{EngineArgs, RecipeArgs, ServerArgs, SourceArgs};
pub use overrides::Overrides;

use std::fmt;
use std::path::{Path, PathBuf};

/// Default revision of a Hub repository when a recipe names none.
pub const DEFAULT_REVISION: &str = "main";

#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    #[error("recipe {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// TOML syntax errors and unknown keys; the toml message carries the line, column and key.
    #[error("recipe {path}: {msg}")]
    Parse { path: PathBuf, msg: String },
    #[error("{origin}: `{field}` {msg}")]
    Invalid {
        origin: String,
        field: String,
        msg: String,
    },
}

pub type Result<T> = std::result::Result<T, RecipeError>;

/// Where a model's files come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A Hugging Face Hub repository at a revision (branch, tag or commit).
    Hub { repo: String, revision: String },
    /// A local folder (config.json + *.safetensors).
    Local(PathBuf),
}

impl ModelSource {
    /// `repo` at `revision` (or `main`).
    pub fn hub(repo: &str, revision: Option<&str>) -> Self {
        ModelSource::Hub {
            repo: repo.to_string(),
            revision: revision.unwrap_or(DEFAULT_REVISION).to_string(),
        }
    }

    /// Interpret a flag/env value: an existing folder, or anything starting with `/`, `.` or `~`, is a
    /// local path (relative to `base`); otherwise `org/name` is a Hub repository.
    pub fn parse_cli(
        value: &str,
        revision: Option<&str>,
        base: &Path,
    ) -> std::result::Result<Self, String> {
        let looks_local =
            value.starts_with('/') || value.starts_with('.') || value.starts_with('~');
        let p = expand_home(value);
        let resolved = if p.is_absolute() {
            p.clone()
        } else {
            base.join(&p)
        };
        if looks_local || resolved.is_dir() {
            return Ok(ModelSource::Local(resolved));
        }
        if is_repo_id(value) {
            return Ok(ModelSource::hub(value, revision));
        }
        Err(format!(
            "`{value}` is neither an existing folder nor a Hub repository id like `org/name`"
        ))
    }

    pub fn label(&self) -> String {
        match self {
            ModelSource::Hub { repo, revision } => format!("{repo}@{revision}"),
            ModelSource::Local(p) => p.display().to_string(),
        }
    }
}

/// `org/name` with the characters the Hub allows.
pub fn is_repo_id(s: &str) -> bool {
    let ok = |part: &str| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    matches!(s.split('/').collect::<Vec<_>>().as_slice(), [a, b] if ok(a) && ok(b))
}

pub(crate) fn expand_home(s: &str) -> PathBuf {
    if let Some(rest) = s.strip_prefix("~/") {
        if let Some(home) = std::env::var_os("HOME") {
            return PathBuf::from(home).join(rest);
        }
    }
    PathBuf::from(s)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCacheDtype {
    /// The model's activation dtype (BF16 for Laguna).
    Auto,
    Bf16,
    Fp8,
}

impl KvCacheDtype {
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(KvCacheDtype::Auto),
            "bf16" | "bfloat16" => Ok(KvCacheDtype::Bf16),
            "fp8" | "fp8_e4m3" => Ok(KvCacheDtype::Fp8),
            _ => Err(format!(
                "`{s}` is not a KV cache dtype (expected auto, bf16 or fp8)"
            )),
        }
    }
    /// Bytes per stored K or V element. `auto` is BF16: Laguna's activations are BF16.
    pub fn bytes(self) -> u64 {
        match self {
            KvCacheDtype::Auto | KvCacheDtype::Bf16 => 2,
            KvCacheDtype::Fp8 => 1,
        }
    }
}

impl fmt::Display for KvCacheDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvCacheDtype::Auto => "auto (bf16)",
            KvCacheDtype::Bf16 => "bf16",
            KvCacheDtype::Fp8 => "fp8",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

impl Device {
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let l = s.to_ascii_lowercase();
        match l.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => l
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("`{s}` is not a device (expected cpu, cuda or cuda:N)")),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(0) => f.write_str("cuda"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Draft tokens per DFlash step (`num_speculative_tokens`): a fixed k, or `auto`, adaptive k
/// chosen each step from the sequence's acceptance and step times measured at load
/// (`laguna_engine::spec::controller`), up to the draft's `block_size - 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecK {
    Fixed(usize),
    Auto,
}

impl SpecK {
    /// `auto` or a positive integer.
    pub fn parse(s: &str) -> std::result::Result<SpecK, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("auto") {
            return Ok(SpecK::Auto);
        }
        match t.parse::<usize>() {
            Ok(0) => Err(format!(
                "`{s}`: k must be at least 1 (or `auto`; remove the draft to disable speculation)"
            )),
            Ok(k) => Ok(SpecK::Fixed(k)),
            Err(_) => Err(format!(
                "`{s}` is not a number of speculative tokens (expected `auto` or an integer >= 1)"
            )),
        }
    }

    /// The k the draft is loaded with, the most a step may run: the fixed k, or
    /// `block_size - 1` of a draft with that `dflash_config.block_size` for `auto`.
    pub fn max_k(self, block_size: usize) -> usize {
        match self {
            SpecK::Fixed(k) => k,
            SpecK::Auto => block_size.saturating_sub(1),
        }
    }

    /// The fixed k, `None` for `auto`.
    pub fn fixed(self) -> Option<usize> {
        match self {
            SpecK::Fixed(k) => Some(k),
            SpecK::Auto => None,
        }
    }
}

impl fmt::Display for SpecK {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecK::Fixed(k) => write!(f, "{k}"),
            SpecK::Auto => f.write_str("auto"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Speculative {
    /// Only `dflash` is implemented.
    pub method: String,
    pub num_speculative_tokens: SpecK,
}

/// A fully resolved recipe: every field has its final value.
#[derive(Debug, Clone)]
pub struct Recipe {
    /// The recipe file, when one was used.
    pub path: Option<PathBuf>,
    pub model: ModelSource,
    pub draft: Option<ModelSource>,
    pub served_model_name: String,
    pub device: Device,
    /// `None`: the model's `max_position_embeddings`.
    pub max_model_len: Option<usize>,
    pub gpu_memory_utilization: f64,
    /// `None`: whatever fits under the memory cap after weights and activations.
    pub kv_cache_memory_bytes: Option<u64>,
    pub kv_cache_dtype: KvCacheDtype,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub speculative: Option<Speculative>,
    /// Hard ceiling in bytes on everything laguna allocates on the device (in addition to
    /// `gpu_memory_utilization` x device memory).
    pub memory_cap_bytes: Option<u64>,
    pub host: String,
    pub port: u16,
    /// Reuse cached prompt prefixes across requests (vLLM's `enable_prefix_caching`; default on).
    pub enable_prefix_caching: bool,
    /// Request bodies over this many bytes get a 413 (`serve::limits`).
    pub max_request_bytes: u64,
}

pub mod defaults {
    pub const DEVICE: &str = "cuda";
    pub const GPU_MEMORY_UTILIZATION: f64 = 0.9;
    pub const MAX_NUM_SEQS: usize = 8;
    pub const MAX_NUM_BATCHED_TOKENS: usize = 8192;
    pub const NUM_SPECULATIVE_TOKENS: super::SpecK = super::SpecK::Fixed(6);
    pub const HOST: &str = "127.0.0.1";
    pub const PORT: u16 = 8000;
}

impl Recipe {
    /// Load `path` (if any), then apply `LAGUNA_*` variables from `env`, then the flags in `flags`.
    pub fn resolve(
        path: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
        flags: &Overrides,
    ) -> Result<Recipe> {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        let mut merged = match path {
            Some(p) => file::load(p)?,
            None => Overrides::default(),
        };
        let env_over = Overrides::from_env(env, &cwd)?;
        merged.apply(env_over);
        merged.apply(flags.clone());
        merged.finish(path.map(Path::to_path_buf))
    }

    /// Like [`Recipe::resolve`] with the process environment.
    pub fn load(path: Option<&Path>, flags: &Overrides) -> Result<Recipe> {
        Recipe::resolve(path, &|k| std::env::var(k).ok(), flags)
    }

    /// Where this recipe's values came from, for error messages.
    pub fn origin(&self) -> String {
        match &self.path {
            Some(p) => format!("recipe {}", p.display()),
            None => "command line".into(),
        }
    }

    /// Speculative tokens per step (`None` without a draft).
    pub fn spec_k(&self) -> Option<SpecK> {
        self.speculative.as_ref().map(|s| s.num_speculative_tokens)
    }
}

impl fmt::Display for Recipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "recipe:            {}",
            self.path
                .as_ref()
                .map_or("(none)".into(), |p| p.display().to_string())
        )?;
        writeln!(f, "model:             {}", self.model.label())?;
        if let Some(d) = &self.draft {
            writeln!(f, "draft:             {}", d.label())?;
        }
        writeln!(f, "served model name: {}", self.served_model_name)?;
        writeln!(f, "device:            {}", self.device)?;
        match self.max_model_len {
            Some(n) => writeln!(f, "max_model_len:     {n}")?,
            None => writeln!(f, "max_model_len:     (model's max_position_embeddings)")?,
        }
        writeln!(f, "kv cache dtype:    {}", self.kv_cache_dtype)?;
        if let Some(s) = &self.speculative {
            writeln!(
                f,
                "speculative:       {}, num_speculative_tokens {}",
                s.method, s.num_speculative_tokens
            )?;
        }
        write!(f, "listen:            {}:{}", self.host, self.port)
    }
}
