//! Blocking HTTP for the Hub protocol (ureq + rustls): no automatic redirects (we follow them
//! ourselves, dropping the token when the host changes), statuses returned, not raised.
use super::FetchError;
use std::time::Duration;

pub type Response = ureq::http::Response<ureq::Body>;

pub struct Http {
    agent: ureq::Agent,
    endpoint: String,
    token: Option<String>,
}

fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

/// `Location` against the URL that sent it.
fn join_location(base: &str, loc: &str) -> String {
    if loc.contains("://") {
        return loc.to_string();
    }
    let (scheme, rest) = base.split_once("://").unwrap_or(("http", base));
    let host = rest.split('/').next().unwrap_or(rest);
    if loc.starts_with('/') {
        format!("{scheme}://{host}{loc}")
    } else {
        let dir = base.rsplit_once('/').map_or(base, |(d, _)| d);
        format!("{dir}/{loc}")
    }
}

pub fn header<'a>(r: &'a Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).and_then(|v| v.to_str().ok())
}

impl Http {
    pub fn new(endpoint: &str, token: Option<String>) -> Http {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            // A mirror that accepts connections and never answers fails in seconds, not
            // minutes; a download that stalls mid-file fails after 30 s and resumes next run.
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_recv_response(Some(Duration::from_secs(10)))
            .timeout_per_read(Some(Duration::from_secs(30)))
            .user_agent(concat!(
                "laguna/",
                env!("CARGO_PKG_VERSION"),
                "; hf_hub/rust"
            ))
            .build()
            .into();
        Http {
            agent,
            endpoint: endpoint.to_string(),
            token,
        }
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn network(&self, url: &str, e: ureq::Error) -> FetchError {
        FetchError::Network {
            url: url.to_string(),
            endpoint: self.endpoint.clone(),
            msg: e.to_string(),
        }
    }

    /// Whether the token may be sent to `url` (only to the endpoint's own host).
    fn auth_for(&self, url: &str) -> Option<String> {
        let tok = self.token.as_ref()?;
        (host_of(url) == host_of(&self.endpoint)).then(|| format!("Bearer {tok}"))
    }

    /// One request, redirects not followed.
    fn send(
        &self,
        method: &str,
        url: &str,
        range_from: Option<u64>,
    ) -> Result<Response, FetchError> {
        let mut req = match method {
            "HEAD" => self.agent.head(url),
            _ => self.agent.get(url),
        };
        if let Some(a) = self.auth_for(url) {
            req = req.header("Authorization", a);
        }
        if let Some(start) = range_from {
            req = req.header("Range", format!("bytes={start}-"));
        }
        req.call().map_err(|e| self.network(url, e))
    }

    /// HEAD without following redirects, except relative ones (a renamed repo on the same host),
    /// because the Hub puts the metadata of LFS files on the redirect itself.
    pub fn head(&self, url: &str) -> Result<(String, Response), FetchError> {
        let mut url = url.to_string();
        for _ in 0..5 {
            let r = self.send("HEAD", &url, None)?;
            let relative = header(&r, "location").is_some_and(|l| l.starts_with('/'));
            if r.status().is_redirection() && relative {
                url = join_location(&url, header(&r, "location").unwrap_or_default());
                continue;
            }
            return Ok((url, r));
        }
        Err(FetchError::Http {
            url,
            status: 310,
            msg: "too many redirects".into(),
        })
    }

    /// GET, following redirects (token kept only on the endpoint's host), with `Range: bytes=N-`.
    pub fn get(
        &self,
        url: &str,
        range_from: Option<u64>,
    ) -> Result<(String, Response), FetchError> {
        let mut url = url.to_string();
        for _ in 0..10 {
            let r = self.send("GET", &url, range_from)?;
            if r.status().is_redirection() {
                if let Some(loc) = header(&r, "location") {
                    url = join_location(&url, loc);
                    continue;
                }
            }
            return Ok((url, r));
        }
        Err(FetchError::Http {
            url,
            status: 310,
            msg: "too many redirects".into(),
        })
    }

    /// GET a small JSON document.
    pub fn get_json(&self, url: &str) -> Result<(u16, serde_json::Value, Response), FetchError> {
        let (url, mut r) = self.get(url, None)?;
        let status = r.status().as_u16();
        let text = r
            .body_mut()
            .read_to_string()
            .map_err(|e| self.network(&url, e))?;
        let v = if (200..300).contains(&status) {
            serde_json::from_str(&text).map_err(|e| FetchError::Http {
                url: url.clone(),
                status,
                msg: format!("answer is not JSON ({e}); is HF_ENDPOINT a Hugging Face Hub?"),
            })?
        } else {
            serde_json::Value::Null
        };
        Ok((status, v, r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations() {
        assert_eq!(join_location("http://a:1/x/y", "/z"), "http://a:1/z");
        assert_eq!(
            join_location("http://a:1/x/y", "https://cdn/z"),
            "https://cdn/z"
        );
        assert_eq!(join_location("http://a:1/x/y", "z"), "http://a:1/x/z");
        assert_eq!(host_of("https://huggingface.co/api/x"), "huggingface.co");
    }
}
