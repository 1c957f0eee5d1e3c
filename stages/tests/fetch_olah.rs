//! `fetch` against a real Hugging Face mirror: olah 0.5.4 in offline mode on 127.0.0.1, serving a
//! local git repo of a tiny fixture model (see shared notes/olah-offline-mirror.md).
mod common;

use common::{
    copy_dir, fixture, free_port, http_get, require_program, Server, TINY_FILES, TINY_FIXTURE,
};
use laguna_stages::fetch::progress::Progress;
use laguna_stages::fetch::{fetch_repo, Dest, FetchError, FetchOptions};
use laguna_stages::hub::{HubEnv, HubError, RepoCache};
use laguna_stages::verify::{verify_dirs, VerifyOptions};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const REPO: &str = "poolside/tiny-laguna";

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.email=t@example.com",
            "-c",
            "user.name=test",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

struct Mirror {
    _server: Server,
    _tmp: tempfile::TempDir,
    port: u16,
    commit: String,
}

fn start_olah() -> Option<Mirror> {
    let olah = require_program(&["olah-cli"], "olah (pip install olah==0.5.4)")?;
    require_program(&["git"], "git")?;
    let tmp = tempfile::tempdir().unwrap();
    let repo_dir = tmp.path().join("mirrors/models").join(REPO);
    std::fs::create_dir_all(&repo_dir).unwrap();
    let src = fixture(TINY_FIXTURE);
    for f in TINY_FILES {
        std::fs::copy(src.join(f), repo_dir.join(f)).unwrap();
    }
    git(&repo_dir, &["init", "-q"]);
    git(&repo_dir, &["add", "-A"]);
    git(&repo_dir, &["commit", "-qm", "tiny model"]);
    git(&repo_dir, &["branch", "-M", "main"]);
    let commit = git(&repo_dir, &["rev-parse", "HEAD"]);
    let port = free_port();
    let root = tmp.path().display().to_string();
    std::fs::create_dir_all(tmp.path().join("repos")).unwrap();
    let conf = format!(
        "[basic]\nhost = \"127.0.0.1\"\nport = {port}\nmirror-netloc = \"127.0.0.1:{port}\"\nmirror-lfs-netloc = \"127.0.0.1:{port}\"\nmirrors-path = [\"{root}/mirrors\"]\nrepos-path = \"{root}/repos\"\n[accessibility]\noffline = true\n"
    );
    std::fs::write(tmp.path().join("olah.toml"), conf).unwrap();
    let log = std::fs::File::create(tmp.path().join("olah.log")).unwrap();
    let child = Command::new(olah)
        .args(["-c", "olah.toml"])
        .current_dir(tmp.path())
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .expect("olah starts");
    let server = Server(child);
    let t0 = Instant::now();
    loop {
        if let Some((200, _)) = http_get(port, &format!("/api/models/{REPO}/revision/main")) {
            break;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            panic!(
                "olah did not come up: {}",
                std::fs::read_to_string(tmp.path().join("olah.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Some(Mirror {
        _server: server,
        _tmp: tmp,
        port,
        commit,
    })
}

fn env(port: u16, cache: &Path, offline: bool) -> HubEnv {
    HubEnv {
        endpoint: format!("http://127.0.0.1:{port}"),
        token: None,
        cache_dir: cache.to_path_buf(),
        offline,
    }
}

fn opts() -> FetchOptions {
    FetchOptions {
        local_dir: None,
        max_workers: 4,
        progress: false,
    }
}

fn fetch(
    e: &HubEnv,
    repo: &str,
    rev: &str,
) -> Result<laguna_stages::fetch::RepoReport, FetchError> {
    fetch_repo(
        e,
        repo,
        rev,
        &Dest::Cache(e.repo(repo)),
        &opts(),
        &Progress::new(false),
    )
}

#[test]
fn olah_mirror_fetch() {
    let Some(m) = start_olah() else { return };
    let cache = tempfile::tempdir().unwrap();
    let e = env(m.port, cache.path(), false);

    // Full fetch into the HF cache layout.
    let r = fetch(&e, REPO, "main").unwrap();
    println!("{r}");
    assert_eq!(r.commit, m.commit);
    assert_eq!(r.files, TINY_FILES.len());
    assert_eq!(r.downloaded_files, TINY_FILES.len());
    let rc = RepoCache::new(cache.path(), REPO);
    assert_eq!(
        std::fs::read_to_string(rc.ref_file("main")).unwrap().trim(),
        m.commit
    );
    let snap = rc.snapshot_dir(&m.commit);
    let src = fixture(TINY_FIXTURE);
    for f in TINY_FILES {
        let link = std::fs::read_link(snap.join(f)).unwrap();
        assert!(
            link.starts_with("../../blobs"),
            "{f} links to {}",
            link.display()
        );
        assert_eq!(
            std::fs::read(snap.join(f)).unwrap(),
            std::fs::read(src.join(f)).unwrap(),
            "{f}"
        );
        // git repo (not LFS): the blob is named by its git blob SHA-1.
        let bytes = std::fs::read(src.join(f)).unwrap();
        assert!(rc.blob(&common::git_sha1_hex(&bytes)).is_file(), "{f}");
    }
    assert!(rc.incomplete_blobs().is_empty());
    let v = verify_dirs(
        &snap,
        None,
        &VerifyOptions {
            fast: false,
            progress: false,
            workers: 2,
        },
    );
    println!("{v}");
    assert!(v.ok(), "{:?}", v.problems());

    // Python huggingface_hub reads the same cache (when it is installed; olah depends on it).
    python_reads_cache(cache.path(), &snap);

    // Re-fetch: nothing is downloaded, blobs untouched.
    let before: Vec<_> = std::fs::read_dir(rc.blobs_dir())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().modified().unwrap())
        .collect();
    let r2 = fetch(&e, REPO, "main").unwrap();
    assert_eq!((r2.downloaded_files, r2.downloaded_bytes), (0, 0), "{r2}");
    let after: Vec<_> = std::fs::read_dir(rc.blobs_dir())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().modified().unwrap())
        .collect();
    assert_eq!(before, after);
    // Pinned to the commit: complete without asking the server at all.
    let r3 = fetch(&env(1, cache.path(), false), REPO, &m.commit).unwrap();
    assert_eq!(r3.downloaded_bytes, 0);

    // Offline: served from the cache; a repo that is not there is a clear error.
    let r4 = fetch(&env(1, cache.path(), true), REPO, "main").unwrap();
    assert!(r4.offline);
    let empty = tempfile::tempdir().unwrap();
    let err = fetch(&env(m.port, empty.path(), true), REPO, "main").unwrap_err();
    assert!(
        matches!(err, FetchError::Hub(HubError::OfflineMissing { .. })),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("HF_HUB_OFFLINE") && msg.contains(REPO),
        "{msg}"
    );

    // Wrong revision and missing repo name what is wrong.
    let err = fetch(&e, REPO, "no-such-branch").unwrap_err();
    assert!(matches!(err, FetchError::RevisionNotFound { .. }), "{err}");
    assert!(
        err.to_string().contains("no-such-branch") && err.to_string().contains(REPO),
        "{err}"
    );
    let err = fetch(&e, "poolside/not-there", "main").unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("poolside/not-there") && msg.contains("HF_TOKEN"),
        "{msg}"
    );
    assert!(!cache
        .path()
        .join("models--poolside--not-there/snapshots")
        .exists());
}

#[test]
fn olah_mirror_local_dir() {
    let Some(m) = start_olah() else { return };
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let e = env(m.port, cache.path(), false);
    let dest = Dest::Local(out.path().join("tiny"));
    let r = fetch_repo(&e, REPO, "main", &dest, &opts(), &Progress::new(false)).unwrap();
    assert_eq!(r.downloaded_files, TINY_FILES.len());
    for f in TINY_FILES {
        assert!(out.path().join("tiny").join(f).is_file());
    }
    let r2 = fetch_repo(&e, REPO, "main", &dest, &opts(), &Progress::new(false)).unwrap();
    assert_eq!(r2.downloaded_bytes, 0);
    let v = verify_dirs(
        &out.path().join("tiny"),
        None,
        &VerifyOptions {
            fast: false,
            progress: false,
            workers: 2,
        },
    );
    assert!(v.ok(), "{:?}", v.problems());
    let _ = copy_dir;
}

/// `huggingface_hub` resolves our snapshot offline and its cache scan reports no problems.
fn python_reads_cache(cache: &Path, snap: &Path) {
    let has_hf = Command::new("python3")
        .args(["-c", "import huggingface_hub"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !has_hf {
        eprintln!("note: python huggingface_hub not installed; cache interop not checked");
        return;
    }
    let script = "import sys\n\
from huggingface_hub import snapshot_download, hf_hub_download, scan_cache_dir\n\
p = snapshot_download(sys.argv[1], revision='main', local_files_only=True)\n\
f = hf_hub_download(sys.argv[1], 'model.safetensors.index.json', revision='main', local_files_only=True)\n\
info = scan_cache_dir()\n\
print(p); print(f); print(len(info.warnings)); print(sum(r.size_on_disk for r in info.repos))\n";
    let out = Command::new("python3")
        .args(["-c", script, REPO])
        .env("HF_HUB_CACHE", cache)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(Path::new(lines[0]), snap, "{text}");
    assert_eq!(
        Path::new(lines[1]),
        snap.join("model.safetensors.index.json"),
        "{text}"
    );
    assert_eq!(lines[2], "0", "huggingface_hub cache scan warnings: {text}");
}
