//! One layer of recipe values (file, environment or flags), each field optional, and the merge
//! that turns the stacked layers into a [`Recipe`].
use super::{
    defaults, Device, KvCacheDtype, ModelSource, Recipe, RecipeError, Result, SpecK, Speculative,
    DEFAULT_REVISION,
};
use std::path::{Path, PathBuf};

/// A model named by a layer: a Hub repo id or a local folder (already resolved to a full path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    Repo(String),
    Path(PathBuf),
    /// `none`: no draft.
    Disabled,
}

#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub model: Option<ModelSpec>,
    pub model_revision: Option<String>,
    pub draft: Option<ModelSpec>,
    pub draft_revision: Option<String>,
    pub served_model_name: Option<String>,
    pub device: Option<Device>,
    pub max_model_len: Option<usize>,
    pub gpu_memory_utilization: Option<f64>,
    pub kv_cache_memory_bytes: Option<u64>,
    pub kv_cache_dtype: Option<KvCacheDtype>,
    pub max_num_seqs: Option<usize>,
    pub max_num_batched_tokens: Option<usize>,
    pub speculative_method: Option<String>,
    pub num_speculative_tokens: Option<SpecK>,
    pub memory_cap_bytes: Option<u64>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub enable_prefix_caching: Option<bool>,
    pub max_request_bytes: Option<u64>,
}

/// `123`, `12GiB`, `512MiB`, `1.5GB`, ... (binary suffixes are powers of 1024, decimal of 1000).
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim().replace('_', "");
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(format!(
                "`{s}`: unknown unit `{other}` (use bytes, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
            ))
        }
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a byte count (e.g. 12884901888 or 12GiB)"))?;
    Ok((n * mult).round() as u64)
}

fn invalid(origin: &str, field: &str, msg: impl Into<String>) -> RecipeError {
    RecipeError::Invalid {
        origin: origin.to_string(),
        field: field.to_string(),
        msg: msg.into(),
    }
}

/// `org/name`, `none`, or a local folder (relative to `base`).
pub(crate) fn model_spec(value: &str, base: &Path, origin: &str, field: &str) -> Result<ModelSpec> {
    if value.eq_ignore_ascii_case("none") {
        return Ok(ModelSpec::Disabled);
    }
    match ModelSource::parse_cli(value, None, base) {
        Ok(ModelSource::Local(p)) => Ok(ModelSpec::Path(p)),
        Ok(ModelSource::Hub { repo, .. }) => Ok(ModelSpec::Repo(repo)),
        Err(msg) => Err(invalid(origin, field, msg)),
    }
}

impl Overrides {
    /// The recipe variables of the process environment; relative paths against the working folder.
    pub fn from_process_env() -> Result<Overrides> {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        Overrides::from_env(&|k| std::env::var(k).ok(), &cwd)
    }

    /// Read the `LAGUNA_*` variables through `env`; relative paths are resolved against `cwd`.
    /// The names are the `Scope::Recipe` rows of `laguna_kernels::env::TABLE`.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>, cwd: &Path) -> Result<Overrides> {
        let mut o = Overrides::default();
        let get = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        fn num<T: std::str::FromStr>(k: &str, v: String, what: &str) -> Result<T> {
            v.trim()
                .parse()
                .map_err(|_| invalid("environment", k, format!("= `{v}` is not {what}")))
        }
        if let Some(v) = get("LAGUNA_MODEL") {
            o.model = Some(model_spec(&v, cwd, "environment", "LAGUNA_MODEL")?);
        }
        o.model_revision = get("LAGUNA_MODEL_REVISION");
        if let Some(v) = get("LAGUNA_DRAFT") {
            o.draft = Some(model_spec(&v, cwd, "environment", "LAGUNA_DRAFT")?);
        }
        o.draft_revision = get("LAGUNA_DRAFT_REVISION");
        o.served_model_name = get("LAGUNA_SERVED_MODEL_NAME");
        if let Some(v) = get("LAGUNA_DEVICE") {
            o.device =
                Some(Device::parse(&v).map_err(|m| invalid("environment", "LAGUNA_DEVICE", m))?);
        }
        if let Some(v) = get("LAGUNA_MAX_MODEL_LEN") {
            o.max_model_len = Some(num("LAGUNA_MAX_MODEL_LEN", v, "a token count")?);
        }
        if let Some(v) = get("LAGUNA_GPU_MEMORY_UTILIZATION") {
            o.gpu_memory_utilization = Some(num(
                "LAGUNA_GPU_MEMORY_UTILIZATION",
                v,
                "a fraction like 0.5",
            )?);
        }
        if let Some(v) = get("LAGUNA_KV_CACHE_MEMORY_BYTES") {
            o.kv_cache_memory_bytes = Some(
                parse_bytes(&v)
                    .map_err(|m| invalid("environment", "LAGUNA_KV_CACHE_MEMORY_BYTES", m))?,
            );
        }
        if let Some(v) = get("LAGUNA_KV_CACHE_DTYPE") {
            o.kv_cache_dtype = Some(
                KvCacheDtype::parse(&v)
                    .map_err(|m| invalid("environment", "LAGUNA_KV_CACHE_DTYPE", m))?,
            );
        }
        if let Some(v) = get("LAGUNA_MAX_NUM_SEQS") {
            o.max_num_seqs = Some(num("LAGUNA_MAX_NUM_SEQS", v, "a positive integer")?);
        }
        if let Some(v) = get("LAGUNA_MAX_NUM_BATCHED_TOKENS") {
            o.max_num_batched_tokens = Some(num(
                "LAGUNA_MAX_NUM_BATCHED_TOKENS",
                v,
                "a positive integer",
            )?);
        }
        o.speculative_method = get("LAGUNA_SPECULATIVE_METHOD");
        if let Some(v) = get("LAGUNA_NUM_SPECULATIVE_TOKENS") {
            o.num_speculative_tokens = Some(
                SpecK::parse(&v)
                    .map_err(|m| invalid("environment", "LAGUNA_NUM_SPECULATIVE_TOKENS", m))?,
            );
        }
        if let Some(v) = get("LAGUNA_MEMORY_CAP_BYTES") {
            o.memory_cap_bytes = Some(
                parse_bytes(&v)
                    .map_err(|m| invalid("environment", "LAGUNA_MEMORY_CAP_BYTES", m))?,
            );
        }
        o.host = get("LAGUNA_HOST");
        if let Some(v) = get("LAGUNA_PORT") {
            o.port = Some(num("LAGUNA_PORT", v, "a port number (0-65535)")?);
        }
        Ok(o)
    }

    /// Lay `top` over `self`: every field `top` sets wins. Naming a new model resets the
    /// revision unless `top` names one too (a revision belongs to its repo).
    pub fn apply(&mut self, top: Overrides) {
        if top.model.is_some() {
            self.model = top.model;
            self.model_revision = top.model_revision;
        } else if top.model_revision.is_some() {
            self.model_revision = top.model_revision;
        }
        if top.draft.is_some() {
            self.draft = top.draft;
            self.draft_revision = top.draft_revision;
        } else if top.draft_revision.is_some() {
            self.draft_revision = top.draft_revision;
        }
        macro_rules! take {
            ($($f:ident),*) => { $( if top.$f.is_some() { self.$f = top.$f; } )* };
        }
        take!(
            served_model_name,
            device,
            max_model_len,
            gpu_memory_utilization,
            kv_cache_memory_bytes,
            kv_cache_dtype,
            max_num_seqs,
            max_num_batched_tokens,
            speculative_method,
            num_speculative_tokens,
            memory_cap_bytes,
            host,
            port,
            enable_prefix_caching,
            max_request_bytes
        );
    }

    /// Fill defaults and validate.
    pub fn finish(self, path: Option<PathBuf>) -> Result<Recipe> {
        let origin = match &path {
            Some(p) => format!("recipe {}", p.display()),
            None => "command line".to_string(),
        };
        let source = |spec: ModelSpec, rev: Option<String>| match spec {
            ModelSpec::Repo(r) => Some(ModelSource::Hub {
                repo: r,
                revision: rev.unwrap_or_else(|| DEFAULT_REVISION.into()),
            }),
            ModelSpec::Path(p) => Some(ModelSource::Local(p)),
            ModelSpec::Disabled => None,
        };
        let model = match self.model {
            Some(m) => source(m, self.model_revision)
                .ok_or_else(|| invalid(&origin, "model", "cannot be `none`; name a Hub repo (org/name) or a local folder"))?,
            None => {
                return Err(invalid(
                    &origin,
                    "model",
                    "is not set: give --recipe FILE, --model REPO|DIR, or LAGUNA_MODEL (see recipes/README.md)",
                ))
            }
        };
        let draft = self.draft.and_then(|d| source(d, self.draft_revision));
        let served_model_name = match self.served_model_name {
            Some(n) => n,
            None => match &model {
                ModelSource::Hub { repo, .. } => {
                    repo.rsplit('/').next().unwrap_or(repo).to_string()
                }
                ModelSource::Local(p) => p
                    .file_name()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "laguna".into()),
            },
        };
        if served_model_name.trim().is_empty() {
            return Err(invalid(&origin, "served_model_name", "must not be empty"));
        }
        let gpu_memory_utilization = self
            .gpu_memory_utilization
            .unwrap_or(defaults::GPU_MEMORY_UTILIZATION);
        if !(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0) {
            return Err(invalid(
                &origin,
                "gpu_memory_utilization",
                format!("is {gpu_memory_utilization}; it must be in (0, 1], e.g. 0.5"),
            ));
        }
        let max_num_seqs = self.max_num_seqs.unwrap_or(defaults::MAX_NUM_SEQS);
        if max_num_seqs == 0 {
            return Err(invalid(&origin, "max_num_seqs", "must be at least 1"));
        }
        let max_num_batched_tokens = self
            .max_num_batched_tokens
            .unwrap_or(defaults::MAX_NUM_BATCHED_TOKENS);
        if max_num_batched_tokens == 0 {
            return Err(invalid(
                &origin,
                "max_num_batched_tokens",
                "must be at least 1",
            ));
        }
        if self.max_model_len == Some(0) {
            return Err(invalid(&origin, "max_model_len", "must be at least 1"));
        }
        if self.kv_cache_memory_bytes == Some(0) {
            return Err(invalid(
                &origin,
                "kv_cache_memory_bytes",
                "must be positive (or leave it out to size the KV pool from the memory cap)",
            ));
        }
        if self.max_request_bytes == Some(0) {
            return Err(invalid(
                &origin,
                "max_request_bytes",
                "must be positive, e.g. 32MiB",
            ));
        }
        let speculative = match (&draft, self.speculative_method, self.num_speculative_tokens) {
            (None, Some(m), _) => {
                return Err(invalid(
                    &origin,
                    "speculative.method",
                    format!("is `{m}` but there is no draft model; add a [draft] table or remove [speculative]"),
                ))
            }
            (None, None, _) => None,
            (Some(_), method, k) => {
                let method = method.unwrap_or_else(|| "dflash".into());
                if method != "dflash" {
                    return Err(invalid(&origin, "speculative.method", format!("is `{method}`; only `dflash` is supported")));
                }
                let k = k.unwrap_or(defaults::NUM_SPECULATIVE_TOKENS);
                if k == SpecK::Fixed(0) {
                    return Err(invalid(
                        &origin,
                        "speculative.num_speculative_tokens",
                        "must be at least 1 (remove the draft to disable speculation)",
                    ));
                }
                Some(Speculative { method, num_speculative_tokens: k })
            }
        };
        let device = match self.device {
            Some(d) => d,
            None => Device::parse(defaults::DEVICE).expect("default device parses"),
        };
        Ok(Recipe {
            path,
            model,
            draft,
            served_model_name,
            device,
            max_model_len: self.max_model_len,
            gpu_memory_utilization,
            kv_cache_memory_bytes: self.kv_cache_memory_bytes,
            kv_cache_dtype: self.kv_cache_dtype.unwrap_or(KvCacheDtype::Auto),
            max_num_seqs,
            max_num_batched_tokens,
            speculative,
            memory_cap_bytes: self.memory_cap_bytes,
            host: self.host.unwrap_or_else(|| defaults::HOST.into()),
            port: self.port.unwrap_or(defaults::PORT),
            enable_prefix_caching: self.enable_prefix_caching.unwrap_or(true),
            max_request_bytes: self
                .max_request_bytes
                .unwrap_or(crate::serve::limits::DEFAULT_MAX_REQUEST_BYTES),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use laguna_kernels::env::{Scope, TABLE};

    /// The variables `from_env` reads are exactly the recipe rows of the one table.
    #[test]
    fn env_names_are_the_table_recipe_rows() {
        let asked = std::cell::RefCell::new(vec![]);
        let env = |k: &str| {
            asked.borrow_mut().push(k.to_string());
            None
        };
        Overrides::from_env(&env, Path::new("/")).unwrap();
        let mut asked = asked.into_inner();
        asked.sort();
        let mut rows: Vec<String> = TABLE
            .iter()
            .filter(|v| v.scope == Scope::Recipe)
            .map(|v| v.name.to_string())
            .collect();
        rows.sort();
        assert_eq!(asked, rows);
    }

    /// The table's defaults of the recipe rows are the recipe's.
    #[test]
    fn table_defaults_are_the_recipe_defaults() {
        let default = |name: &str| TABLE.iter().find(|v| v.name == name).unwrap().default;
        for (name, want) in [
            ("LAGUNA_MODEL_REVISION", DEFAULT_REVISION.to_string()),
            ("LAGUNA_DRAFT_REVISION", DEFAULT_REVISION.to_string()),
            ("LAGUNA_DEVICE", defaults::DEVICE.to_string()),
            (
                "LAGUNA_GPU_MEMORY_UTILIZATION",
                defaults::GPU_MEMORY_UTILIZATION.to_string(),
            ),
            ("LAGUNA_MAX_NUM_SEQS", defaults::MAX_NUM_SEQS.to_string()),
            (
                "LAGUNA_MAX_NUM_BATCHED_TOKENS",
                defaults::MAX_NUM_BATCHED_TOKENS.to_string(),
            ),
            (
                "LAGUNA_NUM_SPECULATIVE_TOKENS",
                defaults::NUM_SPECULATIVE_TOKENS.to_string(),
            ),
            ("LAGUNA_HOST", defaults::HOST.to_string()),
            ("LAGUNA_PORT", defaults::PORT.to_string()),
        ] {
            assert!(
                default(name).starts_with(&format!("`{want}`")),
                "{name}: table says {}, the recipe {want}",
                default(name)
            );
        }
    }

    #[test]
    fn bytes_units() {
        assert_eq!(parse_bytes("12884901888").unwrap(), 12884901888);
        assert_eq!(parse_bytes("12GiB").unwrap(), 12884901888);
        assert_eq!(parse_bytes("1.5 GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert!(parse_bytes("12 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
    }
}
