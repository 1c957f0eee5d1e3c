//! `POST /v1/completions`: raw prompts (text, list of texts, token ids, lists of token ids).
use super::errors::ApiError;
use super::limits::MAX_PROMPTS;
use super::openai::{
    now_secs, parse_body, random_id, usage_json, validate_common, CompletionRequest, PromptField,
};
use super::sse;
use super::state::{clamp, AppState};
use laguna_engine::sched::{Event, FinishReason, GenRequest, RequestStream, TokenLogprob};
use serde_json::{json, Map, Value as Json};
use std::sync::Arc;
use tokio::sync::mpsc;
use warp::Reply;

/// vLLM's default for completions.
const DEFAULT_MAX_TOKENS: usize = 16;

struct Choice {
    stream: RequestStream,
    echo: String,
}

use super::chat::stop_reason_json;

fn finish_str(r: FinishReason) -> &'static str {
    super::chat::finish_reason(r, false)
}

/// Legacy logprobs: tokens, token_logprobs, top_logprobs (token → logprob), text_offset.
#[derive(Default)]
struct LegacyLogprobs {
    tokens: Vec<Json>,
    token_logprobs: Vec<Json>,
    top: Vec<Json>,
    offsets: Vec<Json>,
    offset: usize,
}

impl LegacyLogprobs {
    fn add(&mut self, state: &AppState, lps: &[TokenLogprob]) {
        for l in lps {
            let t = state.token_text(l.id);
            self.offsets.push(json!(self.offset));
            self.offset += t.len();
            self.tokens.push(json!(t));
            self.token_logprobs.push(json!(clamp(l.logprob)));
            let mut m = Map::new();
            for &(id, lp) in &l.top {
                m.insert(state.token_text(id), json!(clamp(lp)));
            }
            self.top.push(Json::Object(m));
        }
    }
    fn take(&mut self) -> Json {
        let offset = self.offset;
        let v = json!({"tokens": std::mem::take(&mut self.tokens), "token_logprobs": std::mem::take(&mut self.token_logprobs),
                       "top_logprobs": std::mem::take(&mut self.top), "text_offset": std::mem::take(&mut self.offsets)});
        self.offset = offset;
        v
    }
}

fn prepare(
    state: &AppState,
    body: &[u8],
) -> Result<(Vec<Choice>, bool, bool, Option<usize>), ApiError> {
    let req: CompletionRequest = parse_body(body)?;
    state.check_model(req.common.model.as_deref())?;
    state.check_ready()?;
    let v = validate_common(&req.common, req.common.max_tokens, &state.defaults)?;
    let logprobs = match req.logprobs {
        Some(n) if !(0..=20).contains(&n) => {
            return Err(ApiError::bad_request(format!(
                "logprobs must be between 0 and 20, got {n}."
            ))
            .with_param("logprobs"))
        }
        n => n.map(|n| n as usize),
    };
    let echo = req.echo.unwrap_or(false);
    let count = match &req.prompt {
        PromptField::Texts(ts) => ts.len(),
        PromptField::IdLists(l) => l.len(),
        PromptField::Text(_) | PromptField::Ids(_) => 1,
    };
    if count > MAX_PROMPTS {
        return Err(ApiError::bad_request(format!(
            "The request has {count} prompts; at most {MAX_PROMPTS} are allowed in one request. Send them in several requests."
        ))
        .with_param("prompt"));
    }
    let prompts: Vec<(Vec<u32>, String)> = match &req.prompt {
        PromptField::Text(t) => vec![(state.encode(t, true)?, t.clone())],
        PromptField::Texts(ts) => ts
            .iter()
            .map(|t| Ok((state.encode(t, true)?, t.clone())))
            .collect::<Result<_, ApiError>>()?,
        PromptField::Ids(ids) => vec![(ids.clone(), String::new())],
        PromptField::IdLists(l) => l.iter().map(|ids| (ids.clone(), String::new())).collect(),
    };
    if prompts.is_empty() || prompts.iter().any(|(p, _)| p.is_empty()) {
        return Err(ApiError::bad_request(
            "The prompt is empty: give text or at least one token id.",
        )
        .with_param("prompt"));
    }
    let demand = super::constrain::demand(None, None, req.response_format.as_ref(), None)?;
    let vocab = state.tokenizer.vocab_size() as u32;
    let mut choices = vec![];
    for (ids, text) in prompts {
        if let Some(t) = ids.iter().find(|&&t| t >= vocab) {
            return Err(ApiError::bad_request(format!(
                "Token id {t} is out of vocabulary (size {vocab})."
            ))
            .with_param("prompt"));
        }
        let max_tokens = state
            .resolve_max_tokens(Some(v.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)), ids.len())?;
        let echo_text = if !echo {
            String::new()
        } else if text.is_empty() {
            state.tokenizer.decode(&ids, true).unwrap_or_default()
        } else {
            text
        };
        let gen = GenRequest {
            prompt: ids,
            max_tokens,
            sampling: v.sampling.clone(),
            ignore_eos: v.ignore_eos,
            stop_token_ids: v.stop_token_ids.clone(),
            stop: v.stop.clone(),
            logprobs,
            skip_special_tokens: req.common.skip_special_tokens.unwrap_or(true),
            constraint: match &demand {
                Some(d) => Some(super::constrain::compile(state, d, false)?),
                None => None,
            },
        };
        choices.push(Choice {
            stream: state.submit(gen)?,
            echo: echo_text,
        });
    }
    Ok((choices, v.stream, v.include_usage, logprobs))
}

pub async fn handle(state: Arc<AppState>, body: warp::hyper::body::Bytes) -> warp::reply::Response {
    let (choices, stream, include_usage, logprobs) =
        match super::limits::prepare(&state, body, prepare).await {
            Ok(x) => x,
            Err(e) => return e.into_response(),
        };
    let id = random_id("cmpl");
    let created = now_secs();
    let model = state.model_name().to_string();
    if stream {
        return stream_response(
            state,
            choices,
            id,
            created,
            model,
            include_usage,
            logprobs.is_some(),
        );
    }
    let (mut total_p, mut total_c, mut total_cached) = (0, 0, 0);
    let mut out = vec![];
    for (i, mut c) in choices.into_iter().enumerate() {
        let mut text = c.echo.clone();
        let mut lp = LegacyLogprobs::default();
        loop {
            match c.stream.next().await {
                Some(Event::Delta {
                    text: t,
                    logprobs: l,
                    ..
                }) => {
                    text += &t;
                    lp.add(&state, &l);
                }
                Some(Event::Finished {
                    reason,
                    stop_reason,
                    usage,
                }) => {
                    total_p += usage.prompt_tokens;
                    total_c += usage.completion_tokens;
                    total_cached += usage.cached_tokens;
                    out.push(json!({"index": i, "text": text, "logprobs": if logprobs.is_some() { lp.take() } else { Json::Null },
                                    "finish_reason": finish_str(reason), "stop_reason": stop_reason_json(&stop_reason)}));
                    break;
                }
                Some(Event::Error(e)) => return ApiError::internal(e).into_response(),
                None => {
                    return ApiError::internal("the request ended without a result").into_response()
                }
            }
        }
    }
    let v = json!({"id": id, "object": "text_completion", "created": created, "model": model, "choices": out,
                   "usage": usage_json(total_p, total_c, total_cached)});
    warp::reply::json(&v).into_response()
}

enum Tagged {
    Ev(usize, Event),
}

fn stream_response(
    state: Arc<AppState>,
    choices: Vec<Choice>,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    want_lp: bool,
) -> warp::reply::Response {
    let (tx, resp) = sse::channel();
    tokio::spawn(async move {
        let n = choices.len();
        // Each choice's stream is read by its own task; they all feed one channel.
        let (mtx, mut mrx) = mpsc::channel::<Tagged>(64);
        let mut echoes = vec![];
        for (i, mut c) in choices.into_iter().enumerate() {
            echoes.push(std::mem::take(&mut c.echo));
            let mtx = mtx.clone();
            tokio::spawn(async move {
                loop {
                    let ev = tokio::select! {
                        ev = c.stream.next() => ev,
                        _ = mtx.closed() => return,
                    };
                    let Some(ev) = ev else { return };
                    let last = !matches!(ev, Event::Delta { .. });
                    if mtx.send(Tagged::Ev(i, ev)).await.is_err() || last {
                        return;
                    }
                }
            });
        }
        drop(mtx);
        let chunk = |i: usize, text: String, lp: Json, finish: Json, stop_reason: Json| {
            let mut c = json!({"id": id, "object": "text_completion", "created": created, "model": model,
                               "choices": [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish, "stop_reason": stop_reason}]});
            if include_usage {
                c["usage"] = Json::Null;
            }
            c
        };
        for (i, e) in echoes.iter().enumerate() {
            if !e.is_empty()
                && !tx
                    .data(&chunk(i, e.clone(), Json::Null, Json::Null, Json::Null))
                    .await
            {
                return;
            }
        }
        let mut lps: Vec<LegacyLogprobs> = (0..n).map(|_| LegacyLogprobs::default()).collect();
        let (mut finished, mut total_p, mut total_c, mut total_cached) = (0, 0, 0, 0);
        while finished < n {
            let msg = tokio::select! {
                m = mrx.recv() => m,
                _ = tx.closed() => return,
                _ = tokio::time::sleep(sse::KEEP_ALIVE) => {
                    if !tx.keep_alive().await { return; }
                    continue;
                }
            };
            let Some(Tagged::Ev(i, ev)) = msg else { return };
            let ok = match ev {
                Event::Delta { text, logprobs, .. } => {
                    let lp = if want_lp {
                        lps[i].add(&state, &logprobs);
                        lps[i].take()
                    } else {
                        Json::Null
                    };
                    if text.is_empty() && logprobs.is_empty() {
                        true
                    } else {
                        tx.data(&chunk(i, text, lp, Json::Null, Json::Null)).await
                    }
                }
                Event::Finished {
                    reason,
                    stop_reason,
                    usage,
                } => {
                    finished += 1;
                    total_p += usage.prompt_tokens;
                    total_c += usage.completion_tokens;
                    total_cached += usage.cached_tokens;
                    tx.data(&chunk(
                        i,
                        String::new(),
                        Json::Null,
                        json!(finish_str(reason)),
                        stop_reason_json(&stop_reason),
                    ))
                    .await
                }
                Event::Error(e) => {
                    let _ = tx.data(&ApiError::internal(e).body()).await;
                    let _ = tx.done().await;
                    return;
                }
            };
            if !ok {
                return;
            }
        }
        if include_usage {
            let u = json!({"id": id, "object": "text_completion", "created": created, "model": model, "choices": [],
                           "usage": usage_json(total_p, total_c, total_cached)});
            if !tx.data(&u).await {
                return;
            }
        }
        let _ = tx.done().await;
    });
    resp
}
