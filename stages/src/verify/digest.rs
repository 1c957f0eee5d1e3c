//! Content hashes the Hub names blobs by: SHA-256 for LFS files, git blob SHA-1
//! (`sha1("blob <len>\0" + bytes)`) for files stored in git.
use sha1::Sha1;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What a blob name / etag promises about the content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtagKind {
    Sha256,
    GitSha1,
    /// Anything else (e.g. a plain web server's etag): not a content hash.
    Opaque,
}

pub fn etag_kind(etag: &str) -> EtagKind {
    if is_hex(etag, 64) {
        EtagKind::Sha256
    } else if is_hex(etag, 40) {
        EtagKind::GitSha1
    } else {
        EtagKind::Opaque
    }
}

/// SHA-256 and, when the total length is known up front, the git blob SHA-1, in one pass.
pub struct Hasher {
    sha256: Sha256,
    git: Option<Sha1>,
}

impl Hasher {
    pub fn new(git_len: Option<u64>) -> Hasher {
        let git = git_len.map(|n| {
            let mut h = Sha1::new();
            h.update(format!("blob {n}\0").as_bytes());
            h
        });
        Hasher {
            sha256: Sha256::new(),
            git,
        }
    }
    pub fn update(&mut self, b: &[u8]) {
        self.sha256.update(b);
        if let Some(g) = &mut self.git {
            g.update(b);
        }
    }
    /// (sha256 hex, git sha1 hex if asked for)
    pub fn finish(self) -> (String, Option<String>) {
        (
            hex(&self.sha256.finalize()),
            self.git.map(|g| hex(&g.finalize())),
        )
    }
    /// Whether the digests match `etag` (always true for opaque etags).
    pub fn matches(sha256: &str, git: Option<&str>, etag: &str) -> bool {
        match etag_kind(etag) {
            EtagKind::Sha256 => sha256.eq_ignore_ascii_case(etag),
            EtagKind::GitSha1 => git.is_some_and(|g| g.eq_ignore_ascii_case(etag)),
            EtagKind::Opaque => true,
        }
    }
}

pub const CHUNK: usize = 8 << 20;

/// Stream `reader` into `h`, calling `progress(n)` after each chunk.
pub fn hash_reader(
    mut reader: impl Read,
    h: &mut Hasher,
    progress: &dyn Fn(u64),
) -> std::io::Result<u64> {
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        total += n as u64;
        progress(n as u64);
    }
}

/// (sha256, git sha1) of a file.
pub fn hash_file(path: &Path, progress: &dyn Fn(u64)) -> std::io::Result<(String, String)> {
    let len = std::fs::metadata(path)?.len();
    let mut h = Hasher::new(Some(len));
    hash_reader(std::fs::File::open(path)?, &mut h, progress)?;
    let (s, g) = h.finish();
    Ok((s, g.expect("git hash requested")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digests() {
        // `printf hello | sha256sum`; `printf hello | git hash-object --stdin`.
        let mut h = Hasher::new(Some(5));
        h.update(b"hel");
        h.update(b"lo");
        let (s, g) = h.finish();
        assert_eq!(
            s,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(g.unwrap(), "b6fc4c620b67d95f953a5c1c1230aaab5db5a1b0");
        assert_eq!(etag_kind(&s), EtagKind::Sha256);
        assert_eq!(
            etag_kind("b6fc4c620b67d95f953a5c1c1230aaab5db5a1b0"),
            EtagKind::GitSha1
        );
        assert_eq!(etag_kind("5f1c-1a2b"), EtagKind::Opaque);
    }
}
