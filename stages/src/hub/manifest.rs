//! The manifest `laguna fetch` writes next to what it downloaded: every file with its size, the
//! Hub's etag (SHA-256 for LFS files, git blob SHA-1 otherwise) and the SHA-256 of the bytes.
//! `laguna verify` checks a folder against it.
//!
//! Where it lives: `<cache>/models--org--name/.laguna/<commit>.json` for the HF cache (outside
//! `snapshots/`, so Python tools never see an extra file), `<dir>/.cache/laguna/manifest.json`
//! for `--local-dir`.
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const MANIFEST_DIR: &str = ".laguna";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ManifestFile {
    /// Path inside the repo (`/`-separated).
    pub path: String,
    pub size: u64,
    /// The Hub's etag, quotes removed: 64-hex SHA-256 (LFS) or 40-hex git blob SHA-1.
    pub etag: String,
    /// SHA-256 of the content, computed while downloading.
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    pub endpoint: String,
    pub files: Vec<ManifestFile>,
}

impl Manifest {
    /// Manifest path of a cache snapshot.
    pub fn cache_path(repo_root: &Path, commit: &str) -> PathBuf {
        repo_root.join(MANIFEST_DIR).join(format!("{commit}.json"))
    }

    /// Manifest path of a `--local-dir` download.
    pub fn local_path(dir: &Path) -> PathBuf {
        dir.join(".cache").join("laguna").join("manifest.json")
    }

    /// The manifest that belongs to a model folder: a cache snapshot (`…/snapshots/<commit>`) or a local dir.
    pub fn path_for_dir(dir: &Path) -> PathBuf {
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        if let (Some(commit), Some(snaps)) = (dir.file_name(), dir.parent()) {
            if snaps.file_name().is_some_and(|n| n == "snapshots") {
                if let Some(root) = snaps.parent() {
                    return Manifest::cache_path(root, &commit.to_string_lossy());
                }
            }
        }
        Manifest::local_path(&dir)
    }

    pub fn load(path: &Path) -> Option<std::result::Result<Manifest, String>> {
        let text = std::fs::read_to_string(path).ok()?;
        Some(serde_json::from_str(&text).map_err(|e| {
            format!(
                "{}: not a laguna manifest ({e}); re-run `laguna fetch`",
                path.display()
            )
        }))
    }

    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)?;
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::write(
            &tmp,
            serde_json::to_string_pretty(self).expect("manifest serializes") + "\n",
        )?;
        std::fs::rename(&tmp, path)
    }

    pub fn file(&self, path: &str) -> Option<&ManifestFile> {
        self.files.iter().find(|f| f.path == path)
    }
}
