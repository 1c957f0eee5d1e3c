//! What goes into the scheduler (a validated request) and what comes out (events).
use crate::sample::SamplingParams;

/// A request the server has already validated and tokenized.
#[derive(Debug, Clone)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub ignore_eos: bool,
    pub stop_token_ids: Vec<u32>,
    /// Stop strings: generation ends when the decoded text contains one (it is not returned).
    pub stop: Vec<String>,
    /// `Some(n)`: report the chosen token's logprob and the `n` most likely alternatives.
    pub logprobs: Option<usize>,
    /// Drop special tokens (e.g. `</assistant>`) from text deltas.
    pub skip_special_tokens: bool,
    /// Constrained decoding: only tokens this grammar allows are sampled, and EOS only once it is
    /// complete (`crate::grammar`).
    pub constraint: Option<crate::grammar::Constraint>,
}

impl GenRequest {
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenRequest {
        GenRequest {
            prompt,
            max_tokens,
            sampling: SamplingParams::greedy(),
            ignore_eos: false,
            stop_token_ids: vec![],
            stop: vec![],
            logprobs: None,
            skip_special_tokens: true,
            constraint: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// max_tokens or max_model_len reached.
    Length,
    /// The client went away (or the server cancelled the request).
    Abort,
    /// The engine failed on this request.
    Error,
}

impl FinishReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
        }
    }
}

/// vLLM's `stop_reason`: what matched, when it was not EOS.
#[derive(Debug, Clone, PartialEq)]
pub enum StopReason {
    TokenId(u32),
    Text(String),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose K/V came from the prefix cache (OpenAI's
    /// `prompt_tokens_details.cached_tokens`).
    pub cached_tokens: usize,
}

/// Log-probabilities of one generated token (natural log of softmax of the raw logits).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// The most likely tokens at this position, best first.
    pub top: Vec<(u32, f32)>,
}

/// What the engine thread sends for one sequence.
#[derive(Debug, Clone)]
pub(crate) enum EngineEvent {
    /// Sent once at admission: prompt tokens restored from the prefix cache.
    Cached(usize),
    /// One or more tokens (several per step with speculative decoding).
    Tokens {
        ids: Vec<u32>,
        logprobs: Vec<TokenLogprob>,
    },
    Finished {
        reason: FinishReason,
        stop_token: Option<u32>,
    },
    Error(String),
}

/// What a request stream yields to the server.
#[derive(Debug, Clone)]
pub enum Event {
    /// New tokens and the text they completed (may be empty while a multi-byte char or a
    /// possible stop string is pending).
    Delta {
        ids: Vec<u32>,
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    /// Always the last event of a stream.
    Finished {
        reason: FinishReason,
        stop_reason: Option<StopReason>,
        usage: Usage,
    },
    /// The request failed inside the engine; no `Finished` follows.
    Error(String),
}

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum SubmitError {
    #[error("the model is still loading")]
    Loading,
    #[error("the engine is not running: {0}")]
    Dead(String),
    #[error("{0}")]
    Invalid(String),
    #[error("too many requests are waiting ({0}); try again later")]
    Overloaded(usize),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Health {
    Loading,
    Ready,
    Failed(String),
}
