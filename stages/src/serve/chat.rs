//! `POST /v1/chat/completions`: messages → template → tokens → scheduler → reasoning/tool parsing.
use super::chat_template::RenderArgs;
use super::errors::ApiError;
use super::openai::{
    now_secs, parse_body, random_id, usage_json, validate_common, ChatMessage, ChatRequest,
    MessageContent,
};
use super::reasoning::ReasoningSplitter;
use super::sse;
use super::state::AppState;
use super::tool_parser::{ToolCallParser, ToolDelta};
use laguna_engine::sched::{Event, FinishReason, GenRequest, RequestStream, StopReason};
use serde_json::{json, Map, Value as Json};
use std::sync::Arc;
use warp::Reply;

/// Messages as the template sees them (OpenAI shapes normalised the way vLLM does).
pub fn template_messages(msgs: &[ChatMessage]) -> Result<Vec<Json>, ApiError> {
    if msgs.is_empty() {
        return Err(
            ApiError::bad_request("`messages` must contain at least one message.")
                .with_param("messages"),
        );
    }
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let role = match m.role.as_str() {
            "developer" => "system",
            r @ ("system" | "user" | "assistant" | "tool") => r,
            other => {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}].role `{other}` is not supported (use system, developer, user, assistant or tool)."
                ))
                .with_param("messages"))
            }
        };
        let content = match &m.content {
            None => Json::Null,
            Some(MessageContent::Text(s)) => Json::String(s.clone()),
            Some(MessageContent::Parts(parts)) => {
                let mut texts = vec![];
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text" | "input_text", Some(t)) => texts.push(t.clone()),
                        (k, _) => {
                            return Err(ApiError::bad_request(format!(
                                "messages[{i}].content has a `{k}` part; this model takes text parts only."
                            ))
                            .with_param("messages"))
                        }
                    }
                }
                Json::String(texts.join("\n"))
            }
        };
        let mut obj = Map::new();
        obj.insert("role".into(), Json::String(role.into()));
        obj.insert("content".into(), content);
        if let Some(n) = &m.name {
            obj.insert("name".into(), Json::String(n.clone()));
        }
        if let Some(calls) = &m.tool_calls {
            let calls: Vec<Json> = calls
                .iter()
                .map(|c| {
                    // Clients send arguments back as a JSON string; templates want a mapping.
                    let args = match &c.function.arguments {
                        Some(Json::String(s)) => serde_json::from_str::<Json>(s)
                            .unwrap_or_else(|_| Json::String(s.clone())),
                        Some(v) => v.clone(),
                        None => json!({}),
                    };
                    json!({"id": c.id, "type": c.kind.clone().unwrap_or_else(|| "function".into()),
                           "function": {"name": c.function.name, "arguments": args}})
                })
                .collect();
            obj.insert("tool_calls".into(), Json::Array(calls));
        }
        if let Some(id) = &m.tool_call_id {
            obj.insert("tool_call_id".into(), Json::String(id.clone()));
        }
        if let Some(r) = m.reasoning_content.as_ref().or(m.reasoning.as_ref()) {
            obj.insert("reasoning_content".into(), Json::String(r.clone()));
            obj.insert("reasoning".into(), Json::String(r.clone()));
        }
        out.push(Json::Object(obj));
    }
    Ok(out)
}

pub(super) fn validate_tools(tools: &[Json]) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        let ok = t
            .get("type")
            .and_then(Json::as_str)
            .is_none_or(|k| k == "function")
            && t.get("function")
                .and_then(|f| f.get("name"))
                .and_then(Json::as_str)
                .is_some();
        if !ok {
            return Err(ApiError::bad_request(format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": ...}}}}.")).with_param("tools"));
        }
    }
    Ok(())
}

fn truthy(v: Option<&Json>) -> bool {
    match v {
        Some(Json::Bool(b)) => *b,
        Some(Json::Null) | None => false,
        Some(Json::String(s)) => !s.is_empty(),
        Some(Json::Number(n)) => n.as_f64() != Some(0.0),
        Some(_) => true,
    }
}

/// Text deltas → reasoning, content and tool-call deltas.
pub struct Assembler {
    reasoning: ReasoningSplitter,
    tools: Option<ToolCallParser>,
    include_reasoning: bool,
}

#[derive(Default)]
pub struct Piece {
    pub reasoning: String,
    pub content: String,
    pub tool: Vec<ToolDelta>,
}

impl Assembler {
    fn split(&mut self, (r, c): (String, String), last: bool) -> Piece {
        let mut p = Piece {
            reasoning: if self.include_reasoning {
                r
            } else {
                String::new()
            },
            ..Default::default()
        };
        match self.tools.as_mut() {
            None => p.content = c,
            Some(t) => {
                let mut ds = t.push(&c);
                if last {
                    ds.extend(t.finish());
                }
                for d in ds {
                    match d {
                        ToolDelta::Content(s) => p.content.push_str(&s),
                        other => p.tool.push(other),
                    }
                }
            }
        }
        p
    }
    pub fn push(&mut self, text: &str) -> Piece {
        let s = self.reasoning.push(text);
        self.split(s, false)
    }
    pub fn finish(&mut self) -> Piece {
        let s = self.reasoning.finish();
        self.split(s, true)
    }
    pub fn called_tools(&self) -> bool {
        self.tools.as_ref().is_some_and(|t| t.num_calls() > 0)
    }
    /// The finished tool calls so far (all of them after `finish`).
    pub fn calls(&self) -> Vec<super::tool_parser::ParsedCall> {
        self.tools.as_ref().map(|t| t.calls()).unwrap_or_default()
    }
    /// Whether reasoning text was produced and is reported.
    pub fn has_reasoning(&self) -> bool {
        self.include_reasoning && self.reasoning.has_reasoning()
    }
}

pub(super) struct Prepared {
    pub stream: RequestStream,
    pub assembler: Assembler,
    include_usage: bool,
    logprobs: bool,
    id: String,
    created: u64,
    model: String,
    pub prompt_tokens: usize,
}

/// How the Anthropic and Responses adapters reuse the chat path.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Reuse {
    /// Cut max_tokens to what the context window leaves instead of rejecting the request
    /// (Anthropic clients must send max_tokens and send 32000 whatever the model).
    pub clamp_max_tokens: bool,
}

fn prepare(state: &AppState, body: &[u8]) -> Result<(Prepared, bool), ApiError> {
    let req: ChatRequest = parse_body(body)?;
    prepare_chat(state, req, Reuse::default())
}

/// Validate a chat request, render and submit it; `bool` is whether the client asked to stream.
pub(super) fn prepare_chat(
    state: &AppState,
    req: ChatRequest,
    reuse: Reuse,
) -> Result<(Prepared, bool), ApiError> {
    state.check_model(req.common.model.as_deref())?;
    state.check_ready()?;
    let max_tokens = req.max_completion_tokens.or(req.common.max_tokens);
    let v = validate_common(&req.common, max_tokens, &state.defaults)?;
    let want_logprobs = req.logprobs.unwrap_or(false);
    let top = match req.top_logprobs {
        Some(t) if !(0..=20).contains(&t) => {
            return Err(ApiError::bad_request(format!(
                "top_logprobs must be between 0 and 20, got {t}."
            ))
            .with_param("top_logprobs"))
        }
        Some(t) if t > 0 && !want_logprobs => {
            return Err(
                ApiError::bad_request("`top_logprobs` needs `logprobs` set to true.")
                    .with_param("top_logprobs"),
            )
        }
        t => t.unwrap_or(0) as usize,
    };
    let messages = template_messages(&req.messages)?;
    let tools = req.tools.clone().filter(|t| !t.is_empty());
    if let Some(t) = &tools {
        validate_tools(t)?;
    }
    let tool_choice_none = matches!(&req.tool_choice, Some(Json::String(s)) if s == "none");
    if let Some(tc) = &req.tool_choice {
        let ok = match tc {
            Json::String(s) => matches!(s.as_str(), "none" | "auto" | "required"),
            Json::Object(o) => o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Json::as_str)
                .is_some(),
            Json::Null => true,
            _ => false,
        };
        if !ok {
            return Err(ApiError::bad_request("tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}.").with_param("tool_choice"));
        }
        let demands_a_tool =
            matches!(tc, Json::Object(_)) || matches!(tc, Json::String(s) if s == "required");
        if demands_a_tool && tools.is_none() {
            return Err(
                ApiError::bad_request("tool_choice needs `tools`.").with_param("tool_choice")
            );
        }
    }
    let (prompt, thinking) = render_prompt(state, &req, &messages, tools.as_deref())?;
    let max_tokens = match v.max_tokens {
        Some(m) if reuse.clamp_max_tokens && prompt.len() < state.max_model_len => {
            Some(m.min(state.max_model_len - prompt.len()))
        }
        m => m,
    };
    let max_tokens = state.resolve_max_tokens(max_tokens, prompt.len())?;
    let prompt_tokens = prompt.len();
    let constraint = super::constrain::for_chat(
        state,
        tools.as_deref(),
        req.tool_choice.as_ref(),
        req.response_format.as_ref(),
        req.parallel_tool_calls,
        thinking,
    )?;
    let gen = GenRequest {
        prompt,
        max_tokens,
        sampling: v.sampling,
        ignore_eos: v.ignore_eos,
        stop_token_ids: v.stop_token_ids,
        stop: v.stop,
        logprobs: if want_logprobs { Some(top) } else { None },
        skip_special_tokens: req.common.skip_special_tokens.unwrap_or(true),
        constraint,
    };
    let stream = state.submit(gen)?;
    let assembler = Assembler {
        reasoning: ReasoningSplitter::new(thinking),
        tools: match (&tools, tool_choice_none) {
            (Some(t), false) => Some(ToolCallParser::new(t.clone())),
            _ => None,
        },
        include_reasoning: req.include_reasoning.unwrap_or(true),
    };
    Ok((
        Prepared {
            stream,
            assembler,
            include_usage: v.include_usage,
            logprobs: want_logprobs,
            id: random_id("chatcmpl"),
            created: now_secs(),
            model: state.model_name().to_string(),
            prompt_tokens,
        },
        v.stream,
    ))
}

/// The prompt's token ids and whether thinking is on (the template's `enable_thinking`).
pub(super) fn render_prompt(
    state: &AppState,
    req: &ChatRequest,
    messages: &[Json],
    tools: Option<&[Json]>,
) -> Result<(Vec<u32>, bool), ApiError> {
    let mut kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
    if !kwargs.contains_key("enable_thinking") {
        let on = match &req.reasoning_effort {
            Some(e) => e != "none",
            None => state.default_enable_thinking,
        };
        kwargs.insert("enable_thinking".into(), Json::Bool(on));
    }
    let thinking = truthy(kwargs.get("enable_thinking")) || truthy(kwargs.get("thinking"));
    let rendered = state
        .template
        .render(&RenderArgs {
            messages,
            tools,
            add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
            kwargs: &kwargs,
        })
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok((state.encode(&rendered, false)?, thinking))
}

pub async fn handle(state: Arc<AppState>, body: warp::hyper::body::Bytes) -> warp::reply::Response {
    match super::limits::prepare(&state, body, prepare).await {
        Err(e) => e.into_response(),
        Ok((p, true)) => stream_response(state, p),
        Ok((p, false)) => match complete(&state, p).await {
            Ok(v) => warp::reply::json(&v).into_response(),
            Err(e) => e.into_response(),
        },
    }
}

pub(super) fn finish_reason(reason: FinishReason, tools: bool) -> &'static str {
    if tools {
        return "tool_calls";
    }
    match reason {
        FinishReason::Length => "length",
        _ => "stop",
    }
}

pub(super) fn stop_reason_json(s: &Option<StopReason>) -> Json {
    match s {
        Some(StopReason::TokenId(t)) => json!(t),
        Some(StopReason::Text(t)) => json!(t),
        None => Json::Null,
    }
}

async fn complete(state: &AppState, mut p: Prepared) -> Result<Json, ApiError> {
    let (mut reasoning, mut content) = (String::new(), String::new());
    let mut lps = vec![];
    loop {
        let Some(ev) = p.stream.next().await else {
            return Err(ApiError::internal("the request ended without a result"));
        };
        match ev {
            Event::Delta { text, logprobs, .. } => {
                let piece = p.assembler.push(&text);
                reasoning += &piece.reasoning;
                content += &piece.content;
                lps.extend(logprobs.iter().map(|l| state.chat_logprob(l)));
            }
            Event::Error(e) => return Err(ApiError::internal(e)),
            Event::Finished {
                reason,
                stop_reason,
                usage,
            } => {
                let piece = p.assembler.finish();
                reasoning += &piece.reasoning;
                content += &piece.content;
                let calls = p
                    .assembler
                    .tools
                    .as_ref()
                    .map(|t| t.calls())
                    .unwrap_or_default();
                let has_reasoning =
                    p.assembler.reasoning.has_reasoning() && p.assembler.include_reasoning;
                let mut msg = json!({"role": "assistant"});
                msg["content"] = if content.is_empty() && (!calls.is_empty() || has_reasoning) {
                    Json::Null
                } else {
                    json!(content)
                };
                let r = if has_reasoning {
                    json!(reasoning)
                } else {
                    Json::Null
                };
                msg["reasoning"] = r.clone();
                msg["reasoning_content"] = r;
                if !calls.is_empty() {
                    msg["tool_calls"] = calls
                        .iter()
                        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                        .collect();
                }
                let logprobs = if p.logprobs {
                    json!({"content": lps})
                } else {
                    Json::Null
                };
                return Ok(json!({
                    "id": p.id,
                    "object": "chat.completion",
                    "created": p.created,
                    "model": p.model,
                    "choices": [{
                        "index": 0,
                        "message": msg,
                        "logprobs": logprobs,
                        "finish_reason": finish_reason(reason, !calls.is_empty()),
                        "stop_reason": stop_reason_json(&stop_reason),
                    }],
                    "usage": usage_json(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens),
                }));
            }
        }
    }
}

/// Delta objects for one piece: text first, then each tool call's start and argument fragments.
fn piece_deltas(piece: Piece) -> Vec<Json> {
    let mut out = vec![];
    let mut text = Map::new();
    if !piece.reasoning.is_empty() {
        text.insert("reasoning".into(), json!(piece.reasoning));
        text.insert("reasoning_content".into(), json!(piece.reasoning));
    }
    if !piece.content.is_empty() {
        text.insert("content".into(), json!(piece.content));
    }
    if !text.is_empty() {
        out.push(Json::Object(text));
    }
    let mut args: Option<(usize, String)> = None;
    let flush = |args: &mut Option<(usize, String)>, out: &mut Vec<Json>| {
        if let Some((index, a)) = args.take() {
            out.push(json!({"tool_calls": [{"index": index, "function": {"arguments": a}}]}));
        }
    };
    for d in piece.tool {
        match d {
            ToolDelta::Start { index, id, name } => {
                flush(&mut args, &mut out);
                out.push(json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}));
            }
            ToolDelta::Args { index, fragment } => match &mut args {
                Some((i, a)) if *i == index => a.push_str(&fragment),
                _ => {
                    flush(&mut args, &mut out);
                    args = Some((index, fragment));
                }
            },
            ToolDelta::Content(_) => {}
        }
    }
    flush(&mut args, &mut out);
    out
}

fn stream_response(state: Arc<AppState>, mut p: Prepared) -> warp::reply::Response {
    let (tx, resp) = sse::channel();
    let (id, created, model, include_usage) =
        (p.id.clone(), p.created, p.model.clone(), p.include_usage);
    tokio::spawn(async move {
        let chunk = |delta: Json, logprobs: Json, finish: Json, extra: Option<(&str, Json)>| {
            let mut c = json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
            });
            if let Some((k, v)) = extra {
                c["choices"][0][k] = v;
            }
            if include_usage {
                c["usage"] = Json::Null;
            }
            c
        };
        if !tx
            .data(&chunk(
                json!({"role": "assistant", "content": ""}),
                Json::Null,
                Json::Null,
                None,
            ))
            .await
        {
            return;
        }
        loop {
            let ev = tokio::select! {
                ev = p.stream.next() => ev,
                _ = tx.closed() => return, // client gone: dropping `p.stream` cancels the request
                _ = tokio::time::sleep(sse::KEEP_ALIVE) => {
                    if !tx.keep_alive().await { return; }
                    continue;
                }
            };
            let Some(ev) = ev else { return };
            match ev {
                Event::Delta { text, logprobs, .. } => {
                    let piece = p.assembler.push(&text);
                    let lp = if p.logprobs && !logprobs.is_empty() {
                        json!({"content": logprobs.iter().map(|l| state.chat_logprob(l)).collect::<Vec<_>>()})
                    } else {
                        Json::Null
                    };
                    let mut deltas = piece_deltas(piece);
                    if deltas.is_empty() && !lp.is_null() {
                        deltas.push(json!({"content": ""}));
                    }
                    let mut lp = Some(lp);
                    for d in deltas {
                        if !tx
                            .data(&chunk(d, lp.take().unwrap_or(Json::Null), Json::Null, None))
                            .await
                        {
                            return;
                        }
                    }
                }
                Event::Error(e) => {
                    let err = ApiError::internal(e).body();
                    let _ = tx.data(&err).await;
                    let _ = tx.done().await;
                    return;
                }
                Event::Finished {
                    reason,
                    stop_reason,
                    usage,
                } => {
                    for d in piece_deltas(p.assembler.finish()) {
                        if !tx.data(&chunk(d, Json::Null, Json::Null, None)).await {
                            return;
                        }
                    }
                    let fr = finish_reason(reason, p.assembler.called_tools());
                    let last = chunk(
                        json!({}),
                        Json::Null,
                        json!(fr),
                        Some(("stop_reason", stop_reason_json(&stop_reason))),
                    );
                    if !tx.data(&last).await {
                        return;
                    }
                    if p.include_usage {
                        let u = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                                       "choices": [], "usage": usage_json(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)});
                        if !tx.data(&u).await {
                            return;
                        }
                    }
                    let _ = tx.done().await;
                    return;
                }
            }
        }
    });
    resp
}

/// A whole generation, split into reasoning, content and tool calls (the non-streaming
/// Anthropic and Responses replies build on it).
pub(super) struct Collected {
    pub reasoning: Option<String>,
    pub content: String,
    pub calls: Vec<super::tool_parser::ParsedCall>,
    pub reason: FinishReason,
    pub stop_reason: Option<StopReason>,
    pub usage: laguna_engine::sched::Usage,
}

pub(super) async fn collect(mut p: Prepared) -> Result<Collected, ApiError> {
    let (mut reasoning, mut content) = (String::new(), String::new());
    loop {
        match p.stream.next().await {
            None => return Err(ApiError::internal("the request ended without a result")),
            Some(Event::Error(e)) => return Err(ApiError::internal(e)),
            Some(Event::Delta { text, .. }) => {
                let piece = p.assembler.push(&text);
                reasoning += &piece.reasoning;
                content += &piece.content;
            }
            Some(Event::Finished {
                reason,
                stop_reason,
                usage,
            }) => {
                let piece = p.assembler.finish();
                reasoning += &piece.reasoning;
                content += &piece.content;
                return Ok(Collected {
                    reasoning: p.assembler.has_reasoning().then_some(reasoning),
                    content,
                    calls: p.assembler.calls(),
                    reason,
                    stop_reason,
                    usage,
                });
            }
        }
    }
}
