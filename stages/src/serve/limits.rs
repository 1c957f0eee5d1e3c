//! Request hygiene shared by every POST route: the body limit (a 413 before or while the body is
//! read, chunked bodies included), the small blocking pool where a request is prepared (JSON,
//! validation, chat template, tokenizer, submit) so a huge prompt never stalls the async workers,
//! and returning a large request's memory to the OS afterwards (docs/design/serving.md).
use super::errors::ApiError;
use super::state::AppState;
use futures_util::{Stream, StreamExt};
use std::sync::Arc;
use tokio::sync::Semaphore;
use warp::http::StatusCode;
use warp::hyper::body::Bytes;
use warp::{Buf, Filter, Rejection};

/// `--max-request-bytes` when neither the flag nor the recipe sets it.
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 32 << 20;
/// Prompts one `/v1/completions` request may hold (a list of texts or of token lists).
pub const MAX_PROMPTS: usize = 128;
/// After a request whose body was at least this large, freed heap is handed back to the OS.
const TRIM_AFTER_BYTES: usize = 1 << 20;

/// What the handlers share to bound the work one request can cause.
pub struct Limits {
    pub max_request_bytes: u64,
    /// `Tokenizer::max_token_bytes`: the early length check's bound (None: no early check).
    pub max_token_bytes: Option<usize>,
    /// Requests being prepared at once (one per core; more would only queue for the CPU).
    prep: Arc<Semaphore>,
}

impl Limits {
    pub fn new(max_request_bytes: u64, max_token_bytes: Option<usize>) -> Limits {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Limits {
            max_request_bytes,
            max_token_bytes,
            prep: Arc::new(Semaphore::new(cores)),
        }
    }
}

pub fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "BadRequestError",
        format!(
            "The request body is larger than this server's limit of {limit} bytes (--max-request-bytes)."
        ),
    )
}

/// The request body, refused with a 413 when its Content-Length is over `limit` (before reading)
/// or when the bytes read pass `limit` (a chunked body has no Content-Length, so it is streamed
/// and reading stops at the limit). `reject` gives the route's error shape.
pub fn body(
    limit: u64,
    reject: fn(ApiError) -> Rejection,
) -> impl Filter<Extract = (Bytes,), Error = Rejection> + Clone {
    warp::header::optional::<u64>("content-length")
        .and(warp::body::stream())
        .and_then(move |len: Option<u64>, s| async move {
            if len.is_some_and(|n| n > limit) {
                return Err(reject(too_large(limit)));
            }
            read_limited(s, len.unwrap_or(0), limit)
                .await
                .map_err(reject)
        })
}

async fn read_limited<S, B>(s: S, expected: u64, limit: u64) -> Result<Bytes, ApiError>
where
    S: Stream<Item = Result<B, warp::Error>>,
    B: Buf,
{
    let mut s = std::pin::pin!(s);
    let mut out = Vec::with_capacity(expected.min(limit) as usize);
    while let Some(chunk) = s.next().await {
        let mut chunk = chunk
            .map_err(|e| ApiError::bad_request(format!("could not read the request body: {e}")))?;
        if (out.len() + chunk.remaining()) as u64 > limit {
            return Err(too_large(limit));
        }
        while chunk.has_remaining() {
            let c = chunk.chunk();
            out.extend_from_slice(c);
            let n = c.len();
            chunk.advance(n);
        }
    }
    Ok(Bytes::from(out))
}

/// Run `f` (a request's preparation: parse, validate, render, tokenize, submit) on tokio's
/// blocking pool, at most one per core at once, then return the freed memory of a large body.
pub async fn prepare<T, F>(state: &Arc<AppState>, body: Bytes, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&AppState, &[u8]) -> Result<T, ApiError> + Send + 'static,
{
    let permit = state
        .limits
        .prep
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::unavailable("The server is shutting down."))?;
    let state = state.clone();
    tokio::task::spawn_blocking(move || {
        let large = body.len() >= TRIM_AFTER_BYTES;
        let out = f(&state, &body);
        drop(body);
        drop(permit);
        if large {
            release_memory();
        }
        out
    })
    .await
    .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))?
}

/// Hand freed heap back to the OS. glibc keeps what a large request freed (its arenas and the
/// top of the heap) for reuse, so without this a 10 MB prompt leaves the process 1-2 GB larger;
/// `malloc_trim(0)` releases the free pages of every arena. Other allocators return memory on
/// their own terms; this is then a no-op.
pub fn release_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes their locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;

    fn chunks(sizes: &[usize]) -> impl Stream<Item = Result<Bytes, warp::Error>> {
        let v: Vec<_> = sizes
            .iter()
            .map(|&n| Ok(Bytes::from(vec![b'x'; n])))
            .collect();
        stream::iter(v)
    }

    #[tokio::test]
    async fn read_limited_stops_at_the_limit() {
        let b = read_limited(chunks(&[3, 4, 3]), 0, 10).await.unwrap();
        assert_eq!(b.len(), 10);
        let e = read_limited(chunks(&[3, 4, 4]), 0, 10).await.unwrap_err();
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(e.message.contains("10 bytes"), "{}", e.message);
    }
}
