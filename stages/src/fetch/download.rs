//! One file into its `.incomplete` path, resuming with `Range: bytes=N-` from whatever is already
//! there; a server that answers the Range with 200 makes us start over. The content is hashed on
//! the way and checked against the etag before the caller renames it into place.
use super::http::{header, Http};
use super::FetchError;
use crate::verify::digest::{etag_kind, hash_reader, EtagKind, Hasher, CHUNK};
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::Path;

pub struct Outcome {
    pub sha256: String,
    /// Bytes that came over the network in this run.
    pub downloaded: u64,
    /// Bytes reused from an earlier, interrupted run.
    pub resumed_from: u64,
    /// The server ignored Range and sent the whole file again.
    pub restarted: bool,
}

fn io(path: &Path, e: std::io::Error) -> FetchError {
    FetchError::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

/// `bytes 100-199/200` → 100.
fn content_range_start(v: &str) -> Option<u64> {
    v.trim()
        .strip_prefix("bytes")?
        .trim()
        .split('-')
        .next()?
        .trim()
        .parse()
        .ok()
}

pub struct Target<'a> {
    pub repo: &'a str,
    pub revision: &'a str,
    pub file: &'a str,
    pub url: &'a str,
    pub etag: &'a str,
    pub size: u64,
}

/// Download `t` into `part`. `on_bytes` is called for every chunk written (progress).
pub fn download(
    http: &Http,
    t: &Target,
    part: &Path,
    on_bytes: &dyn Fn(u64),
) -> Result<Outcome, FetchError> {
    if let Some(d) = part.parent() {
        std::fs::create_dir_all(d).map_err(|e| io(d, e))?;
    }
    let mut have = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
    if have > t.size {
        std::fs::remove_file(part).map_err(|e| io(part, e))?;
        have = 0;
    }
    let git_len = (etag_kind(t.etag) == EtagKind::GitSha1).then_some(t.size);
    let mut restarted = false;
    let resumed_from = have;
    let mut hasher = Hasher::new(git_len);
    let mut downloaded = 0u64;

    if have < t.size || t.size == 0 {
        let (url, mut resp) = http.get(t.url, (have > 0).then_some(have))?;
        let status = resp.status().as_u16();
        let append = match status {
            206 => {
                let start = header(&resp, "content-range").and_then(content_range_start);
                if start != Some(have) {
                    // Not the range we asked for: drop the partial and start clean.
                    drop(resp);
                    std::fs::remove_file(part).map_err(|e| io(part, e))?;
                    return download(http, t, part, on_bytes);
                }
                true
            }
            200 => false,
            416 if have > 0 => {
                // Our partial file does not fit the server's; start over.
                std::fs::remove_file(part).map_err(|e| io(part, e))?;
                return download(http, t, part, on_bytes);
            }
            401 | 403 => {
                return Err(FetchError::Unauthorized {
                    repo: t.repo.into(),
                    url,
                    status,
                })
            }
            404 => {
                return Err(FetchError::FileNotFound {
                    repo: t.repo.into(),
                    revision: t.revision.into(),
                    file: t.file.into(),
                })
            }
            _ => {
                return Err(FetchError::Http {
                    url,
                    status,
                    msg: format!("while downloading {}", t.file),
                })
            }
        };
        if !append && have > 0 {
            restarted = true;
            on_bytes(0);
        }
        let mut f = if append {
            // Hash what is already on disk, then append.
            let existing = std::fs::File::open(part).map_err(|e| io(part, e))?;
            hash_reader(existing.take(have), &mut hasher, &|_| {}).map_err(|e| io(part, e))?;
            OpenOptions::new()
                .append(true)
                .open(part)
                .map_err(|e| io(part, e))?
        } else {
            have = 0;
            std::fs::File::create(part).map_err(|e| io(part, e))?
        };
        if append && have > 0 {
            on_bytes(have);
        }
        let mut reader = resp.body_mut().as_reader();
        let mut buf = vec![0u8; CHUNK.min(1 << 20)];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = f.flush();
                    return Err(FetchError::Interrupted {
                        file: t.file.into(),
                        have: have + downloaded,
                        size: t.size,
                        msg: e.to_string(),
                    });
                }
            };
            if have + downloaded + n as u64 > t.size {
                drop(f);
                let _ = std::fs::remove_file(part);
                return Err(FetchError::SizeMismatch {
                    file: t.file.into(),
                    expected: t.size,
                    got: have + downloaded + n as u64,
                });
            }
            f.write_all(&buf[..n]).map_err(|e| io(part, e))?;
            hasher.update(&buf[..n]);
            downloaded += n as u64;
            on_bytes(n as u64);
        }
        f.sync_all().map_err(|e| io(part, e))?;
        if have + downloaded != t.size {
            return Err(FetchError::Interrupted {
                file: t.file.into(),
                have: have + downloaded,
                size: t.size,
                msg: "the connection closed early".into(),
            });
        }
    } else {
        // A complete partial from an earlier run that died before the rename.
        let f = std::fs::File::open(part).map_err(|e| io(part, e))?;
        hash_reader(f, &mut hasher, &|_| {}).map_err(|e| io(part, e))?;
        on_bytes(have);
    }
    let (sha256, git) = hasher.finish();
    if !Hasher::matches(&sha256, git.as_deref(), t.etag) {
        let _ = std::fs::remove_file(part);
        return Err(FetchError::Integrity {
            file: t.file.into(),
            etag: t.etag.into(),
            got: match etag_kind(t.etag) {
                EtagKind::GitSha1 => format!("git sha1 {}", git.unwrap_or_default()),
                _ => format!("sha256 {sha256}"),
            },
        });
    }
    Ok(Outcome {
        sha256,
        downloaded,
        resumed_from: if restarted { 0 } else { resumed_from },
        restarted,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn content_range() {
        assert_eq!(super::content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(super::content_range_start("bytes */200"), None);
    }
}
