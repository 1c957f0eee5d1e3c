//! The Hugging Face side: endpoint, token, offline switch, and the cache layout shared with Python
//! `huggingface_hub` (`models--org--name/{blobs/<etag>, snapshots/<commit>/<file>, refs/<rev>}`).
mod cache;
mod manifest;

pub use cache::{is_commit, repo_folder_name, RepoCache};
pub use manifest::{Manifest, ManifestFile, MANIFEST_DIR};

use std::path::{Path, PathBuf};

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{repo}@{revision} is not in the Hugging Face cache at {cache} and HF_HUB_OFFLINE=1 forbids downloading it; unset HF_HUB_OFFLINE (or run `laguna fetch` on a machine with network and copy the cache)")]
    OfflineMissing {
        repo: String,
        revision: String,
        cache: PathBuf,
    },
    #[error("{repo}@{revision} is not in the Hugging Face cache at {cache}; run `laguna fetch` first (or set HF_HOME/HF_HUB_CACHE to the cache that has it)")]
    NotCached {
        repo: String,
        revision: String,
        cache: PathBuf,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Connection and cache settings, read from the environment like `huggingface_hub` does.
#[derive(Debug, Clone)]
pub struct HubEnv {
    pub endpoint: String,
    pub token: Option<String>,
    /// The hub cache folder (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`).
    pub cache_dir: PathBuf,
    /// `HF_HUB_OFFLINE=1`: never touch the network; resolve everything from the cache.
    pub offline: bool,
}

fn truthy(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

impl HubEnv {
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> HubEnv {
        let get = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let home = get("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."));
        let hf_home = get("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            get("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| home.join(".cache"))
                .join("huggingface")
        });
        let cache_dir = get("HF_HUB_CACHE")
            .or_else(|| get("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("hub"));
        let token = get("HF_TOKEN")
            .or_else(|| get("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| {
                let path = get("HF_TOKEN_PATH")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| hf_home.join("token"));
                std::fs::read_to_string(path)
                    .ok()
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
            });
        let endpoint = get("HF_ENDPOINT")
            .unwrap_or_else(|| DEFAULT_ENDPOINT.into())
            .trim_end_matches('/')
            .to_string();
        let offline = get("HF_HUB_OFFLINE").is_some_and(|v| truthy(&v));
        HubEnv {
            endpoint,
            token,
            cache_dir,
            offline,
        }
    }

    pub fn from_process_env() -> HubEnv {
        HubEnv::from_env(&|k| std::env::var(k).ok())
    }

    pub fn repo(&self, repo: &str) -> RepoCache {
        RepoCache::new(&self.cache_dir, repo)
    }

    /// The snapshot folder of `repo@revision` in the cache, if it was fetched.
    pub fn cached_snapshot(&self, repo: &str, revision: &str) -> Result<PathBuf, HubError> {
        let rc = self.repo(repo);
        match rc.resolve_commit(revision) {
            Some(commit) if rc.snapshot_dir(&commit).is_dir() => Ok(rc.snapshot_dir(&commit)),
            _ if self.offline => Err(HubError::OfflineMissing {
                repo: repo.into(),
                revision: revision.into(),
                cache: self.cache_dir.clone(),
            }),
            _ => Err(HubError::NotCached {
                repo: repo.into(),
                revision: revision.into(),
                cache: self.cache_dir.clone(),
            }),
        }
    }
}

/// Where a model folder is on disk for a recipe source (cache snapshot or local folder).
pub fn local_dir(env: &HubEnv, source: &crate::recipe::ModelSource) -> Result<PathBuf, HubError> {
    match source {
        crate::recipe::ModelSource::Local(p) => Ok(p.clone()),
        crate::recipe::ModelSource::Hub { repo, revision } => env.cached_snapshot(repo, revision),
    }
}

/// `a/b/c` → `../../` (relative hop from `snapshots/<commit>/<file>` back to the repo folder).
pub(crate) fn ups(file: &Path) -> PathBuf {
    let depth = file.components().count().saturating_sub(1) + 2;
    (0..depth).map(|_| "..").collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn env_precedence() {
        let m: HashMap<&str, &str> = [
            ("HOME", "/home/u"),
            ("HF_HOME", "/hf"),
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
            ("HF_HUB_OFFLINE", "1"),
        ]
        .into();
        let e = HubEnv::from_env(&|k| m.get(k).map(|s| s.to_string()));
        assert_eq!(e.cache_dir, PathBuf::from("/hf/hub"));
        assert_eq!(e.endpoint, "http://127.0.0.1:9");
        assert!(e.offline);
        let m: HashMap<&str, &str> = [
            ("HOME", "/home/u"),
            ("HF_HOME", "/hf"),
            ("HF_HUB_CACHE", "/c"),
            ("HF_TOKEN", "t"),
        ]
        .into();
        let e = HubEnv::from_env(&|k| m.get(k).map(|s| s.to_string()));
        assert_eq!(e.cache_dir, PathBuf::from("/c"));
        assert_eq!(e.token.as_deref(), Some("t"));
        assert_eq!(e.endpoint, DEFAULT_ENDPOINT);
        assert!(!e.offline);
        let m: HashMap<&str, &str> = [("HOME", "/home/u")].into();
        assert_eq!(
            HubEnv::from_env(&|k| m.get(k).map(|s| s.to_string())).cache_dir,
            PathBuf::from("/home/u/.cache/huggingface/hub")
        );
    }

    #[test]
    fn relative_link_depth() {
        assert_eq!(ups(Path::new("config.json")), PathBuf::from("../.."));
        assert_eq!(ups(Path::new("a/b.json")), PathBuf::from("../../.."));
    }
}
