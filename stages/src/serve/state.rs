//! What every handler shares: the backend, tokenizer, chat template and served names.
use super::chat_template::ChatTemplate;
use super::errors::ApiError;
use super::limits::Limits;
use super::openai::SamplingDefaults;
use laguna_engine::sched::{Backend, GenRequest, Health, RequestStream, SubmitError, TokenLogprob};
use laguna_engine::tokenizer::Tokenizer;
use std::sync::Arc;

pub struct AppState {
    pub backend: Arc<dyn Backend>,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    /// The first is what responses report as `model`.
    pub served_names: Vec<String>,
    /// The model folder (`root` in /v1/models; also accepted as a model name).
    pub model_root: String,
    pub max_model_len: usize,
    pub api_key: Option<String>,
    pub created: u64,
    pub defaults: SamplingDefaults,
    /// Thinking on unless the request says otherwise (a recipe may flip it).
    pub default_enable_thinking: bool,
    /// Compiles the grammars of constrained requests (`constrain`); None when the tokenizer
    /// could not be read for it (such requests then get a 400).
    pub grammar: Option<Arc<laguna_engine::grammar::GrammarEnv>>,
    /// The body limit, the preparation pool and the early length check's bound.
    pub limits: Limits,
}

impl AppState {
    pub fn model_name(&self) -> &str {
        &self.served_names[0]
    }

    /// 404 unless `model` is absent or one of ours.
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            None => Ok(()),
            Some(m) if self.served_names.iter().any(|n| n == m) || m == self.model_root => Ok(()),
            Some(m) => Err(ApiError::model_not_found(m)),
        }
    }

    pub fn check_ready(&self) -> Result<(), ApiError> {
        match self.backend.health() {
            Health::Ready => Ok(()),
            Health::Loading => Err(ApiError::unavailable(
                "The model is still loading; retry when GET /health answers 200.",
            )),
            Health::Failed(e) => Err(ApiError::unavailable(format!(
                "The model failed to load: {e}"
            ))),
        }
    }

    /// Resolve max_tokens against the context window with vLLM's messages.
    pub fn resolve_max_tokens(
        &self,
        requested: Option<usize>,
        prompt_len: usize,
    ) -> Result<usize, ApiError> {
        match requested {
            Some(m) => {
                if prompt_len + m > self.max_model_len {
                    return Err(ApiError::context_length(self.max_model_len, m, prompt_len));
                }
                Ok(m)
            }
            None => {
                if prompt_len >= self.max_model_len {
                    return Err(ApiError::prompt_too_long(self.max_model_len, prompt_len));
                }
                Ok(self.max_model_len - prompt_len)
            }
        }
    }

    pub fn submit(&self, req: GenRequest) -> Result<RequestStream, ApiError> {
        self.backend.submit(req).map_err(|e| match e {
            SubmitError::Loading => ApiError::unavailable(
                "The model is still loading; retry when GET /health answers 200.",
            ),
            SubmitError::Dead(m) => {
                ApiError::unavailable(format!("The engine is not running: {m}"))
            }
            SubmitError::Invalid(m) => ApiError::bad_request(m),
            SubmitError::Overloaded(n) => {
                ApiError::overloaded(format!("Too many requests are waiting ({n}); retry later."))
            }
        })
    }

    /// Tokenize a prompt; a text that provably has more tokens than the context holds (its bytes
    /// over `max_token_bytes`, the most one token can cover) is refused without tokenizing it.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, ApiError> {
        if let Some(m) = self.limits.max_token_bytes {
            let at_least = text.len() / m;
            if at_least > self.max_model_len {
                return Err(ApiError::prompt_far_too_long(
                    self.max_model_len,
                    at_least,
                    text.len(),
                ));
            }
        }
        self.tokenizer
            .encode(text, add_special)
            .map_err(|e| ApiError::bad_request(format!("could not tokenize the prompt: {e}")))
    }

    pub fn token_text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }

    /// One chat `logprobs.content[]` entry.
    pub fn chat_logprob(&self, lp: &TokenLogprob) -> serde_json::Value {
        let entry = |id: u32, logprob: f32| {
            let t = self.token_text(id);
            serde_json::json!({"token": t, "logprob": clamp(logprob), "bytes": t.as_bytes()})
        };
        let mut e = entry(lp.id, lp.logprob);
        let top: Vec<_> = lp.top.iter().map(|&(id, l)| entry(id, l)).collect();
        e["top_logprobs"] = serde_json::Value::Array(top);
        e
    }
}

/// JSON has no -inf; vLLM reports -9999.0.
pub fn clamp(l: f32) -> f64 {
    if l.is_finite() {
        l as f64
    } else {
        -9999.0
    }
}
