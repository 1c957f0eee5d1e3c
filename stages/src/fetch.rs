//! `laguna fetch`: the recipe's model and draft repos at their pinned revisions, into the Hugging
//! Face cache (shared with Python `huggingface_hub`) or a `--local-dir`.
//!
//! Per file: HEAD for etag and size; skip when the blob is already complete; otherwise download
//! into `blobs/<etag>.incomplete` (resuming with a Range request), check the SHA-256 / git SHA-1
//! against the etag, rename to `blobs/<etag>`, link `snapshots/<commit>/<file>`. Then `refs/<rev>`
//! and the laguna manifest (see [`crate::hub::Manifest`]).
pub mod api;
mod download;
pub mod http;
pub mod pool;
pub mod progress;

use crate::hub::{HubEnv, HubError, Manifest, ManifestFile, RepoCache};
use crate::recipe::{ModelSource, Recipe};
use crate::verify::digest::{etag_kind, hash_file, EtagKind};
use progress::{commas, human, Progress};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("HTTP {status} from {url}: repository {repo} does not exist there, or it is gated/private and needs a token. Check the repo id in the recipe; for a gated or private repo set HF_TOKEN to a token that can read it (https://huggingface.co/settings/tokens) and accept the model's terms on its Hub page")]
    Unauthorized {
        repo: String,
        url: String,
        status: u16,
    },
    #[error("repository {repo} was not found on {endpoint}: check the repo id in the recipe (`[model] repo` / `[draft] repo`); if it is private, set HF_TOKEN")]
    RepoNotFound { repo: String, endpoint: String },
    #[error("revision `{revision}` was not found in {repo}: check `revision` in the recipe (a branch, tag or 40-hex commit of that repo)")]
    RevisionNotFound { repo: String, revision: String },
    #[error(
        "file `{file}` was not found in {repo}@{revision} (the Hub listed it but will not serve it); re-run fetch, or check the revision"
    )]
    FileNotFound {
        repo: String,
        revision: String,
        file: String,
    },
    #[error(
        "cannot reach {url}: {msg}. Check the network or HF_ENDPOINT (now {endpoint}); to use only the local cache set HF_HUB_OFFLINE=1"
    )]
    Network {
        url: String,
        endpoint: String,
        msg: String,
    },
    #[error("HTTP {status} from {url}: {msg}")]
    Http {
        url: String,
        status: u16,
        msg: String,
    },
    #[error("download of `{file}` stopped at {have} of {size} bytes ({msg}); re-run `laguna fetch` to resume from there")]
    Interrupted {
        file: String,
        have: u64,
        size: u64,
        msg: String,
    },
    #[error(
        "`{file}`: the server sent {got} bytes, more than the {expected} it announced; the partial file was removed, re-run `laguna fetch`"
    )]
    SizeMismatch {
        file: String,
        expected: u64,
        got: u64,
    },
    #[error("`{file}`: downloaded content has {got}, but the Hub's etag is {etag}; the partial file was removed, re-run `laguna fetch` (if it repeats, the mirror at HF_ENDPOINT serves bad data)")]
    Integrity {
        file: String,
        etag: String,
        got: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Hub(#[from] HubError),
    #[error("{} of the files failed:\n{}", .0.len(), .0.iter().map(|e| format!("  - {e}")).collect::<Vec<_>>().join("\n"))]
    Several(Vec<FetchError>),
}

#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Download into this folder instead of the HF cache (model into `<dir>/<repo name>`, draft
    /// into `<dir>/<draft repo name>` when the recipe has both).
    pub local_dir: Option<PathBuf>,
    pub max_workers: usize,
    pub progress: bool,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            local_dir: None,
            max_workers: 8,
            progress: true,
        }
    }
}

/// Where one repository's files go.
#[derive(Debug, Clone)]
pub enum Dest {
    Cache(RepoCache),
    Local(PathBuf),
}

#[derive(Debug, Clone, Default)]
pub struct RepoReport {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    /// The folder to load from (snapshot or local dir).
    pub dir: PathBuf,
    pub files: usize,
    pub downloaded_files: usize,
    /// Bytes that came over the network in this run.
    pub downloaded_bytes: u64,
    /// Bytes reused from `.incomplete` files of an earlier run.
    pub resumed_bytes: u64,
    pub total_bytes: u64,
    /// Resolved from the cache without any network call.
    pub offline: bool,
}

/// Fetch the recipe's model and draft (local folders are skipped).
pub fn fetch_recipe(
    recipe: &Recipe,
    env: &HubEnv,
    opts: &FetchOptions,
) -> Result<Vec<RepoReport>, FetchError> {
    let progress = Progress::new(opts.progress);
    let mut reports = vec![];
    let sources: Vec<&ModelSource> = std::iter::once(&recipe.model)
        .chain(recipe.draft.as_ref())
        .collect();
    let several = sources
        .iter()
        .filter(|s| matches!(s, ModelSource::Hub { .. }))
        .count()
        > 1;
    for src in sources {
        match src {
            ModelSource::Local(p) => progress.line(&format!(
                "{}: a local folder, nothing to fetch",
                p.display()
            )),
            ModelSource::Hub { repo, revision } => {
                let dest = match &opts.local_dir {
                    Some(d) if several => {
                        Dest::Local(d.join(repo.rsplit('/').next().unwrap_or(repo)))
                    }
                    Some(d) => Dest::Local(d.clone()),
                    None => Dest::Cache(env.repo(repo)),
                };
                reports.push(fetch_repo(env, repo, revision, &dest, opts, &progress)?);
            }
        }
    }
    Ok(reports)
}

fn manifest_path(dest: &Dest, commit: &str) -> PathBuf {
    match dest {
        Dest::Cache(rc) => Manifest::cache_path(&rc.root, commit),
        Dest::Local(d) => Manifest::local_path(d),
    }
}

/// Where a complete file lives: the blob (cache) or the file itself (local dir).
fn final_path(dest: &Dest, file: &str, etag: &str) -> PathBuf {
    match dest {
        Dest::Cache(rc) => rc.blob(etag),
        Dest::Local(d) => d.join(file),
    }
}

fn part_path(dest: &Dest, file: &str, etag: &str) -> PathBuf {
    match dest {
        Dest::Cache(rc) => rc.incomplete(etag),
        Dest::Local(d) => d
            .join(".cache")
            .join("laguna")
            .join("download")
            .join(format!("{file}.incomplete")),
    }
}

fn dest_dir(dest: &Dest, commit: &str) -> PathBuf {
    match dest {
        Dest::Cache(rc) => rc.snapshot_dir(commit),
        Dest::Local(d) => d.clone(),
    }
}

/// Every manifest file present with its size (the local `snapshots/<commit>/<file>` resolves).
fn complete_on_disk(dest: &Dest, m: &Manifest) -> Vec<String> {
    let dir = dest_dir(dest, &m.commit);
    m.files
        .iter()
        .filter(|f| std::fs::metadata(dir.join(&f.path)).map(|md| md.len()).ok() != Some(f.size))
        .map(|f| f.path.clone())
        .collect()
}

fn offline_report(repo: &str, revision: &str, dest: &Dest, m: &Manifest) -> RepoReport {
    RepoReport {
        repo: repo.into(),
        revision: revision.into(),
        commit: m.commit.clone(),
        dir: dest_dir(dest, &m.commit),
        files: m.files.len(),
        total_bytes: m.files.iter().map(|f| f.size).sum(),
        offline: true,
        ..Default::default()
    }
}

/// The commit a revision resolves to from disk alone.
fn local_commit(dest: &Dest, revision: &str) -> Option<String> {
    match dest {
        Dest::Cache(rc) => rc.resolve_commit(revision),
        Dest::Local(d) => match Manifest::load(&Manifest::local_path(d)) {
            Some(Ok(m)) if m.revision == revision || m.commit == revision => Some(m.commit),
            _ => None,
        },
    }
}

pub fn fetch_repo(
    env: &HubEnv,
    repo: &str,
    revision: &str,
    dest: &Dest,
    opts: &FetchOptions,
    progress: &Progress,
) -> Result<RepoReport, FetchError> {
    // Offline, or a pinned commit that is already complete: no network at all.
    let cached =
        local_commit(dest, revision).and_then(|c| match Manifest::load(&manifest_path(dest, &c)) {
            Some(Ok(m)) => Some(m),
            _ => None,
        });
    if env.offline {
        let cache = match dest {
            Dest::Cache(_) => env.cache_dir.clone(),
            Dest::Local(d) => d.clone(),
        };
        let missing_err = || HubError::OfflineMissing {
            repo: repo.into(),
            revision: revision.into(),
            cache: cache.clone(),
        };
        let m = cached.ok_or_else(missing_err)?;
        let missing = complete_on_disk(dest, &m);
        if !missing.is_empty() {
            progress.line(&format!(
                "{repo}@{revision}: missing in the cache: {}",
                missing.join(", ")
            ));
            return Err(missing_err().into());
        }
        progress.line(&format!(
            "{repo}@{revision}: complete in the cache (offline), {} files",
            m.files.len()
        ));
        return Ok(offline_report(repo, revision, dest, &m));
    }
    if let Some(m) = &cached {
        if crate::hub::is_commit(revision) && complete_on_disk(dest, m).is_empty() {
            progress.line(&format!(
                "{repo}@{revision}: already complete, {} files, nothing to download",
                m.files.len()
            ));
            return Ok(RepoReport {
                offline: false,
                ..offline_report(repo, revision, dest, m)
            });
        }
    }

    let http = http::Http::new(&env.endpoint, env.token.clone());
    let spin = progress.spinner(&format!("{repo}@{revision}: resolving"));
    let info = api::resolve_revision(&http, repo, revision);
    let info = match info {
        Ok(i) => i,
        Err(e) => {
            spin.finish_and_clear();
            return Err(e);
        }
    };
    spin.set_message(format!(
        "{repo}@{revision}: reading metadata of {} files",
        info.files.len()
    ));
    let metas = pool::parallel(&info.files, opts.max_workers, |f| {
        api::file_meta(&http, repo, revision, &info.commit, f)
    });
    spin.finish_and_clear();
    let (metas, errs): (Vec<_>, Vec<_>) = metas.into_iter().partition(Result::is_ok);
    let metas: Vec<api::FileMeta> = metas.into_iter().map(Result::unwrap).collect();
    let mut errs: Vec<FetchError> = errs.into_iter().map(|e| e.err().unwrap()).collect();
    if !errs.is_empty() {
        return Err(if errs.len() == 1 {
            errs.remove(0)
        } else {
            FetchError::Several(errs)
        });
    }

    let old = cached.or_else(
        || match Manifest::load(&manifest_path(dest, &info.commit)) {
            Some(Ok(m)) => Some(m),
            _ => None,
        },
    );
    let old_sha = |m: &api::FileMeta| -> Option<String> {
        old.as_ref()?
            .file(&m.path)
            .filter(|f| f.etag == m.etag && f.size == m.size)
            .map(|f| f.sha256.clone())
    };
    let is_done = |m: &api::FileMeta| -> bool {
        let fin = final_path(dest, &m.path, &m.etag);
        let size_ok = std::fs::metadata(&fin).map(|md| md.len()).ok() == Some(m.size);
        match dest {
            Dest::Cache(_) => size_ok,
            Dest::Local(_) => size_ok && old_sha(m).is_some(),
        }
    };
    let todo: u64 = metas.iter().filter(|m| !is_done(m)).map(|m| m.size).sum();
    let total_bar = progress.total("download", todo);
    total_bar.set_message(repo.to_string());
    let net_bytes = AtomicU64::new(0);
    let resumed = AtomicU64::new(0);
    let results = pool::parallel(
        &metas,
        opts.max_workers,
        |m| -> Result<(ManifestFile, bool), FetchError> {
            let fin = final_path(dest, &m.path, &m.etag);
            let done = is_done(m);
            let sha256 = if done {
                match (old_sha(m), etag_kind(&m.etag)) {
                    (Some(s), _) => s,
                    (None, EtagKind::Sha256) => m.etag.to_ascii_lowercase(),
                    (None, _) => {
                        hash_file(&fin, &|_| {})
                            .map_err(|e| FetchError::Io {
                                path: fin.clone(),
                                source: e,
                            })?
                            .0
                    }
                }
            } else {
                let part = part_path(dest, &m.path, &m.etag);
                let bar = progress.file(&m.path, m.size);
                let url = api::file_url(&env.endpoint, repo, &info.commit, &m.path);
                let t = download::Target {
                    repo,
                    revision,
                    file: &m.path,
                    url: &url,
                    etag: &m.etag,
                    size: m.size,
                };
                let r = download::download(&http, &t, &part, &|n| {
                    if n == 0 {
                        bar.set_position(0);
                    } else {
                        bar.inc(n);
                        total_bar.inc(n);
                    }
                });
                bar.finish_and_clear();
                let out = r?;
                net_bytes.fetch_add(out.downloaded, Ordering::Relaxed);
                resumed.fetch_add(out.resumed_from, Ordering::Relaxed);
                if let Some(d) = fin.parent() {
                    std::fs::create_dir_all(d).map_err(|e| FetchError::Io {
                        path: d.to_path_buf(),
                        source: e,
                    })?;
                }
                std::fs::rename(&part, &fin).map_err(|e| FetchError::Io {
                    path: fin.clone(),
                    source: e,
                })?;
                let how = match (out.restarted, out.resumed_from) {
                    (true, _) => " (server ignored Range: started over)".to_string(),
                    (false, 0) => String::new(),
                    (false, n) => format!(" (resumed at {})", commas(n)),
                };
                progress.line(&format!("  downloaded {}  {}{how}", m.path, human(m.size)));
                out.sha256
            };
            if let Dest::Cache(rc) = dest {
                rc.link(&info.commit, &m.path, &m.etag)?;
            }
            if done {
                progress.line(&format!("  cached     {}  {}", m.path, human(m.size)));
            }
            Ok((
                ManifestFile {
                    path: m.path.clone(),
                    size: m.size,
                    etag: m.etag.clone(),
                    sha256,
                },
                !done,
            ))
        },
    );
    total_bar.finish_and_clear();
    let mut files = vec![];
    let mut downloaded_files = 0;
    for r in results {
        match r {
            Ok((f, fresh)) => {
                downloaded_files += fresh as usize;
                files.push(f);
            }
            Err(e) => errs.push(e),
        }
    }
    if !errs.is_empty() {
        return Err(if errs.len() == 1 {
            errs.remove(0)
        } else {
            FetchError::Several(errs)
        });
    }
    if let Dest::Cache(rc) = dest {
        rc.write_ref(revision, &info.commit)?;
    }
    let manifest = Manifest {
        repo: repo.into(),
        revision: revision.into(),
        commit: info.commit.clone(),
        endpoint: env.endpoint.clone(),
        files,
    };
    let mp = manifest_path(dest, &info.commit);
    manifest.save(&mp).map_err(|e| FetchError::Io {
        path: mp.clone(),
        source: e,
    })?;
    let report = RepoReport {
        repo: repo.into(),
        revision: revision.into(),
        commit: info.commit.clone(),
        dir: dest_dir(dest, &info.commit),
        files: manifest.files.len(),
        downloaded_files,
        downloaded_bytes: net_bytes.into_inner(),
        resumed_bytes: resumed.into_inner(),
        total_bytes: manifest.files.iter().map(|f| f.size).sum(),
        offline: false,
    };
    Ok(report)
}

impl std::fmt::Display for RepoReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}@{} -> {} ({} files, {}; downloaded {} files, {} bytes{}{})",
            self.repo,
            self.revision,
            self.dir.display(),
            self.files,
            human(self.total_bytes),
            self.downloaded_files,
            commas(self.downloaded_bytes),
            if self.resumed_bytes > 0 {
                format!(
                    ", {} bytes reused from an interrupted download",
                    commas(self.resumed_bytes)
                )
            } else {
                String::new()
            },
            if self.offline { ", offline" } else { "" }
        )
    }
}

/// The folder of a fetched repo (for `verify`/`plan`), given the same destination rules as fetch.
pub fn fetched_dir(env: &HubEnv, source: &ModelSource) -> Result<PathBuf, HubError> {
    crate::hub::local_dir(env, source)
}
