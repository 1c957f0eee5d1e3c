//! OpenAI request types (what vLLM accepts; unknown fields are ignored) and their validation.
use super::errors::ApiError;
use laguna_engine::sample::SamplingParams;
use serde::Deserialize;
use serde_json::Value as Json;

#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
    }
}

#[derive(Debug, Deserialize, Clone, Default)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
    pub continuous_usage_stats: Option<bool>,
}

#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize, Clone)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize, Clone)]
pub struct FunctionIn {
    pub name: String,
    /// A JSON string (what clients send back) or an object.
    pub arguments: Option<Json>,
}

#[derive(Debug, Deserialize, Clone)]
pub struct ToolCallIn {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: FunctionIn,
}

#[derive(Debug, Deserialize, Clone)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<MessageContent>,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<ToolCallIn>>,
    pub tool_call_id: Option<String>,
    pub reasoning_content: Option<String>,
    pub reasoning: Option<String>,
}

/// Sampling and stopping fields shared by chat and completions.
#[derive(Debug, Deserialize, Clone, Default)]
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub skip_special_tokens: Option<bool>,
}

#[derive(Debug, Deserialize, Clone)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub common: CommonParams,
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub tools: Option<Vec<Json>>,
    pub tool_choice: Option<Json>,
    /// `false`: a forced tool choice makes exactly one call.
    pub parallel_tool_calls: Option<bool>,
    /// `{"type": "text" | "json_object" | "json_schema", ...}`: enforced by a grammar.
    pub response_format: Option<Json>,
    pub chat_template_kwargs: Option<serde_json::Map<String, Json>>,
    pub reasoning_effort: Option<String>,
    pub include_reasoning: Option<bool>,
    pub add_generation_prompt: Option<bool>,
}

#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize, Clone)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    #[serde(flatten)]
    pub common: CommonParams,
    /// Number of top alternatives per token (legacy completions logprobs).
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    /// JSON output enforced by a grammar, as on chat completions (vLLM takes it here too).
    pub response_format: Option<Json>,
}

/// Parse a JSON body: malformed JSON and wrong types are 400s with serde's message.
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request(
            "The request body is empty; send a JSON object.",
        ));
    }
    let v: Json = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("The request body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "The request body must be a JSON object.",
        ));
    }
    // serde's flatten loses field paths; still names the problem ("invalid type: string \"x\", expected f64").
    serde_json::from_value(v).map_err(|e| ApiError::bad_request(format!("Invalid request: {e}")))
}

#[derive(Debug)]
pub struct Validated {
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub stream: bool,
    pub include_usage: bool,
    pub max_tokens: Option<usize>,
}

/// Defaults from the checkpoint's generation_config.json (vLLM's `--generation-config auto`).
#[derive(Debug, Clone, Default)]
pub struct SamplingDefaults {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
}

/// Temperatures below this sample greedily (vLLM's `_SAMPLING_EPS`).
const SAMPLING_EPS: f32 = 1e-5;

pub fn validate_common(
    c: &CommonParams,
    max_tokens: Option<i64>,
    defaults: &SamplingDefaults,
) -> Result<Validated, ApiError> {
    if let Some(n) = c.n {
        if n != 1 {
            return Err(ApiError::bad_request(format!(
                "n must be 1: laguna returns one choice per request (got n={n})."
            ))
            .with_param("n"));
        }
    }
    let max_tokens = match max_tokens {
        Some(m) if m < 1 => {
            return Err(
                ApiError::bad_request(format!("max_tokens must be at least 1, got {m}."))
                    .with_param("max_tokens"),
            );
        }
        Some(m) => Some(m as usize),
        None => None,
    };
    // Checked as the f32 the engine samples with: a value that overflows to infinity or
    // underflows to zero there is refused here, not turned into NaN logits.
    let temperature = c.temperature.or(defaults.temperature).unwrap_or(1.0);
    let t32 = temperature as f32;
    if !(t32.is_finite() && t32 >= 0.0) {
        return Err(ApiError::bad_request(format!(
            "temperature must be non-negative and at most {:e}, got {temperature}.",
            f32::MAX
        ))
        .with_param("temperature"));
    }
    // vLLM's rule: a temperature below 1e-5 is greedy (dividing logits by it would overflow).
    let t32 = if t32 < SAMPLING_EPS { 0.0 } else { t32 };
    let top_p = c.top_p.or(defaults.top_p).unwrap_or(1.0);
    let p32 = top_p as f32;
    if !(p32 > 0.0 && p32 <= 1.0) {
        return Err(ApiError::bad_request(format!(
            "top_p must be in (0, 1] (and at least {:e}), got {top_p}.",
            f32::MIN_POSITIVE
        ))
        .with_param("top_p"));
    }
    let top_k = c.top_k.or(defaults.top_k).unwrap_or(0);
    if top_k < -1 {
        return Err(ApiError::bad_request(format!(
            "top_k must be -1 (disable), or at least 1, got {top_k}."
        ))
        .with_param("top_k"));
    }
    let stop = c.stop.clone().map(StopField::into_vec).unwrap_or_default();
    let stream = c.stream.unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::bad_request(
            "Stream options can only be defined when `stream=True`.",
        )
        .with_param("stream_options"));
    }
    // vLLM: sending stream_options turns include_usage on unless it says false.
    let include_usage = c
        .stream_options
        .as_ref()
        .map(|o| o.include_usage.unwrap_or(true))
        .unwrap_or(false);
    Ok(Validated {
        sampling: SamplingParams {
            temperature: t32,
            top_k: if top_k <= 0 { 0 } else { top_k as usize },
            top_p: p32,
            seed: c.seed.map(|s| s as u64),
        },
        stop,
        stop_token_ids: c.stop_token_ids.clone().unwrap_or_default(),
        ignore_eos: c.ignore_eos.unwrap_or(false),
        stream,
        include_usage,
        max_tokens,
    })
}

/// A function tool in chat-completions shape, keys in OpenAI's order (name, description,
/// parameters): the chat template renders the tool as JSON, so the order is part of the prompt.
pub fn chat_function_tool(
    name: &str,
    description: Option<&Json>,
    parameters: Option<&Json>,
) -> Json {
    let mut f = serde_json::Map::new();
    f.insert("name".into(), Json::from(name));
    if let Some(d) = description.filter(|d| !d.is_null()) {
        f.insert("description".into(), d.clone());
    }
    let params = parameters
        .cloned()
        .unwrap_or(serde_json::json!({"type": "object"}));
    f.insert("parameters".into(), params);
    serde_json::json!({"type": "function", "function": f})
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub fn random_id(prefix: &str) -> String {
    let mut r = laguna_engine::sample::Rng::from_entropy();
    format!("{prefix}-{:016x}{:016x}", r.next_u64(), r.next_u64())
}

/// OpenAI's `usage`; `cached` prompt tokens came from the prefix cache.
pub fn usage_json(prompt: usize, completion: usize, cached: usize) -> Json {
    serde_json::json!({"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
                       "prompt_tokens_details": {"cached_tokens": cached}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lenient_and_rejects_wrong_types() {
        let r: ChatRequest = parse_body(br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"foo":1,"max_tokens":5,"stop":"x"}"#).unwrap();
        assert_eq!(r.common.max_tokens, Some(5));
        assert!(matches!(r.common.stop, Some(StopField::One(_))));
        let e = parse_body::<ChatRequest>(br#"{"messages":[],"temperature":"hot"}"#).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        let e = parse_body::<ChatRequest>(b"{not json").unwrap_err();
        assert!(e.message.contains("not valid JSON"));
        let r: CompletionRequest = parse_body(br#"{"prompt":[1,2,3]}"#).unwrap();
        assert!(matches!(r.prompt, PromptField::Ids(_)));
        let r: CompletionRequest = parse_body(br#"{"prompt":["a","b"]}"#).unwrap();
        assert!(matches!(r.prompt, PromptField::Texts(_)));
    }

    #[test]
    fn validation() {
        let d = SamplingDefaults::default();
        let c = CommonParams {
            n: Some(2),
            ..Default::default()
        };
        assert!(validate_common(&c, None, &d)
            .unwrap_err()
            .message
            .contains("n must be 1"));
        let c = CommonParams::default();
        assert!(validate_common(&c, Some(-1), &d).is_err());
        let v = validate_common(
            &CommonParams {
                stream: Some(true),
                stream_options: Some(StreamOptions::default()),
                ..Default::default()
            },
            Some(3),
            &d,
        )
        .unwrap();
        assert!(v.include_usage && v.stream);
        assert_eq!(v.max_tokens, Some(3));
    }

    /// Values valid as f64 but infinite or zero as the f32 the engine uses are refused.
    #[test]
    fn sampling_values_checked_as_f32() {
        let d = SamplingDefaults::default();
        let with = |t: Option<f64>, p: Option<f64>| {
            validate_common(
                &CommonParams {
                    temperature: t,
                    top_p: p,
                    ..Default::default()
                },
                None,
                &d,
            )
        };
        for bad in [1e308, 1e39, f64::INFINITY, -1e-3] {
            let e = with(Some(bad), None).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("temperature"), "{bad}");
        }
        for bad in [1e-300, 1e-46, 0.0, 1.0000001] {
            let e = with(None, Some(bad)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("top_p"), "{bad}");
        }
        // The largest finite f32 is accepted; a temperature below 1e-5 means greedy.
        assert_eq!(with(Some(3e38), None).unwrap().sampling.temperature, 3e38);
        assert_eq!(with(Some(1e-40), None).unwrap().sampling.temperature, 0.0);
        assert_eq!(with(None, Some(1e-30)).unwrap().sampling.top_p, 1e-30);
    }
}
