//! OpenAI Responses API: `POST /v1/responses` and `GET /v1/responses/{id}`.
//!
//! `input` (a string or items) becomes a chat-completions request and runs through the chat path;
//! its output becomes Responses output items (reasoning, message, function_call), built the same
//! way streamed or not (`responses_sse::Output`). Responses are kept in memory for
//! `previous_response_id` and GET unless `store` is false (a bounded LRU, `ResponseStore`).
//! docs/design/agent-apis.md has the mapping tables.
use super::chat::{self, Reuse};
use super::errors::ApiError;
use super::openai::{now_secs, parse_body, random_id, ChatRequest};
use super::responses_sse::{self, Output};
use super::state::AppState;
use laguna_engine::sched::{Event, FinishReason};
use serde::Deserialize;
use serde_json::{json, Map, Value as Json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use warp::http::StatusCode;
use warp::Reply;

/// How many responses `previous_response_id` can reach back to.
pub const STORE_CAPACITY: usize = 1024;

#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Option<Input>,
    pub instructions: Option<String>,
    pub tools: Option<Vec<Json>>,
    pub tool_choice: Option<Json>,
    pub text: Option<Json>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub max_output_tokens: Option<i64>,
    pub stream: Option<bool>,
    pub store: Option<bool>,
    pub previous_response_id: Option<String>,
    pub reasoning: Option<Json>,
    pub parallel_tool_calls: Option<bool>,
    pub metadata: Option<Json>,
    pub seed: Option<i64>,
    pub chat_template_kwargs: Option<Map<String, Json>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Items(Vec<Json>),
}

/// A kept response: the conversation it ends (chat messages, instructions excluded, as
/// `previous_response_id` continues it) and the response object (for GET).
pub struct Stored {
    pub conversation: Vec<Json>,
    pub response: Json,
}

/// Least-recently-used map of response id → `Stored`, at most `capacity` entries.
pub struct ResponseStore {
    inner: Mutex<(u64, HashMap<String, (u64, Arc<Stored>)>)>,
    capacity: usize,
}

impl ResponseStore {
    pub fn new(capacity: usize) -> ResponseStore {
        ResponseStore {
            inner: Mutex::new((0, HashMap::new())),
            capacity,
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (tick, map) = &mut *g;
        *tick += 1;
        let e = map.get_mut(id)?;
        e.0 = *tick;
        Some(e.1.clone())
    }

    pub fn put(&self, id: String, s: Stored) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (tick, map) = &mut *g;
        *tick += 1;
        map.insert(id, (*tick, Arc::new(s)));
        while map.len() > self.capacity {
            let oldest = map
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => map.remove(&k),
                None => break,
            };
        }
    }
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(msg)
}

/// Text of a content field: a string, or the text of its text parts.
fn content_text(v: &Json, at: &str) -> Result<String, ApiError> {
    match v {
        Json::String(s) => Ok(s.clone()),
        Json::Null => Ok(String::new()),
        Json::Array(parts) => {
            let mut out = vec![];
            for (k, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Json::as_str) {
                    Some(
                        "input_text" | "output_text" | "text" | "refusal" | "reasoning_text"
                        | "summary_text",
                    ) => {
                        let t = p.get("text").or_else(|| p.get("refusal"));
                        out.push(t.and_then(Json::as_str).unwrap_or("").to_string());
                    }
                    other => {
                        return Err(bad(format!(
                            "{at}.content[{k}] is of type `{}`; this model takes text only.",
                            other.unwrap_or("?")
                        )))
                    }
                }
            }
            Ok(out.join("\n"))
        }
        _ => Err(bad(format!(
            "{at}.content must be a string or a list of parts."
        ))),
    }
}

/// Input items as chat messages. Reasoning is attached to the assistant turn that follows it;
/// function calls join the assistant message before them.
pub fn items_to_messages(items: &[Json], out: &mut Vec<Json>) -> Result<(), ApiError> {
    let mut reasoning: Option<String> = None;
    let mut open_assistant = false;
    for (i, it) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = it.get("type").and_then(Json::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = it.get("role").and_then(Json::as_str).unwrap_or("");
                if !matches!(role, "user" | "assistant" | "system" | "developer") {
                    return Err(bad(format!("{at}.role `{role}` is not supported (use user, assistant, system or developer).")));
                }
                let text = content_text(it.get("content").unwrap_or(&Json::Null), &at)?;
                let mut m = json!({"role": role, "content": text});
                if role == "assistant" {
                    if let Some(r) = reasoning.take() {
                        m["reasoning_content"] = json!(r);
                    }
                }
                open_assistant = role == "assistant";
                out.push(m);
            }
            "function_call" => {
                let name = it
                    .get("name")
                    .and_then(Json::as_str)
                    .ok_or_else(|| bad(format!("{at}.name: Field required")))?;
                let call = json!({"id": it.get("call_id").cloned().unwrap_or(Json::Null), "type": "function",
                                  "function": {"name": name, "arguments": it.get("arguments").cloned().unwrap_or(json!("{}"))}});
                if !open_assistant {
                    let mut m = json!({"role": "assistant", "content": ""});
                    if let Some(r) = reasoning.take() {
                        m["reasoning_content"] = json!(r);
                    }
                    out.push(m);
                    open_assistant = true;
                }
                let last = out
                    .last_mut()
                    .expect("an assistant message was just ensured");
                match last.get_mut("tool_calls").and_then(Json::as_array_mut) {
                    Some(calls) => calls.push(call),
                    None => last["tool_calls"] = json!([call]),
                }
            }
            "function_call_output" => {
                let output = content_text(it.get("output").unwrap_or(&Json::Null), &at)?;
                out.push(json!({"role": "tool", "tool_call_id": it.get("call_id").cloned().unwrap_or(Json::Null), "content": output}));
                open_assistant = false;
            }
            "reasoning" => {
                let text = match it.get("content").filter(|c| !c.is_null()) {
                    Some(c) => content_text(c, &at)?,
                    None => content_text(it.get("summary").unwrap_or(&Json::Null), &at)?,
                };
                reasoning = Some(text);
            }
            other => {
                tracing::warn!("/v1/responses: {at} of type `{other}` is not supported; left out");
            }
        }
    }
    Ok(())
}

/// Function tools in chat shape; other tool types are left out with a warning.
fn convert_tools(tools: &[Json]) -> Result<Vec<Json>, ApiError> {
    let mut out = vec![];
    for (i, t) in tools.iter().enumerate() {
        match t.get("type").and_then(Json::as_str) {
            Some("function") => {
                let name = t
                    .get("name")
                    .and_then(Json::as_str)
                    .ok_or_else(|| bad(format!("tools[{i}].name: Field required")))?;
                out.push(super::openai::chat_function_tool(
                    name,
                    t.get("description"),
                    t.get("parameters"),
                ));
            }
            other => tracing::warn!(
                "/v1/responses: tools[{i}] of type `{}` is not supported; left out",
                other.unwrap_or("?")
            ),
        }
    }
    Ok(out)
}

/// Responses `tool_choice` as chat's; `None` for "none" (tools are then not rendered).
fn convert_tool_choice(c: &Json) -> Result<Option<Json>, ApiError> {
    Ok(Some(match c {
        Json::String(s) if s == "none" => return Ok(None),
        Json::String(s) if s == "auto" || s == "required" => c.clone(),
        Json::Object(o) => match o.get("type").and_then(Json::as_str) {
            Some("function") => {
                let name = o.get("name").and_then(Json::as_str).ok_or_else(|| bad("tool_choice.name: Field required"))?;
                json!({"type": "function", "function": {"name": name}})
            }
            Some("allowed_tools") => {
                json!(o.get("mode").and_then(Json::as_str).unwrap_or("auto"))
            }
            other => {
                tracing::warn!("/v1/responses: tool_choice of type `{}` is not supported; using auto", other.unwrap_or("?"));
                json!("auto")
            }
        },
        _ => return Err(bad("tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}.")),
    }))
}

/// `text.format` as chat's `response_format` (None for plain text).
fn convert_format(text: Option<&Json>) -> Result<Option<Json>, ApiError> {
    let Some(f) = text.and_then(|t| t.get("format")) else {
        return Ok(None);
    };
    match f.get("type").and_then(Json::as_str) {
        Some("text") | None => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut s = json!({"name": f.get("name").cloned().unwrap_or(json!("output")),
                               "schema": f.get("schema").cloned().unwrap_or(json!({}))});
            for k in ["strict", "description"] {
                if let Some(v) = f.get(k) {
                    s[k] = v.clone();
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": s})))
        }
        Some(other) => Err(bad(format!(
            "text.format.type `{other}` is not supported (use text, json_object or json_schema)."
        ))),
    }
}

/// The conversation (without instructions) and the chat request for a Responses request.
pub fn to_chat(
    req: &ResponsesRequest,
    store: &ResponseStore,
) -> Result<(Vec<Json>, ChatRequest), ApiError> {
    let mut conversation = match &req.previous_response_id {
        None => vec![],
        Some(id) => match store.get(id) {
            Some(s) => s.conversation.clone(),
            None => {
                return Err(ApiError::not_found(format!(
                    "Previous response with id '{id}' not found."
                ))
                .with_param("previous_response_id"))
            }
        },
    };
    match &req.input {
        Some(Input::Text(s)) => conversation.push(json!({"role": "user", "content": s})),
        Some(Input::Items(items)) => items_to_messages(items, &mut conversation)?,
        None => {}
    }
    let mut messages = vec![];
    if let Some(i) = req.instructions.as_ref().filter(|i| !i.is_empty()) {
        messages.push(json!({"role": "system", "content": i}));
    }
    messages.extend(conversation.iter().cloned());
    let mut chat = json!({"messages": messages, "stream": req.stream.unwrap_or(false)});
    let choice = req
        .tool_choice
        .as_ref()
        .map(convert_tool_choice)
        .transpose()?;
    let tools = convert_tools(req.tools.as_deref().unwrap_or_default())?;
    let tools_off = matches!(choice, Some(None));
    if !tools.is_empty() && !tools_off {
        chat["tools"] = json!(tools);
        if let Some(Some(c)) = choice {
            chat["tool_choice"] = c;
        }
    }
    if let Some(f) = convert_format(req.text.as_ref())? {
        chat["response_format"] = f;
    }
    if let Some(e) = req
        .reasoning
        .as_ref()
        .and_then(|r| r.get("effort"))
        .and_then(Json::as_str)
    {
        chat["reasoning_effort"] = json!(e);
    }
    for (k, v) in [
        ("model", req.model.as_ref().map(|x| json!(x))),
        ("max_tokens", req.max_output_tokens.map(|x| json!(x))),
        ("temperature", req.temperature.map(|x| json!(x))),
        ("top_p", req.top_p.map(|x| json!(x))),
        ("top_k", req.top_k.map(|x| json!(x))),
        ("seed", req.seed.map(|x| json!(x))),
        (
            "parallel_tool_calls",
            req.parallel_tool_calls.map(|x| json!(x)),
        ),
        (
            "chat_template_kwargs",
            req.chat_template_kwargs.as_ref().map(|x| json!(x)),
        ),
    ] {
        if let Some(v) = v {
            chat[k] = v;
        }
    }
    let chat = serde_json::from_value(chat).map_err(|e| bad(format!("Invalid request: {e}")))?;
    Ok((conversation, chat))
}

/// What a response object repeats from its request.
pub struct Meta {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    pub echo: Json,
    pub store: bool,
}

impl Meta {
    fn new(state: &AppState, req: &ResponsesRequest) -> Meta {
        let echo = json!({
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata.clone().unwrap_or(json!({})),
            "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.as_ref().and_then(|r| r.get("effort")).cloned().unwrap_or(Json::Null),
                          "summary": req.reasoning.as_ref().and_then(|r| r.get("summary")).cloned().unwrap_or(Json::Null)},
            "store": req.store.unwrap_or(true),
            "temperature": req.temperature,
            "text": req.text.clone().unwrap_or(json!({"format": {"type": "text"}})),
            "tool_choice": req.tool_choice.clone().unwrap_or(json!("auto")),
            "tools": req.tools.clone().unwrap_or_default(),
            "top_p": req.top_p,
        });
        Meta {
            id: random_id("resp").replacen('-', "_", 1),
            created_at: now_secs(),
            model: req
                .model
                .clone()
                .unwrap_or_else(|| state.model_name().to_string()),
            echo,
            store: req.store.unwrap_or(true),
        }
    }

    /// The response object at some stage: `in_progress` (no usage yet), `completed`, `incomplete`.
    pub fn response(
        &self,
        status: &str,
        output: &[Json],
        usage: Option<Json>,
        reason: Option<FinishReason>,
    ) -> Json {
        let mut r = json!({"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "error": null, "incomplete_details": null, "model": self.model, "output": output,
            "truncation": "disabled", "usage": usage, "user": null});
        if reason == Some(FinishReason::Length) {
            r["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        if let (Json::Object(r), Json::Object(e)) = (&mut r, &self.echo) {
            r.extend(e.clone());
        }
        r
    }
}

pub fn usage_json(prompt: usize, completion: usize, reasoning: usize) -> Json {
    json!({"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
           "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": reasoning},
           "total_tokens": prompt + completion})
}

pub fn status_of(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "incomplete",
        _ => "completed",
    }
}

/// Keep a finished response (unless `store: false`): the conversation grows by its output.
pub fn keep(
    store: &ResponseStore,
    meta: &Meta,
    mut conversation: Vec<Json>,
    out: &Output,
    response: &Json,
) {
    if meta.store {
        conversation.push(out.assistant_message());
        store.put(
            meta.id.clone(),
            Stored {
                conversation,
                response: response.clone(),
            },
        );
    }
}

async fn complete(
    store: &ResponseStore,
    meta: &Meta,
    conversation: Vec<Json>,
    mut p: chat::Prepared,
) -> Result<Json, ApiError> {
    let mut out = Output::default();
    loop {
        match p.stream.next().await {
            None => return Err(ApiError::internal("the request ended without a result")),
            Some(Event::Error(e)) => return Err(ApiError::internal(e)),
            Some(Event::Delta { ids, text, .. }) => {
                out.piece(p.assembler.push(&text), ids.len());
            }
            Some(Event::Finished { reason, usage, .. }) => {
                out.piece(p.assembler.finish(), 0);
                out.close();
                let u = usage_json(
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    out.reasoning_tokens,
                );
                let r = meta.response(status_of(reason), &out.items, Some(u), Some(reason));
                keep(store, meta, conversation, &out, &r);
                return Ok(r);
            }
        }
    }
}

pub async fn handle(
    state: Arc<AppState>,
    store: Arc<ResponseStore>,
    body: warp::hyper::body::Bytes,
) -> warp::reply::Response {
    let kept = store.clone();
    let started = super::limits::prepare(&state, body, move |state, body| {
        let req = parse_body::<ResponsesRequest>(body)?;
        let (conversation, chat) = to_chat(&req, &kept)?;
        let meta = Meta::new(state, &req);
        chat::prepare_chat(state, chat, Reuse::default())
            .map(|(p, stream)| (p, stream, meta, conversation))
    })
    .await;
    let (p, stream, meta, conversation) = match started {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    if stream {
        return responses_sse::stream(p, meta, conversation, store);
    }
    match complete(&store, &meta, conversation, p).await {
        Ok(v) => warp::reply::json(&v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/responses/{id}`: a kept response.
pub fn get(store: &ResponseStore, id: &str) -> warp::reply::Response {
    match store.get(id) {
        Some(s) => warp::reply::json(&s.response).into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            format!("Response with id '{id}' not found."),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: Json) -> ResponsesRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn items_become_chat_turns() {
        let r = req(json!({"instructions": "Be brief.", "input": [
            {"role": "user", "content": "weather?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]}],
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
                      {"type": "web_search"}],
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}}}));
        let store = ResponseStore::new(4);
        let (conv, c) = to_chat(&r, &store).unwrap();
        assert_eq!(conv.len(), 4);
        let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(c.messages[2].reasoning_content.as_deref(), Some("hmm"));
        let call = &c.messages[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!(
            (call.id.as_deref(), call.function.name.as_str()),
            (Some("call_1"), "get_weather")
        );
        assert_eq!(c.messages[3].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(c.tools.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn previous_response_continues_and_store_is_lru() {
        let store = ResponseStore::new(2);
        let conv = vec![
            json!({"role": "user", "content": "a"}),
            json!({"role": "assistant", "content": "b"}),
        ];
        store.put(
            "r1".into(),
            Stored {
                conversation: conv,
                response: json!({}),
            },
        );
        let r = req(json!({"previous_response_id": "r1", "input": "c"}));
        let (conv, c) = to_chat(&r, &store).unwrap();
        assert_eq!(conv.len(), 3);
        assert_eq!(c.messages.len(), 3);
        let missing = req(json!({"previous_response_id": "nope", "input": "c"}));
        assert_eq!(to_chat(&missing, &store).unwrap_err().status, 404);
        store.put(
            "r2".into(),
            Stored {
                conversation: vec![],
                response: json!({}),
            },
        );
        assert!(store.get("r1").is_some()); // r1 is now more recent than r2
        store.put(
            "r3".into(),
            Stored {
                conversation: vec![],
                response: json!({}),
            },
        );
        assert!(store.get("r2").is_none());
        assert!(store.get("r1").is_some() && store.get("r3").is_some());
    }

    #[test]
    fn tool_choice_none_drops_tools() {
        let r = req(json!({"input": "x", "tool_choice": "none",
                           "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}));
        let (_, c) = to_chat(&r, &ResponseStore::new(1)).unwrap();
        assert!(c.tools.is_none() && c.tool_choice.is_none());
        let r = req(
            json!({"input": "x", "tool_choice": {"type": "function", "name": "f"},
                           "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}),
        );
        let (_, c) = to_chat(&r, &ResponseStore::new(1)).unwrap();
        assert_eq!(
            c.tool_choice,
            Some(json!({"type": "function", "function": {"name": "f"}}))
        );
    }
}
