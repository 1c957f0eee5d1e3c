//! The two Hub calls a snapshot download needs: resolve a revision to a commit with its file list
//! (`/api/models/<repo>/revision/<rev>`), and one file's etag and size (`HEAD /<repo>/resolve/<commit>/<file>`).
use super::http::{header, Http, Response};
use super::FetchError;

#[derive(Debug, Clone)]
pub struct RepoInfo {
    pub commit: String,
    pub files: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct FileMeta {
    pub path: String,
    /// Blob name: 64-hex SHA-256 for LFS files, 40-hex git blob SHA-1 for the rest.
    pub etag: String,
    pub size: u64,
}

/// Percent-encode one path segment (keeps `/` when `keep_slash`).
pub fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `"abc"`, `W/"abc"` → `abc`.
pub fn normalize_etag(s: &str) -> String {
    s.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

fn error_code(r: &Response) -> Option<String> {
    header(r, "x-error-code").map(str::to_string)
}

fn unauthorized(repo: &str, url: &str, status: u16) -> FetchError {
    FetchError::Unauthorized {
        repo: repo.to_string(),
        url: url.to_string(),
        status,
    }
}

pub fn resolve_revision(http: &Http, repo: &str, revision: &str) -> Result<RepoInfo, FetchError> {
    let url = format!(
        "{}/api/models/{repo}/revision/{}",
        http.endpoint(),
        encode(revision, false)
    );
    let (status, v, r) = http.get_json(&url)?;
    match status {
        200..=299 => {
            let commit = v
                .get("sha")
                .and_then(|s| s.as_str())
                .ok_or_else(|| FetchError::Http {
                    url: url.clone(),
                    status,
                    msg: "the answer has no `sha`; is HF_ENDPOINT a Hugging Face Hub?".into(),
                })?;
            let files = v
                .get("siblings")
                .and_then(|s| s.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|f| {
                            f.get("rfilename")
                                .and_then(|n| n.as_str())
                                .map(str::to_string)
                        })
                        .collect()
                })
                .unwrap_or_default();
            Ok(RepoInfo {
                commit: commit.to_string(),
                files,
            })
        }
        _ if error_code(&r).as_deref() == Some("RevisionNotFound") => {
            Err(FetchError::RevisionNotFound {
                repo: repo.into(),
                revision: revision.into(),
            })
        }
        401 | 403 | 404 => {
            let code = error_code(&r);
            // Mirrors (olah) answer a bad revision with RepoNotFound: the revision is the problem
            // whenever `main` resolves.
            if revision != "main" {
                let probe = format!("{}/api/models/{repo}/revision/main", http.endpoint());
                if let Ok((200..=299, _, _)) = http.get_json(&probe) {
                    return Err(FetchError::RevisionNotFound {
                        repo: repo.into(),
                        revision: revision.into(),
                    });
                }
            }
            if status == 404 || (code.as_deref() == Some("RepoNotFound") && http.has_token()) {
                Err(FetchError::RepoNotFound {
                    repo: repo.into(),
                    endpoint: http.endpoint().into(),
                })
            } else {
                Err(unauthorized(repo, &url, status))
            }
        }
        _ => Err(FetchError::Http {
            url,
            status,
            msg: "unexpected answer while resolving the revision".into(),
        }),
    }
}

pub fn file_url(endpoint: &str, repo: &str, commit: &str, file: &str) -> String {
    format!(
        "{endpoint}/{repo}/resolve/{}/{}",
        encode(commit, false),
        encode(file, true)
    )
}

pub fn file_meta(
    http: &Http,
    repo: &str,
    revision: &str,
    commit: &str,
    file: &str,
) -> Result<FileMeta, FetchError> {
    let url = file_url(http.endpoint(), repo, commit, file);
    let (url, r) = http.head(&url)?;
    let status = r.status().as_u16();
    match status {
        200..=399 => {
            let etag = header(&r, "x-linked-etag")
                .or_else(|| header(&r, "etag"))
                .map(normalize_etag)
                .ok_or_else(|| FetchError::Http {
                    url: url.clone(),
                    status,
                    msg: "no ETag header; HF_ENDPOINT must point at a Hugging Face Hub or a mirror"
                        .into(),
                })?;
            let size = header(&r, "x-linked-size")
                .or_else(|| header(&r, "content-length"))
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| FetchError::Http {
                    url: url.clone(),
                    status,
                    msg: "no Content-Length/X-Linked-Size header".into(),
                })?;
            if etag.is_empty() || etag.contains('/') || etag.contains("..") {
                return Err(FetchError::Http {
                    url,
                    status,
                    msg: format!("unusable ETag `{etag}`"),
                });
            }
            Ok(FileMeta {
                path: file.to_string(),
                etag,
                size,
            })
        }
        401 | 403 => Err(unauthorized(repo, &url, status)),
        404 => Err(FetchError::FileNotFound {
            repo: repo.into(),
            revision: revision.into(),
            file: file.into(),
        }),
        _ => Err(FetchError::Http {
            url,
            status,
            msg: "unexpected answer to HEAD".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_and_encoding() {
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert_eq!(normalize_etag("\"abc\""), "abc");
        assert_eq!(encode("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(encode("a b/c.json", true), "a%20b/c.json");
    }
}
