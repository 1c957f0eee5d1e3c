//! Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! A request becomes a chat-completions request (the same template, generation, tool-call and
//! reasoning parsing as /v1/chat/completions); the result goes back in Anthropic's shapes
//! (streaming in `anthropic_sse`). Any model name is accepted and echoed (clients such as Claude
//! Code send their own model ids). docs/design/agent-apis.md has the mapping tables.
use super::chat::{self, Collected, Reuse};
use super::errors::ApiError;
use super::openai::{parse_body, random_id, ChatRequest};
use super::state::AppState;
use laguna_engine::sched::{FinishReason, StopReason};
use serde::Deserialize;
use serde_json::{json, Map, Value as Json};
use std::sync::Arc;
use warp::http::StatusCode;
use warp::Reply;

/// The first line Claude Code puts in its system prompt; it changes on every request (a per-request
/// hash) and would defeat prefix caching, so it is dropped.
pub const BILLING_HEADER: &str = "x-anthropic-billing-header:";

#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    pub model: Option<String>,
    pub messages: Vec<InMessage>,
    pub system: Option<Content>,
    pub max_tokens: Option<i64>,
    pub stop_sequences: Option<Vec<String>>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub stream: Option<bool>,
    pub tools: Option<Vec<Json>>,
    pub tool_choice: Option<Json>,
    pub thinking: Option<Json>,
    pub output_config: Option<Json>,
    /// The structured-outputs beta's spelling of `output_config.format`.
    pub output_format: Option<Json>,
    /// vLLM's extension, passed to the chat template as is.
    pub chat_template_kwargs: Option<Map<String, Json>>,
}

#[derive(Debug, Deserialize)]
pub struct InMessage {
    pub role: String,
    pub content: Content,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Blocks(Vec<Json>),
}

/// Anthropic's error object: `{"type": "error", "error": {"type", "message"}}`.
pub fn error_body(e: &ApiError) -> Json {
    let kind = match e.status.as_u16() {
        400 | 405 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": e.message}})
}

pub fn error_response(e: ApiError) -> warp::reply::Response {
    warp::reply::with_status(warp::reply::json(&error_body(&e)), e.status).into_response()
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(msg)
}

/// System text with Claude Code's volatile billing line removed (a block that is that line, or
/// that line at the top of a string).
fn system_text(system: &Content) -> Result<String, ApiError> {
    let parts: Vec<String> = match system {
        Content::Text(s) => vec![s.clone()],
        Content::Blocks(blocks) => blocks
            .iter()
            .enumerate()
            .map(
                |(i, b)| match (b.get("type").and_then(Json::as_str), b.get("text")) {
                    (Some("text"), Some(Json::String(t))) => Ok(t.clone()),
                    _ => Err(bad(format!("system[{i}]: only text blocks are supported."))),
                },
            )
            .collect::<Result<_, _>>()?,
    };
    let kept: Vec<String> = parts.iter().filter_map(|p| strip_billing(p)).collect();
    Ok(kept.join("\n"))
}

/// `None` when the text is only the billing line.
fn strip_billing(text: &str) -> Option<String> {
    if !text.starts_with(BILLING_HEADER) {
        return Some(text.to_string());
    }
    let rest = text.split_once('\n').map(|(_, r)| r).unwrap_or("");
    (!rest.is_empty()).then(|| rest.to_string())
}

fn block_text(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        Json::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Json::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        Json::Null => String::new(),
        other => other.to_string(),
    }
}

/// One Anthropic message as chat messages: tool results become `tool` messages (in block order),
/// an assistant's thinking, text and tool_use blocks one assistant message.
fn convert_message(i: usize, m: &InMessage, out: &mut Vec<Json>) -> Result<(), ApiError> {
    let role = match m.role.as_str() {
        r @ ("user" | "assistant" | "system") => r,
        other => {
            return Err(bad(format!(
                "messages[{i}].role `{other}` is not supported (use user or assistant)."
            )))
        }
    };
    let blocks = match &m.content {
        Content::Text(s) => {
            let text = if role == "system" {
                strip_billing(s).unwrap_or_default()
            } else {
                s.clone()
            };
            out.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Content::Blocks(b) => b,
    };
    let (mut text, mut reasoning, mut calls) = (Vec::<String>::new(), String::new(), vec![]);
    for (j, b) in blocks.iter().enumerate() {
        let kind = b.get("type").and_then(Json::as_str).unwrap_or("");
        match (kind, role) {
            ("text", _) => {
                let t = b.get("text").and_then(Json::as_str).unwrap_or("");
                match role {
                    "system" => text.extend(strip_billing(t)),
                    _ => text.push(t.to_string()),
                }
            }
            ("thinking", "assistant") => {
                reasoning += b.get("thinking").and_then(Json::as_str).unwrap_or("")
            }
            ("redacted_thinking" | "thinking", _) => {}
            ("tool_use", "assistant") => {
                let name = b.get("name").and_then(Json::as_str).ok_or_else(|| {
                    bad(format!(
                        "messages[{i}].content[{j}]: tool_use needs a name."
                    ))
                })?;
                calls.push(json!({"id": b.get("id").cloned().unwrap_or(Json::Null), "type": "function",
                                  "function": {"name": name, "arguments": b.get("input").cloned().unwrap_or(json!({}))}}));
            }
            ("tool_result", "user") => {
                if !text.is_empty() {
                    out.push(json!({"role": "user", "content": text.join("\n")}));
                    text.clear();
                }
                out.push(json!({"role": "tool", "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Json::Null),
                                "content": block_text(b.get("content").unwrap_or(&Json::Null))}));
            }
            ("image" | "document", _) => {
                return Err(bad(format!(
                    "messages[{i}].content[{j}] is a `{kind}` block; this model takes text only."
                )))
            }
            (k, r) => {
                return Err(bad(format!(
                    "messages[{i}].content[{j}]: a `{k}` block is not supported in a {r} message."
                )))
            }
        }
    }
    if role == "assistant" {
        let mut msg = json!({"role": "assistant", "content": text.join("")});
        if !reasoning.is_empty() {
            msg["reasoning_content"] = json!(reasoning);
        }
        if !calls.is_empty() {
            msg["tool_calls"] = json!(calls);
        }
        out.push(msg);
    } else if !text.is_empty() {
        out.push(json!({"role": role, "content": text.join("\n")}));
    }
    Ok(())
}

/// Custom tools as chat `function` tools; server tools (typed, e.g. `web_search_20250305`) are
/// not run here and are left out with a warning.
fn convert_tools(tools: &[Json]) -> Result<Vec<Json>, ApiError> {
    let mut out = vec![];
    for (i, t) in tools.iter().enumerate() {
        match t.get("type").and_then(Json::as_str) {
            None | Some("custom") => {}
            Some(other) => {
                tracing::warn!(
                    "/v1/messages: tools[{i}] of type `{other}` is not supported here; left out"
                );
                continue;
            }
        }
        let name = t
            .get("name")
            .and_then(Json::as_str)
            .ok_or_else(|| bad(format!("tools[{i}].name: Field required")))?;
        out.push(super::openai::chat_function_tool(
            name,
            t.get("description"),
            t.get("input_schema"),
        ));
    }
    Ok(out)
}

/// `thinking` → the template's enable_thinking (absent: the server's default). `disabled` turns it
/// off; `enabled`, `adaptive`, `between_tools` (and types added later) turn it on.
fn thinking_flag(thinking: Option<&Json>) -> Result<Option<bool>, ApiError> {
    let Some(t) = thinking else { return Ok(None) };
    match t.get("type").and_then(Json::as_str) {
        Some("disabled") => Ok(Some(false)),
        Some(_) => Ok(Some(true)),
        None => Err(bad("thinking.type: Field required")),
    }
}

/// The chat-completions request an Anthropic request stands for.
pub fn to_chat(req: &MessagesRequest, count_only: bool) -> Result<ChatRequest, ApiError> {
    let mut messages = vec![];
    if let Some(s) = &req.system {
        let text = system_text(s)?;
        if !text.is_empty() {
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    for (i, m) in req.messages.iter().enumerate() {
        convert_message(i, m, &mut messages)?;
    }
    let mut chat = json!({"messages": messages});
    let mut kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
    if let Some(on) = thinking_flag(req.thinking.as_ref())? {
        kwargs.entry("enable_thinking").or_insert(Json::Bool(on));
    }
    chat["chat_template_kwargs"] = Json::Object(kwargs);
    let choice = req.tool_choice.as_ref();
    let choice_kind = choice.and_then(|c| c.get("type")).and_then(Json::as_str);
    let tools = convert_tools(req.tools.as_deref().unwrap_or_default())?;
    if !tools.is_empty() && choice_kind != Some("none") {
        chat["tools"] = json!(tools);
    }
    match (choice_kind, choice) {
        (None, None) | (Some("none"), _) => {}
        (Some("auto"), _) => chat["tool_choice"] = json!("auto"),
        (Some("any"), _) => chat["tool_choice"] = json!("required"),
        (Some("tool"), Some(c)) => {
            let name = c
                .get("name")
                .and_then(Json::as_str)
                .ok_or_else(|| bad("tool_choice.name: Field required for type \"tool\"."))?;
            chat["tool_choice"] = json!({"type": "function", "function": {"name": name}});
        }
        _ => {
            return Err(bad(
                "tool_choice.type must be \"auto\", \"any\", \"tool\" or \"none\".",
            ))
        }
    }
    if choice.and_then(|c| c.get("disable_parallel_tool_use")) == Some(&Json::Bool(true)) {
        chat["parallel_tool_calls"] = json!(false);
    }
    let format = req
        .output_config
        .as_ref()
        .and_then(|c| c.get("format"))
        .or(req.output_format.as_ref());
    if let Some(f) = format.filter(|f| f.get("type").and_then(Json::as_str) == Some("json_schema"))
    {
        chat["response_format"] = json!({"type": "json_schema", "json_schema": {
            "name": "output", "schema": f.get("schema").cloned().unwrap_or(json!({})), "strict": true}});
    }
    if !count_only {
        let max_tokens = req
            .max_tokens
            .ok_or_else(|| bad("max_tokens: Field required"))?;
        chat["max_tokens"] = json!(max_tokens);
        chat["stream"] = json!(req.stream.unwrap_or(false));
        for (k, v) in [
            ("temperature", req.temperature.map(|x| json!(x))),
            ("top_p", req.top_p.map(|x| json!(x))),
            ("top_k", req.top_k.map(|x| json!(x))),
            ("stop", req.stop_sequences.as_ref().map(|x| json!(x))),
        ] {
            if let Some(v) = v {
                chat[k] = v;
            }
        }
    }
    serde_json::from_value(chat).map_err(|e| bad(format!("Invalid request: {e}")))
}

/// Anthropic's stop_reason and stop_sequence for how generation ended.
pub fn stop_reason(
    reason: FinishReason,
    stop: &Option<StopReason>,
    called_tools: bool,
) -> (&'static str, Json) {
    if called_tools {
        return ("tool_use", Json::Null);
    }
    match (reason, stop) {
        (FinishReason::Length, _) => ("max_tokens", Json::Null),
        (_, Some(StopReason::Text(s))) => ("stop_sequence", json!(s)),
        _ => ("end_turn", Json::Null),
    }
}

pub fn tool_use_id() -> String {
    random_id("toolu").replacen('-', "_", 1)
}

/// A tool call's argument string as the `input` object.
pub fn tool_input(arguments: &str) -> Json {
    serde_json::from_str(arguments).unwrap_or_else(|_| json!({}))
}

fn message_json(id: &str, model: &str, c: &Collected) -> Json {
    let mut content = vec![];
    if let Some(r) = &c.reasoning {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if !c.content.is_empty() {
        content.push(json!({"type": "text", "text": c.content}));
    }
    for call in &c.calls {
        content.push(json!({"type": "tool_use", "id": tool_use_id(), "name": call.name, "input": tool_input(&call.arguments)}));
    }
    let (reason, seq) = stop_reason(c.reason, &c.stop_reason, !c.calls.is_empty());
    json!({"id": id, "type": "message", "role": "assistant", "model": model, "content": content,
           "stop_reason": reason, "stop_sequence": seq,
           "usage": {"input_tokens": c.usage.prompt_tokens, "output_tokens": c.usage.completion_tokens}})
}

fn parse(body: &[u8]) -> Result<MessagesRequest, ApiError> {
    parse_body::<MessagesRequest>(body)
}

pub async fn handle(state: Arc<AppState>, body: warp::hyper::body::Bytes) -> warp::reply::Response {
    let started = super::limits::prepare(&state, body, |state, body| {
        let req = parse(body)?;
        let chat = to_chat(&req, false)?;
        let model = req
            .model
            .clone()
            .unwrap_or_else(|| state.model_name().to_string());
        let reuse = Reuse {
            clamp_max_tokens: true,
        };
        chat::prepare_chat(state, chat, reuse).map(|(p, stream)| (p, stream, model))
    })
    .await;
    let (p, stream, model) = match started {
        Ok(x) => x,
        Err(e) => return error_response(e),
    };
    let id = random_id("msg").replacen('-', "_", 1);
    if stream {
        return super::anthropic_sse::stream(p, id, model);
    }
    match chat::collect(p).await {
        Ok(c) => warp::reply::json(&message_json(&id, &model, &c)).into_response(),
        Err(e) => error_response(e),
    }
}

/// `POST /v1/messages/count_tokens`: the rendered prompt's length, `{"input_tokens": N}`.
pub async fn count_tokens(
    state: Arc<AppState>,
    body: warp::hyper::body::Bytes,
) -> warp::reply::Response {
    let counted = super::limits::prepare(&state, body, |state, body| {
        let req = parse(body)?;
        let chat = to_chat(&req, true)?;
        let messages = chat::template_messages(&chat.messages)?;
        let tools = chat.tools.clone().filter(|t| !t.is_empty());
        if let Some(t) = &tools {
            chat::validate_tools(t)?;
        }
        chat::render_prompt(state, &chat, &messages, tools.as_deref()).map(|(p, _)| p.len())
    })
    .await;
    match counted {
        Ok(n) => warp::reply::json(&json!({"input_tokens": n})).into_response(),
        Err(e) => error_response(e),
    }
}

/// 401 in Anthropic's shape (routes use it for /v1/messages).
pub fn unauthorized() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "AuthenticationError",
        "invalid x-api-key: pass the server's API key as `x-api-key: <key>` or `Authorization: Bearer <key>`.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: Json) -> MessagesRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn billing_line_is_dropped_from_blocks_and_strings() {
        let a = req(
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8; cch=ab12;"},
                       {"type": "text", "text": "You are helpful."}]}),
        );
        let b = req(
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
            "system": "x-anthropic-billing-header: cc_version=2.1.333; cch=ffff;\nYou are helpful."}),
        );
        let (ca, cb) = (to_chat(&a, false).unwrap(), to_chat(&b, false).unwrap());
        let sys = |c: &ChatRequest| match &c.messages[0].content {
            Some(super::super::openai::MessageContent::Text(s)) => s.clone(),
            _ => panic!(),
        };
        assert_eq!(sys(&ca), "You are helpful.");
        assert_eq!(sys(&cb), "You are helpful.");
    }

    #[test]
    fn blocks_map_to_chat_messages_in_order() {
        let r = req(json!({"max_tokens": 5, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "sunny"}]}, {"type": "text", "text": "thanks"}]}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}},
                      {"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 100}}));
        let c = to_chat(&r, false).unwrap();
        let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "user"]);
        assert_eq!(c.messages[1].reasoning_content.as_deref(), Some("hmm"));
        let call = &c.messages[1].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.function.name, "get_weather");
        assert_eq!(call.function.arguments, Some(json!({"city": "Paris"})));
        assert_eq!(c.messages[2].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(c.tools.as_ref().unwrap().len(), 1);
        assert_eq!(c.tool_choice, Some(json!("required")));
        assert_eq!(
            c.chat_template_kwargs.as_ref().unwrap()["enable_thinking"],
            json!(true)
        );
    }

    #[test]
    fn tool_choice_none_renders_no_tools_and_named_maps_to_function() {
        let base = json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                          "tools": [{"name": "f", "input_schema": {"type": "object"}}]});
        let mut none = base.clone();
        none["tool_choice"] = json!({"type": "none"});
        let c = to_chat(&req(none), false).unwrap();
        assert!(c.tools.is_none() && c.tool_choice.is_none());
        let mut named = base.clone();
        named["tool_choice"] = json!({"type": "tool", "name": "f"});
        let c = to_chat(&req(named), false).unwrap();
        assert_eq!(
            c.tool_choice,
            Some(json!({"type": "function", "function": {"name": "f"}}))
        );
        let mut bad = base;
        bad["tool_choice"] = json!({"type": "sometimes"});
        assert_eq!(to_chat(&req(bad), false).unwrap_err().status, 400);
    }

    #[test]
    fn errors_use_anthropic_types() {
        let b = error_body(&ApiError::bad_request("x"));
        assert_eq!(b["type"], "error");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(
            error_body(&unauthorized())["error"]["type"],
            "authentication_error"
        );
        assert_eq!(
            error_body(&ApiError::unavailable("loading"))["error"]["type"],
            "overloaded_error"
        );
        let missing = req(json!({"messages": []}));
        assert!(to_chat(&missing, false)
            .unwrap_err()
            .message
            .contains("max_tokens"));
        assert!(to_chat(&missing, true).is_ok());
    }
}
