//! The server's end of one request: engine events in, text deltas out. Dropping it (client gone)
//! cancels the request; the engine frees its KV at the start of its next step.
use super::detok::{Detokenizer, StopCheck, StopMatcher};
use super::types::{EngineEvent, Event, FinishReason, StopReason, Usage};
use crate::tokenizer::Tokenizer;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

pub(crate) const LIVE: u8 = 0;
pub(crate) const ABORTED: u8 = 1;
/// Finished by a stop string the stream matched (counted as `stop`).
pub(crate) const STOPPED: u8 = 2;
/// The engine finished it on its own.
pub(crate) const DONE: u8 = 3;

/// Cancels the request when dropped unless it already finished.
pub(crate) struct CancelGuard {
    pub(crate) flag: Arc<AtomicU8>,
    pub(crate) wake: Box<dyn Fn() + Send + Sync>,
}

impl CancelGuard {
    fn set(&self, v: u8) {
        if self
            .flag
            .compare_exchange(LIVE, v, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            (self.wake)();
        }
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        self.set(ABORTED);
    }
}

pub struct RequestStream {
    rx: UnboundedReceiver<EngineEvent>,
    guard: CancelGuard,
    tokenizer: Option<Arc<Tokenizer>>,
    detok: Detokenizer,
    stops: StopMatcher,
    usage: Usage,
    out: VecDeque<Event>,
    done: bool,
}

impl RequestStream {
    pub(crate) fn new(
        rx: UnboundedReceiver<EngineEvent>,
        guard: CancelGuard,
        tokenizer: Option<Arc<Tokenizer>>,
        prompt_tokens: usize,
        skip_special: bool,
        stop: Vec<String>,
    ) -> RequestStream {
        RequestStream {
            rx,
            guard,
            tokenizer,
            detok: Detokenizer::new(skip_special),
            stops: StopMatcher::new(stop),
            usage: Usage {
                prompt_tokens,
                completion_tokens: 0,
                cached_tokens: 0,
            },
            out: VecDeque::new(),
            done: false,
        }
    }

    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Cancel now (same as dropping the stream).
    pub fn cancel(&mut self) {
        self.guard.set(ABORTED);
        self.done = true;
        self.out.clear();
    }

    /// The next event; `None` after `Finished`/`Error`.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(ev) = self.out.pop_front() {
                return Some(ev);
            }
            if self.done {
                return None;
            }
            match self.rx.recv().await {
                Some(ev) => self.translate(ev),
                None => {
                    self.done = true;
                    return Some(Event::Error(
                        "the engine stopped while serving this request".into(),
                    ));
                }
            }
        }
    }

    fn translate(&mut self, ev: EngineEvent) {
        match ev {
            EngineEvent::Cached(n) => self.usage.cached_tokens = n,
            EngineEvent::Tokens { ids, logprobs } => {
                self.usage.completion_tokens += ids.len();
                let delta = match &self.tokenizer {
                    Some(t) => self.detok.push(t, &ids),
                    None => String::new(),
                };
                match self.stops.push(&delta) {
                    StopCheck::Emit(text) => self.out.push_back(Event::Delta {
                        ids,
                        text,
                        logprobs,
                    }),
                    StopCheck::Stopped(text, s) => {
                        // The engine stops this sequence at its next step and reports nothing more.
                        self.guard.set(STOPPED);
                        self.done = true;
                        self.out.push_back(Event::Delta {
                            ids,
                            text,
                            logprobs,
                        });
                        self.out.push_back(Event::Finished {
                            reason: FinishReason::Stop,
                            stop_reason: Some(StopReason::Text(s)),
                            usage: self.usage,
                        });
                    }
                }
            }
            EngineEvent::Finished { reason, stop_token } => {
                self.done = true;
                let _ = self.guard.flag.compare_exchange(
                    LIVE,
                    DONE,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                let tail = match &self.tokenizer {
                    Some(t) => self.detok.flush(t),
                    None => String::new(),
                };
                let (text, reason, stop_reason) = match self.stops.push(&tail) {
                    StopCheck::Emit(t) => (
                        t + &self.stops.flush(),
                        reason,
                        stop_token.map(StopReason::TokenId),
                    ),
                    StopCheck::Stopped(t, s) => (t, FinishReason::Stop, Some(StopReason::Text(s))),
                };
                if !text.is_empty() {
                    self.out.push_back(Event::Delta {
                        ids: vec![],
                        text,
                        logprobs: vec![],
                    });
                }
                self.out.push_back(Event::Finished {
                    reason,
                    stop_reason,
                    usage: self.usage,
                });
            }
            EngineEvent::Error(e) => {
                self.done = true;
                self.out.push_back(Event::Error(e));
            }
        }
    }
}
