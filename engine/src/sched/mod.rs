//! Request scheduling: continuous batching over one engine thread that owns the model.
//!
//! The server talks to a [`Backend`] (the TGI seam): `submit` a validated request and read its
//! [`RequestStream`] of [`Event`]s (token ids + text deltas, then `Finished` with reason and usage);
//! `health`; `metrics`. [`Scheduler`] is the implementation over a `Box<dyn Model>`.
//!
//! Speculative decoding: a sequence may emit several tokens per step. With a [`Dflash`] draft
//! (`Loaded::dflash`) every step goes through `crate::spec::step` (draft propose, batched target
//! verify, KV rollback, draft context) for the sequences that fit the token budget. A lighter
//! [`SpecDriver`] hook (`spec_hook.rs`) lets any proposer (n-gram, oracle) feed draft tokens to the
//! plain batcher, which verifies them by sample-and-compare.
pub mod detok;
mod engine;
pub mod metrics;
pub mod prefix_cache;
pub mod spec_hook;
pub mod stream;
pub mod types;

pub use engine::{logprob_of, Dflash, SchedConfig};
pub use metrics::{Histogram, MetricsSnapshot};
pub use spec_hook::SpecDriver;
pub use stream::RequestStream;
pub use types::{
    Event, FinishReason, GenRequest, Health, StopReason, SubmitError, TokenLogprob, Usage,
};

use crate::error::Result;
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use engine::{Engine, Msg, Shared, Submission};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

/// What the HTTP server needs from an inference backend.
pub trait Backend: Send + Sync {
    /// Queue a request; the stream yields its events. Dropping the stream cancels the request.
    fn submit(&self, req: GenRequest) -> std::result::Result<RequestStream, SubmitError>;
    fn health(&self) -> Health;
    fn metrics(&self) -> MetricsSnapshot;
}

/// Continuous-batching scheduler: a handle to the engine thread.
pub struct Scheduler {
    tx: Mutex<mpsc::Sender<Msg>>,
    shared: Arc<Shared>,
    cfg: SchedConfig,
    tokenizer: Option<Arc<Tokenizer>>,
}

/// What the engine thread runs: the target, and optionally a proposer hook or a DFlash draft.
pub struct Loaded {
    pub model: Box<dyn Model>,
    pub spec: Option<Box<dyn SpecDriver>>,
    pub dflash: Option<Dflash>,
}

impl Loaded {
    pub fn plain(model: Box<dyn Model>) -> Loaded {
        Loaded {
            model,
            spec: None,
            dflash: None,
        }
    }
}

pub type ModelLoader = Box<dyn FnOnce() -> Result<Loaded> + Send>;

impl Scheduler {
    /// Start the engine thread with a model that is already loaded.
    pub fn start(
        cfg: SchedConfig,
        loaded: Loaded,
        tokenizer: Option<Arc<Tokenizer>>,
    ) -> Result<Scheduler> {
        let s = Self::start_loading(cfg, Box::new(move || Ok(loaded)), tokenizer)?;
        // The "loader" only moves the model; wait the moment it takes so `submit` works at once.
        while s.health() == Health::Loading {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        Ok(s)
    }

    /// Start the engine thread, which first runs `loader` (health is `Loading` meanwhile).
    pub fn start_loading(
        cfg: SchedConfig,
        loader: ModelLoader,
        tokenizer: Option<Arc<Tokenizer>>,
    ) -> Result<Scheduler> {
        if cfg.max_num_seqs == 0 || cfg.max_num_batched_tokens == 0 || cfg.max_model_len == 0 {
            return Err(crate::EngineError::Other(
                "max_num_seqs, max_num_batched_tokens and max_model_len must be at least 1".into(),
            ));
        }
        if cfg.max_num_batched_tokens < cfg.max_num_seqs {
            return Err(crate::EngineError::Other(format!(
                "max_num_batched_tokens ({}) must be at least max_num_seqs ({}) so every running sequence can decode each step",
                cfg.max_num_batched_tokens, cfg.max_num_seqs
            )));
        }
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            health: Mutex::new(Health::Loading),
            metrics: Mutex::new(MetricsSnapshot::default()),
            queued: AtomicUsize::new(0),
            vocab_size: AtomicUsize::new(0),
        });
        let sh = shared.clone();
        let c = cfg.clone();
        std::thread::Builder::new()
            .name("laguna-engine".into())
            .spawn(move || match loader() {
                Ok(l) => {
                    sh.vocab_size
                        .store(l.model.config().vocab_size, Ordering::Release);
                    *sh.health.lock().unwrap_or_else(|e| e.into_inner()) = Health::Ready;
                    let sh2 = sh.clone();
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                        Engine::new(c, l.model, l.spec, l.dflash, rx, sh).run()
                    }));
                    if run.is_err() {
                        // Requests in flight see their streams end with an error; /health turns 503.
                        tracing::error!(
                            "the engine thread panicked; the server stays up but cannot generate"
                        );
                        *sh2.health.lock().unwrap_or_else(|e| e.into_inner()) =
                            Health::Failed("the engine thread panicked".into());
                    }
                }
                Err(e) => {
                    tracing::error!("model failed to load: {e}");
                    *sh.health.lock().unwrap_or_else(|e| e.into_inner()) =
                        Health::Failed(e.to_string());
                }
            })
            .map_err(|e| {
                crate::EngineError::Other(format!("could not start the engine thread: {e}"))
            })?;
        Ok(Scheduler {
            tx: Mutex::new(tx),
            shared,
            cfg,
            tokenizer,
        })
    }

    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    fn check(&self, req: &GenRequest) -> std::result::Result<(), SubmitError> {
        if req.prompt.is_empty() {
            return Err(SubmitError::Invalid(
                "the prompt is empty: give at least one token".into(),
            ));
        }
        if req.max_tokens == 0 {
            return Err(SubmitError::Invalid("max_tokens must be at least 1".into()));
        }
        let v = self.shared.vocab_size.load(Ordering::Acquire) as u32;
        if let Some(t) = req.prompt.iter().find(|&&t| t >= v) {
            return Err(SubmitError::Invalid(format!(
                "prompt token id {t} is outside the vocabulary (size {v})"
            )));
        }
        let total = req.prompt.len() + req.max_tokens;
        if total > self.cfg.max_model_len {
            return Err(SubmitError::Invalid(format!(
                "prompt ({} tokens) + max_tokens ({}) = {total} exceeds max_model_len ({})",
                req.prompt.len(),
                req.max_tokens,
                self.cfg.max_model_len
            )));
        }
        Ok(())
    }
}

impl Backend for Scheduler {
    fn submit(&self, req: GenRequest) -> std::result::Result<RequestStream, SubmitError> {
        match self.health() {
            Health::Loading => return Err(SubmitError::Loading),
            Health::Failed(e) => return Err(SubmitError::Dead(e)),
            Health::Ready => {}
        }
        self.check(&req)?;
        if self.cfg.max_waiting > 0
            && self.shared.queued.load(Ordering::Acquire) >= self.cfg.max_waiting
        {
            return Err(SubmitError::Overloaded(self.cfg.max_waiting));
        }
        let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicU8::new(stream::LIVE));
        let prompt_tokens = req.prompt.len();
        let skip = req.skip_special_tokens;
        let stop = req.stop.clone();
        let sub = Submission {
            req,
            tx: etx,
            cancel: cancel.clone(),
            arrival: Instant::now(),
        };
        let inbox = self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        if inbox.send(Msg::Submit(Box::new(sub))).is_err() {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::Dead("the engine thread has stopped".into()));
        }
        let waker = Mutex::new(inbox);
        let guard = stream::CancelGuard {
            flag: cancel,
            wake: Box::new(move || {
                let _ = waker
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .send(Msg::Wake);
            }),
        };
        Ok(RequestStream::new(
            erx,
            guard,
            self.tokenizer.clone(),
            prompt_tokens,
            skip,
            stop,
        ))
    }

    fn health(&self) -> Health {
        self.shared
            .health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.shared
            .metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod prefix_tests;
#[cfg(test)]
mod tests;
