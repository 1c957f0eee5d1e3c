//! The TOML form of a recipe. Unknown keys are errors (the toml message names the key, line and
//! column); relative model paths are resolved against the recipe file's folder.
use super::overrides::{parse_bytes, ModelSpec, Overrides};
use super::{Device, KvCacheDtype, RecipeError, Result, SpecK};
use serde::Deserialize;
use std::path::Path;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecipeFile {
    model: Option<ModelTable>,
    draft: Option<ModelTable>,
    served_model_name: Option<String>,
    device: Option<String>,
    max_model_len: Option<usize>,
    gpu_memory_utilization: Option<f64>,
    kv_cache_memory_bytes: Option<Bytes>,
    kv_cache_dtype: Option<String>,
    max_num_seqs: Option<usize>,
    max_num_batched_tokens: Option<usize>,
    speculative: Option<SpecTable>,
    memory_cap_bytes: Option<Bytes>,
    host: Option<String>,
    port: Option<u16>,
    enable_prefix_caching: Option<bool>,
    max_request_bytes: Option<Bytes>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelTable {
    repo: Option<String>,
    revision: Option<String>,
    path: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecTable {
    method: Option<String>,
    num_speculative_tokens: Option<KTable>,
}

/// `num_speculative_tokens`: an integer, or the string `"auto"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum KTable {
    Int(i64),
    Text(String),
}

/// An integer byte count, or a string with a unit ("12GiB").
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Bytes {
    Int(u64),
    Text(String),
}

fn invalid(path: &Path, field: &str, msg: impl Into<String>) -> RecipeError {
    RecipeError::Invalid {
        origin: format!("recipe {}", path.display()),
        field: field.into(),
        msg: msg.into(),
    }
}

fn model_table(
    t: ModelTable,
    table: &str,
    base: &Path,
    file: &Path,
) -> Result<(ModelSpec, Option<String>)> {
    match (t.repo, t.path) {
        (Some(_), Some(_)) => Err(invalid(
            file,
            table,
            "sets both `repo` and `path`; keep one",
        )),
        (None, None) => Err(invalid(
            file,
            table,
            "needs `repo = \"org/name\"` or `path = \"folder\"`",
        )),
        (Some(repo), None) => {
            if !super::is_repo_id(&repo) {
                return Err(invalid(
                    file,
                    &format!("{table}.repo"),
                    format!("`{repo}` is not a Hub repository id like `org/name`"),
                ));
            }
            Ok((ModelSpec::Repo(repo), t.revision))
        }
        (None, Some(p)) => {
            if t.revision.is_some() {
                return Err(invalid(
                    file,
                    &format!("{table}.revision"),
                    "only applies to `repo`, not to a local `path`",
                ));
            }
            let full = super::expand_home(&p);
            let full = if full.is_absolute() {
                full
            } else {
                base.join(full)
            };
            Ok((ModelSpec::Path(full), None))
        }
    }
}

/// Parse a recipe file into one override layer.
pub fn load(path: &Path) -> Result<Overrides> {
    let text = std::fs::read_to_string(path).map_err(|e| RecipeError::Read {
        path: path.to_path_buf(),
        source: e,
    })?;
    parse(&text, path)
}

pub fn parse(text: &str, path: &Path) -> Result<Overrides> {
    let f: RecipeFile = toml::from_str(text).map_err(|e| RecipeError::Parse {
        path: path.to_path_buf(),
        msg: format!(
            "{}\n(the recipe keys are listed in recipes/README.md)",
            e.to_string().trim_end()
        ),
    })?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let base = if base.as_os_str().is_empty() {
        std::path::PathBuf::from(".")
    } else {
        base
    };
    let mut o = Overrides::default();
    if let Some(m) = f.model {
        let (spec, rev) = model_table(m, "model", &base, path)?;
        o.model = Some(spec);
        o.model_revision = rev;
    }
    if let Some(d) = f.draft {
        let (spec, rev) = model_table(d, "draft", &base, path)?;
        o.draft = Some(spec);
        o.draft_revision = rev;
    }
    o.served_model_name = f.served_model_name;
    if let Some(d) = f.device {
        o.device = Some(Device::parse(&d).map_err(|m| invalid(path, "device", m))?);
    }
    o.max_model_len = f.max_model_len;
    o.gpu_memory_utilization = f.gpu_memory_utilization;
    let bytes = |b: Option<Bytes>, field: &str| -> Result<Option<u64>> {
        match b {
            None => Ok(None),
            Some(Bytes::Int(n)) => Ok(Some(n)),
            Some(Bytes::Text(s)) => parse_bytes(&s)
                .map(Some)
                .map_err(|m| invalid(path, field, m)),
        }
    };
    o.kv_cache_memory_bytes = bytes(f.kv_cache_memory_bytes, "kv_cache_memory_bytes")?;
    o.memory_cap_bytes = bytes(f.memory_cap_bytes, "memory_cap_bytes")?;
    o.max_request_bytes = bytes(f.max_request_bytes, "max_request_bytes")?;
    if let Some(d) = f.kv_cache_dtype {
        o.kv_cache_dtype =
            Some(KvCacheDtype::parse(&d).map_err(|m| invalid(path, "kv_cache_dtype", m))?);
    }
    o.max_num_seqs = f.max_num_seqs;
    o.max_num_batched_tokens = f.max_num_batched_tokens;
    if let Some(s) = f.speculative {
        o.speculative_method = s.method.or_else(|| Some("dflash".into()));
        let field = "speculative.num_speculative_tokens";
        o.num_speculative_tokens = match s.num_speculative_tokens {
            None => None,
            Some(KTable::Int(k)) => {
                Some(SpecK::parse(&k.to_string()).map_err(|m| invalid(path, field, m))?)
            }
            Some(KTable::Text(t)) => Some(SpecK::parse(&t).map_err(|m| invalid(path, field, m))?),
        };
    }
    o.host = f.host;
    o.port = f.port;
    o.enable_prefix_caching = f.enable_prefix_caching;
    Ok(o)
}
