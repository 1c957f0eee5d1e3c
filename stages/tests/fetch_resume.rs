//! Resumable downloads against nginx (olah ignores Range). The test starts nginx on free
//! 127.0.0.1 ports with its own prefix, serving the `/<org>/<repo>/resolve/<rev>/<file>` layout
//! and the revision API as static files, with Hub-style headers (X-Linked-Etag, X-Linked-Size,
//! X-Repo-Commit). Three servers: throttled (to kill a fetch mid-file), normal, and one that
//! ignores Range (`max_ranges 0`). Bytes sent are counted from nginx's access log.
mod common;

use common::{
    fixture, free_port, git_sha1_hex, require_program, sha256_hex, wait_for_port, Server,
    TINY_FILES, TINY_FIXTURE,
};
use laguna_stages::fetch::progress::Progress;
use laguna_stages::fetch::{fetch_repo, Dest, FetchError, FetchOptions};
use laguna_stages::hub::{HubEnv, RepoCache};
use laguna_stages::verify::{verify_dirs, VerifyOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const REPO: &str = "org/tiny";
const COMMIT: &str = "89abcdef0123456789abcdef0123456789abcdef";

struct Nginx {
    _server: Server,
    tmp: tempfile::TempDir,
    slow: u16,
    fast: u16,
    norange: u16,
}

impl Nginx {
    /// (port, method, uri, status, body_bytes_sent, range) per access-log line.
    fn log(&self) -> Vec<(u16, String, String, u16, u64, String)> {
        std::fs::read_to_string(self.tmp.path().join("access.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let p: Vec<&str> = l.splitn(6, ' ').collect();
                Some((
                    p[0].parse().ok()?,
                    p[1].into(),
                    p[2].into(),
                    p[3].parse().ok()?,
                    p[4].parse().ok()?,
                    p.get(5).unwrap_or(&"").trim_matches('"').into(),
                ))
            })
            .collect()
    }
}

fn start_nginx() -> Option<Nginx> {
    let bin = require_program(
        &["nginx", "/usr/sbin/nginx"],
        "nginx (apt-get install nginx-light)",
    )?;
    let tmp = tempfile::tempdir().unwrap();
    let www = tmp.path().join("www");
    let src = fixture(TINY_FIXTURE);
    let mut locations = String::new();
    let mut siblings = vec![];
    for f in TINY_FILES {
        let bytes = std::fs::read(src.join(f)).unwrap();
        let dst = www.join(REPO).join("resolve").join(COMMIT).join(f);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::write(&dst, &bytes).unwrap();
        // Like the Hub: LFS files carry X-Linked-Etag (sha256) + X-Linked-Size, git files an ETag (git sha1).
        let headers = if f.ends_with(".safetensors") {
            format!(
                "add_header X-Linked-Etag '\"{}\"'; add_header X-Linked-Size {};",
                sha256_hex(&bytes),
                bytes.len()
            )
        } else {
            format!("etag off; add_header ETag '\"{}\"';", git_sha1_hex(&bytes))
        };
        locations += &format!("location = /{REPO}/resolve/{COMMIT}/{f} {{ {headers} add_header X-Repo-Commit {COMMIT}; }}\n");
        siblings.push(serde_json::json!({ "rfilename": f }));
    }
    let api = www.join("api/models").join(REPO).join("revision");
    std::fs::create_dir_all(&api).unwrap();
    let info = serde_json::json!({ "id": REPO, "sha": COMMIT, "siblings": siblings }).to_string();
    std::fs::write(api.join("main"), &info).unwrap();
    std::fs::write(api.join(COMMIT), &info).unwrap();
    locations += "location /api/ { default_type application/json; }\n";
    locations += "location = /api/models/org/private/revision/main { return 401; }\n";
    let (slow, fast, norange) = (free_port(), free_port(), free_port());
    let t = tmp.path().display();
    let server = |port: u16, extra: &str| {
        format!(
            "server {{ listen 127.0.0.1:{port}; root {}; {extra}\n{locations} }}\n",
            www.display()
        )
    };
    let conf = format!(
        "daemon off;\nuser root;\nworker_processes 1;\npid {t}/nginx.pid;\nerror_log {t}/error.log;\nevents {{ worker_connections 64; }}\nhttp {{\n\
         log_format bytes '$server_port $request_method $uri $status $body_bytes_sent \"$http_range\"';\n\
         access_log {t}/access.log bytes;\ndefault_type application/octet-stream;\n\
         client_body_temp_path {t}/cb; proxy_temp_path {t}/px; fastcgi_temp_path {t}/fc; uwsgi_temp_path {t}/uw; scgi_temp_path {t}/sc;\n\
         {}{}{}}}\n",
        server(slow, "limit_rate 40k;"),
        server(fast, ""),
        server(norange, "max_ranges 0;")
    );
    std::fs::write(tmp.path().join("nginx.conf"), conf).unwrap();
    std::fs::create_dir_all(tmp.path().join("logs")).unwrap();
    let child = Command::new(bin)
        .args([
            "-e",
            &tmp.path().join("error.log").display().to_string(),
            "-p",
            &tmp.path().display().to_string(),
            "-c",
            &tmp.path().join("nginx.conf").display().to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nginx starts");
    let server = Server(child);
    for p in [slow, fast, norange] {
        assert!(
            wait_for_port(p, Duration::from_secs(20)),
            "nginx did not listen on {p}: {}",
            std::fs::read_to_string(tmp.path().join("error.log")).unwrap_or_default()
        );
    }
    Some(Nginx {
        _server: server,
        tmp,
        slow,
        fast,
        norange,
    })
}

fn env(port: u16, cache: &Path) -> HubEnv {
    HubEnv {
        endpoint: format!("http://127.0.0.1:{port}"),
        token: None,
        cache_dir: cache.to_path_buf(),
        offline: false,
    }
}

fn fetch(e: &HubEnv) -> Result<laguna_stages::fetch::RepoReport, FetchError> {
    fetch_repo(
        e,
        REPO,
        "main",
        &Dest::Cache(e.repo(REPO)),
        &FetchOptions {
            local_dir: None,
            max_workers: 4,
            progress: false,
        },
        &Progress::new(false),
    )
}

fn shard_sha(f: &str) -> String {
    sha256_hex(&std::fs::read(fixture(TINY_FIXTURE).join(f)).unwrap())
}

/// Runs only as the child of `killed_fetch_resumes_without_refetching_bytes`.
#[test]
fn child_fetch_for_kill_test() {
    let (Ok(endpoint), Ok(cache)) = (
        std::env::var("LAGUNA_TEST_CHILD_ENDPOINT"),
        std::env::var("LAGUNA_TEST_CHILD_CACHE"),
    ) else {
        return;
    };
    let e = HubEnv {
        endpoint,
        token: None,
        cache_dir: PathBuf::from(cache),
        offline: false,
    };
    let _ = fetch(&e);
}

#[test]
fn killed_fetch_resumes_without_refetching_bytes() {
    let Some(ng) = start_nginx() else { return };
    let cache = tempfile::tempdir().unwrap();
    let rc = RepoCache::new(cache.path(), REPO);
    // 1. A fetch against the throttled server, killed once some shard bytes are on disk.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_fetch_for_kill_test",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(
            "LAGUNA_TEST_CHILD_ENDPOINT",
            format!("http://127.0.0.1:{}", ng.slow),
        )
        .env("LAGUNA_TEST_CHILD_CACHE", cache.path())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let partial_len = |f: &str| {
        std::fs::metadata(rc.incomplete(&shard_sha(f)))
            .map(|m| m.len())
            .unwrap_or(0)
    };
    loop {
        if partial_len(TINY_FILES[2]) >= 100_000 && partial_len(TINY_FILES[3]) >= 100_000 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the throttled fetch did not progress"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child fetch ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // No partial file under a final name.
    let mut partial = std::collections::HashMap::new();
    for f in &TINY_FILES[2..4] {
        let sha = shard_sha(f);
        assert!(
            !rc.blob(&sha).exists(),
            "{f}: a partial download sits under its final blob name"
        );
        assert!(!rc.snapshot_dir(COMMIT).join(f).exists());
        let len = partial_len(f);
        let size = std::fs::metadata(fixture(TINY_FIXTURE).join(f))
            .unwrap()
            .len();
        assert!(len > 0 && len < size, "{f}: {len} of {size}");
        partial.insert(format!("/{REPO}/resolve/{COMMIT}/{f}"), (len, size));
    }

    // 2. Resume against the normal server: only the missing bytes come over the wire.
    let r = fetch(&env(ng.fast, cache.path())).unwrap();
    println!("{r}");
    let resumed: u64 = partial.values().map(|(l, _)| l).sum();
    assert_eq!(r.resumed_bytes, resumed);
    std::thread::sleep(Duration::from_millis(300)); // nginx writes the log line after the response
    let gets: Vec<_> = ng
        .log()
        .into_iter()
        .filter(|l| l.0 == ng.fast && l.1 == "GET" && partial.contains_key(&l.2))
        .collect();
    assert_eq!(gets.len(), 2, "{gets:?}");
    for (_, _, uri, status, sent, range) in &gets {
        let (len, size) = partial[uri];
        assert_eq!(*status, 206, "{uri}");
        assert_eq!(range, &format!("bytes={len}-"), "{uri}");
        assert_eq!(
            *sent,
            size - len,
            "{uri}: the server sent {sent} bytes; {len} were already on disk"
        );
    }
    assert!(rc.incomplete_blobs().is_empty());
    let v = verify_dirs(
        &rc.snapshot_dir(COMMIT),
        None,
        &VerifyOptions {
            fast: false,
            progress: false,
            workers: 2,
        },
    );
    assert!(v.ok(), "{:?}", v.problems());
}

#[test]
fn range_answered_with_200_starts_over() {
    let Some(ng) = start_nginx() else { return };
    let cache = tempfile::tempdir().unwrap();
    let rc = RepoCache::new(cache.path(), REPO);
    let f = TINY_FILES[2];
    let bytes = std::fs::read(fixture(TINY_FIXTURE).join(f)).unwrap();
    std::fs::create_dir_all(rc.blobs_dir()).unwrap();
    // A stale partial with wrong bytes: appending to it would corrupt the file.
    let mut stale = bytes[..50_000].to_vec();
    stale[10] ^= 0xff;
    std::fs::write(rc.incomplete(&shard_sha(f)), &stale).unwrap();
    let r = fetch(&env(ng.norange, cache.path())).unwrap();
    assert_eq!(r.resumed_bytes, 0);
    assert_eq!(
        std::fs::read(rc.snapshot_dir(COMMIT).join(f)).unwrap(),
        bytes
    );
    std::thread::sleep(Duration::from_millis(300));
    let uri = format!("/{REPO}/resolve/{COMMIT}/{f}");
    let get = ng
        .log()
        .into_iter()
        .find(|l| l.0 == ng.norange && l.1 == "GET" && l.2 == uri)
        .unwrap();
    assert_eq!(
        (get.3, get.4, get.5.as_str()),
        (200, bytes.len() as u64, "bytes=50000-")
    );
}

#[test]
fn unauthorized_and_missing_files_say_what_to_do() {
    let Some(ng) = start_nginx() else { return };
    let cache = tempfile::tempdir().unwrap();
    let e = env(ng.fast, cache.path());
    let err = fetch_repo(
        &e,
        "org/private",
        "main",
        &Dest::Cache(e.repo("org/private")),
        &FetchOptions {
            local_dir: None,
            max_workers: 2,
            progress: false,
        },
        &Progress::new(false),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("401") && err.contains("HF_TOKEN") && err.contains("org/private"),
        "{err}"
    );
    // A repo the server does not know: 404 names it.
    let err = fetch_repo(
        &e,
        "org/none",
        "main",
        &Dest::Cache(e.repo("org/none")),
        &FetchOptions {
            local_dir: None,
            max_workers: 2,
            progress: false,
        },
        &Progress::new(false),
    )
    .unwrap_err();
    assert!(matches!(err, FetchError::RepoNotFound { .. }), "{err}");
    assert!(err.to_string().contains("org/none"), "{err}");
    // A file the listing names but the server does not have: 404 names the file.
    let gone = ng
        .tmp
        .path()
        .join("www")
        .join(REPO)
        .join("resolve")
        .join(COMMIT)
        .join("generation_config.json");
    std::fs::remove_file(gone).unwrap();
    let err = fetch(&e).unwrap_err().to_string();
    assert!(
        err.contains("generation_config.json") && err.contains(REPO),
        "{err}"
    );
}

/// A mirror that accepts connections and never answers: fetch fails within seconds (the response
/// timeout), naming the endpoint, instead of hanging for a minute.
#[test]
fn silent_mirror_fails_fast_naming_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accept and hold every connection without writing a byte.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in listener.incoming().flatten() {
            held.push(c);
        }
    });
    let tmp = tempfile::tempdir().unwrap();
    let t0 = std::time::Instant::now();
    let err = fetch(&env(port, tmp.path())).expect_err("a silent mirror cannot succeed");
    let took = t0.elapsed();
    let msg = err.to_string();
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
    assert!(took < Duration::from_secs(30), "took {took:?}: {msg}");
}
