//! Responses output items and their stream events, built from the chat path's pieces.
//!
//! `Output` turns pieces into items (reasoning, message, function_call) and the events that
//! build them: output_item.added, content_part.added, output_text.delta/.done,
//! reasoning_text.delta/.done, function_call_arguments.delta/.done, content_part.done,
//! output_item.done. `stream` frames them between response.created / response.in_progress and
//! response.completed (or response.incomplete), each with a sequence_number.
use super::chat::{Piece, Prepared};
use super::errors::ApiError;
use super::openai::random_id;
use super::responses::{keep, status_of, usage_json, Meta, ResponseStore};
use super::sse;
use super::tool_parser::ToolDelta;
use laguna_engine::sched::Event;
use serde_json::{json, Value as Json};
use std::sync::Arc;

enum Current {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        index: usize,
        id: String,
        call_id: String,
        name: String,
        args: String,
    },
}

fn item_id(prefix: &str) -> String {
    random_id(prefix).replacen('-', "_", 1)
}

#[derive(Default)]
pub struct Output {
    /// Finished items, in output order.
    pub items: Vec<Json>,
    current: Option<Current>,
    /// Events not yet sent (without sequence numbers).
    events: Vec<Json>,
    /// Generated tokens whose text went to reasoning only.
    pub reasoning_tokens: usize,
}

impl Output {
    fn index(&self) -> usize {
        self.items.len()
    }

    fn emit(&mut self, kind: &str, mut v: Json) {
        v["type"] = json!(kind);
        self.events.push(v);
    }

    /// Finish the open item (its done events) and move it to `items`.
    pub fn close(&mut self) {
        let Some(cur) = self.current.take() else {
            return;
        };
        let oi = self.index();
        let item = match cur {
            Current::Reasoning { id, text } => {
                self.emit(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": oi, "content_index": 0, "text": text}),
                );
                json!({"type": "reasoning", "id": id, "summary": [], "status": "completed",
                       "content": [{"type": "reasoning_text", "text": text}], "encrypted_content": null})
            }
            Current::Message { id, text } => {
                let part =
                    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                self.emit("response.output_text.done", json!({"item_id": id, "output_index": oi, "content_index": 0, "text": text, "logprobs": []}));
                self.emit(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": oi, "content_index": 0, "part": part}),
                );
                json!({"type": "message", "id": id, "role": "assistant", "status": "completed", "content": [part]})
            }
            Current::Call {
                id,
                call_id,
                name,
                args,
                ..
            } => {
                self.emit(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": oi, "name": name, "arguments": args}),
                );
                json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": args, "status": "completed"})
            }
        };
        self.emit(
            "response.output_item.done",
            json!({"output_index": oi, "item": item}),
        );
        self.items.push(item);
    }

    fn open(&mut self, cur: Current) {
        self.close();
        let oi = self.index();
        let item = match &cur {
            Current::Reasoning { id, .. } => {
                json!({"type": "reasoning", "id": id, "summary": [], "content": [], "status": "in_progress"})
            }
            Current::Message { id, .. } => {
                json!({"type": "message", "id": id, "role": "assistant", "status": "in_progress", "content": []})
            }
            Current::Call {
                id, call_id, name, ..
            } => {
                json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": "", "status": "in_progress"})
            }
        };
        self.emit(
            "response.output_item.added",
            json!({"output_index": oi, "item": item}),
        );
        if let Current::Message { id, .. } = &cur {
            let part =
                json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
            self.emit(
                "response.content_part.added",
                json!({"item_id": id, "output_index": oi, "content_index": 0, "part": part}),
            );
        }
        self.current = Some(cur);
    }

    fn reasoning(&mut self, delta: String) {
        if !matches!(self.current, Some(Current::Reasoning { .. })) {
            self.open(Current::Reasoning {
                id: item_id("rs"),
                text: String::new(),
            });
        }
        let oi = self.index();
        if let Some(Current::Reasoning { id, text }) = &mut self.current {
            text.push_str(&delta);
            let ev = json!({"item_id": id, "output_index": oi, "content_index": 0, "delta": delta});
            self.emit("response.reasoning_text.delta", ev);
        }
    }

    fn text(&mut self, delta: String) {
        if !matches!(self.current, Some(Current::Message { .. })) {
            self.open(Current::Message {
                id: item_id("msg"),
                text: String::new(),
            });
        }
        let oi = self.index();
        if let Some(Current::Message { id, text }) = &mut self.current {
            text.push_str(&delta);
            let ev = json!({"item_id": id, "output_index": oi, "content_index": 0, "delta": delta, "logprobs": []});
            self.emit("response.output_text.delta", ev);
        }
    }

    fn tool(&mut self, d: ToolDelta) {
        match d {
            ToolDelta::Start { index, name, .. } => self.open(Current::Call {
                index,
                id: item_id("fc"),
                call_id: item_id("call"),
                name,
                args: String::new(),
            }),
            ToolDelta::Args { index, fragment } => {
                let oi = self.index();
                if let Some(Current::Call {
                    index: i, id, args, ..
                }) = &mut self.current
                {
                    if *i == index {
                        args.push_str(&fragment);
                        let ev = json!({"item_id": id, "output_index": oi, "delta": fragment});
                        self.emit("response.function_call_arguments.delta", ev);
                    }
                }
            }
            ToolDelta::Content(_) => {}
        }
    }

    /// Feed one piece; `tokens` is how many generated tokens it came from.
    pub fn piece(&mut self, p: Piece, tokens: usize) {
        if !p.reasoning.is_empty() && p.content.is_empty() && p.tool.is_empty() {
            self.reasoning_tokens += tokens;
        }
        if !p.reasoning.is_empty() {
            self.reasoning(p.reasoning);
        }
        if !p.content.is_empty() {
            self.text(p.content);
        }
        for d in p.tool {
            self.tool(d);
        }
    }

    pub fn take_events(&mut self) -> Vec<Json> {
        std::mem::take(&mut self.events)
    }

    /// The finished output as one chat assistant message (what `previous_response_id` replays).
    pub fn assistant_message(&self) -> Json {
        let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), vec![]);
        for it in &self.items {
            match it["type"].as_str() {
                Some("reasoning") => reasoning += it["content"][0]["text"].as_str().unwrap_or(""),
                Some("message") => content += it["content"][0]["text"].as_str().unwrap_or(""),
                Some("function_call") => calls
                    .push(json!({"id": it["call_id"], "type": "function",
                    "function": {"name": it["name"], "arguments": it["arguments"]}})),
                _ => {}
            }
        }
        let mut m = json!({"role": "assistant", "content": content});
        if !reasoning.is_empty() {
            m["reasoning_content"] = json!(reasoning);
        }
        if !calls.is_empty() {
            m["tool_calls"] = json!(calls);
        }
        m
    }
}

pub(super) fn stream(
    mut p: Prepared,
    meta: Meta,
    conversation: Vec<Json>,
    store: Arc<ResponseStore>,
) -> warp::reply::Response {
    let (tx, resp) = sse::channel();
    tokio::spawn(async move {
        let mut seq = 0u64;
        let mut send = |mut v: Json| {
            v["sequence_number"] = json!(seq);
            seq += 1;
            v
        };
        let created = meta.response("in_progress", &[], None, None);
        for kind in ["response.created", "response.in_progress"] {
            if !tx
                .event(kind, &send(json!({"type": kind, "response": created})))
                .await
            {
                return;
            }
        }
        let mut out = Output::default();
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
            let done = match ev {
                Event::Delta { ids, text, .. } => {
                    out.piece(p.assembler.push(&text), ids.len());
                    None
                }
                Event::Error(e) => {
                    let e = ApiError::internal(e);
                    let v = json!({"type": "error", "code": "server_error", "message": e.message, "param": null});
                    let _ = tx.event("error", &send(v)).await;
                    return;
                }
                Event::Finished { reason, usage, .. } => {
                    out.piece(p.assembler.finish(), 0);
                    out.close();
                    let u = usage_json(
                        usage.prompt_tokens,
                        usage.completion_tokens,
                        out.reasoning_tokens,
                    );
                    Some(meta.response(status_of(reason), &out.items, Some(u), Some(reason)))
                }
            };
            for v in out.take_events() {
                let kind = v["type"].as_str().unwrap_or("").to_string();
                if !tx.event(&kind, &send(v)).await {
                    return;
                }
            }
            if let Some(r) = done {
                keep(&store, &meta, conversation, &out, &r);
                let kind = if r["status"] == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                let _ = tx
                    .event(kind, &send(json!({"type": kind, "response": r})))
                    .await;
                return;
            }
        }
    });
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(reasoning: &str, content: &str, tool: Vec<ToolDelta>) -> Piece {
        Piece {
            reasoning: reasoning.into(),
            content: content.into(),
            tool,
        }
    }

    #[test]
    fn items_and_events_follow_the_pieces() {
        let mut o = Output::default();
        o.piece(piece("hm", "", vec![]), 2);
        o.piece(piece("m", "Hi", vec![]), 1);
        let start = ToolDelta::Start {
            index: 0,
            id: "x".into(),
            name: "f".into(),
        };
        let args = |s: &str| ToolDelta::Args {
            index: 0,
            fragment: s.into(),
        };
        o.piece(piece("", "", vec![start, args("{\"a\": "), args("1}")]), 3);
        o.close();
        let kinds: Vec<String> = o
            .take_events()
            .iter()
            .map(|e| e["type"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            kinds,
            [
                "response.output_item.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done"
            ]
        );
        assert_eq!(o.items.len(), 3);
        assert_eq!(o.items[0]["content"][0]["text"], "hmm");
        assert_eq!(o.items[1]["content"][0]["text"], "Hi");
        assert_eq!(o.items[2]["arguments"], "{\"a\": 1}");
        assert_eq!(o.reasoning_tokens, 2);
        let m = o.assistant_message();
        assert_eq!(
            (m["content"].as_str(), m["reasoning_content"].as_str()),
            (Some("Hi"), Some("hmm"))
        );
        assert_eq!(m["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(m["tool_calls"][0]["id"], o.items[2]["call_id"]);
    }
}
