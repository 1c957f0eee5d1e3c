//! One repository's folder in the Hugging Face cache, exactly as `huggingface_hub` lays it out.
use super::{ups, HubError};
use std::path::{Path, PathBuf};

/// `org/name` → `models--org--name`.
pub fn repo_folder_name(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// A 40-hex git commit id.
pub fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[derive(Debug, Clone)]
pub struct RepoCache {
    pub repo: String,
    /// `<cache>/models--org--name`
    pub root: PathBuf,
}

fn io(path: &Path, e: std::io::Error) -> HubError {
    HubError::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

impl RepoCache {
    pub fn new(cache_dir: &Path, repo: &str) -> Self {
        RepoCache {
            repo: repo.to_string(),
            root: cache_dir.join(repo_folder_name(repo)),
        }
    }
    pub fn blobs_dir(&self) -> PathBuf {
        self.root.join("blobs")
    }
    pub fn blob(&self, etag: &str) -> PathBuf {
        self.blobs_dir().join(etag)
    }
    /// Partial download of a blob; renamed to [`RepoCache::blob`] only once complete and checked.
    pub fn incomplete(&self, etag: &str) -> PathBuf {
        self.blobs_dir().join(format!("{etag}.incomplete"))
    }
    pub fn snapshot_dir(&self, commit: &str) -> PathBuf {
        self.root.join("snapshots").join(commit)
    }
    pub fn ref_file(&self, revision: &str) -> PathBuf {
        self.root.join("refs").join(revision)
    }

    /// The commit a revision points at: itself if it is a commit, else `refs/<revision>`.
    pub fn resolve_commit(&self, revision: &str) -> Option<String> {
        if is_commit(revision) {
            return Some(revision.to_string());
        }
        std::fs::read_to_string(self.ref_file(revision))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| is_commit(s))
    }

    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<(), HubError> {
        if revision == commit {
            return Ok(());
        }
        let p = self.ref_file(revision);
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        }
        if std::fs::read_to_string(&p).ok().as_deref().map(str::trim) == Some(commit) {
            return Ok(());
        }
        std::fs::write(&p, commit).map_err(|e| io(&p, e))
    }

    /// `snapshots/<commit>/<file>` → `../../blobs/<etag>` (relative, like huggingface_hub).
    pub fn link(&self, commit: &str, file: &str, etag: &str) -> Result<PathBuf, HubError> {
        let dst = self.snapshot_dir(commit).join(file);
        if let Some(dir) = dst.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        }
        let target = ups(Path::new(file)).join("blobs").join(etag);
        if let Ok(existing) = std::fs::read_link(&dst) {
            if existing == target {
                return Ok(dst);
            }
        }
        if dst.symlink_metadata().is_ok() {
            std::fs::remove_file(&dst).map_err(|e| io(&dst, e))?;
        }
        #[cfg(unix)]
        std::os::unix::fs::symlink(&target, &dst).map_err(|e| io(&dst, e))?;
        #[cfg(not(unix))]
        std::fs::copy(self.blob(etag), &dst)
            .map(|_| ())
            .map_err(|e| io(&dst, e))?;
        Ok(dst)
    }

    /// Leftover `blobs/*.incomplete` files.
    pub fn incomplete_blobs(&self) -> Vec<PathBuf> {
        let Ok(rd) = std::fs::read_dir(self.blobs_dir()) else {
            return vec![];
        };
        let mut v: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "incomplete"))
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let rc = RepoCache::new(Path::new("/c"), "poolside/Laguna-XS-2.1-NVFP4");
        assert_eq!(
            rc.root,
            PathBuf::from("/c/models--poolside--Laguna-XS-2.1-NVFP4")
        );
        assert_eq!(
            rc.incomplete("ab"),
            PathBuf::from("/c/models--poolside--Laguna-XS-2.1-NVFP4/blobs/ab.incomplete")
        );
        assert!(is_commit("d32afde8b09af1539b49ff96ff5551c674485f8e"));
        assert!(!is_commit("main"));
        assert_eq!(
            rc.resolve_commit("d32afde8b09af1539b49ff96ff5551c674485f8e")
                .as_deref(),
            Some("d32afde8b09af1539b49ff96ff5551c674485f8e")
        );
    }
}
