//! Helpers shared by the stage tests: fixtures, free ports, external test servers.
#![allow(dead_code)]
use sha2::{Digest, Sha256};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures").join(name)
}

/// Copy the regular files of `src` into `dst` (flat).
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn git_sha1_hex(bytes: &[u8]) -> String {
    use sha1::Sha1;
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn wait_for_port(port: u16, timeout: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Find a server program; `None` (after printing why) when it is absent and `CI` is unset.
/// Under `CI` a missing program fails the test: CI installs them (scripts/ci-deps-stages.sh).
pub fn require_program(candidates: &[&str], what: &str) -> Option<PathBuf> {
    for c in candidates {
        let p = Path::new(c);
        if p.is_absolute() && p.exists() {
            return Some(p.to_path_buf());
        }
        if let Some(paths) = std::env::var_os("PATH") {
            for dir in std::env::split_paths(&paths) {
                let full = dir.join(c);
                if full.is_file() {
                    return Some(full);
                }
            }
        }
    }
    let msg = format!(
        "{what} not found (looked for {candidates:?}); install it with scripts/ci-deps-stages.sh"
    );
    if std::env::var_os("CI").is_some() {
        panic!("{msg} (CI is set, so this is a failure)");
    }
    eprintln!("SKIP: {msg}");
    None
}

/// Stops the child (by its own pid) when dropped: SIGTERM first, so nginx's master takes its
/// workers down with it, then SIGKILL if it has not exited within 5 s.
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// HEAD/GET without any client library: `(status, body)`.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// Files of a fixture model that a test repo serves.
pub const TINY_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
];

pub const TINY_FIXTURE: &str = "models/tied-sharded-gatingtrue";
