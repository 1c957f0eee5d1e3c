//! Server-sent events in OpenAI's framing: `data: {json}\n\n` chunks, then `data: [DONE]\n\n`.
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use warp::Reply;

/// Keep-alive comments while nothing else is sent (long prefills); also how a dead client is noticed.
pub const KEEP_ALIVE: Duration = Duration::from_secs(10);

struct Body {
    rx: mpsc::Receiver<String>,
}

impl futures_util::Stream for Body {
    type Item = Result<String, Infallible>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|o| o.map(Ok))
    }
}

/// The producer side; the response body ends when it is dropped.
pub struct SseSender {
    tx: mpsc::Sender<String>,
}

impl SseSender {
    /// Send one JSON chunk; false once the client is gone.
    pub async fn data(&self, v: &serde_json::Value) -> bool {
        self.tx.send(format!("data: {v}\n\n")).await.is_ok()
    }
    /// Send one named event (`event: NAME` then the JSON data), as Anthropic and Responses streams do.
    pub async fn event(&self, name: &str, v: &serde_json::Value) -> bool {
        self.tx
            .send(format!("event: {name}\ndata: {v}\n\n"))
            .await
            .is_ok()
    }
    pub async fn done(&self) -> bool {
        self.tx.send("data: [DONE]\n\n".to_string()).await.is_ok()
    }
    pub async fn keep_alive(&self) -> bool {
        self.tx.send(": keep-alive\n\n".to_string()).await.is_ok()
    }
    /// Resolves when the client has gone away (the response body was dropped).
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

pub fn channel() -> (SseSender, warp::reply::Response) {
    let (tx, rx) = mpsc::channel(64);
    let reply = warp::reply::stream(Body { rx });
    let reply = warp::reply::with_header(reply, "content-type", "text/event-stream");
    let reply = warp::reply::with_header(reply, "cache-control", "no-cache");
    (SseSender { tx }, reply.into_response())
}
