//! Streaming `/v1/messages`: Anthropic's event sequence over the chat path's pieces.
//!
//! message_start, ping, then per content block content_block_start / content_block_delta
//! (thinking_delta, text_delta, input_json_delta) / content_block_stop, then message_delta
//! (stop_reason, usage) and message_stop. Pings also keep an idle connection alive.
use super::anthropic::{error_body, stop_reason, tool_use_id};
use super::chat::{Piece, Prepared};
use super::errors::ApiError;
use super::sse::{self, SseSender};
use super::tool_parser::ToolDelta;
use laguna_engine::sched::Event;
use serde_json::{json, Value as Json};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Block {
    Thinking,
    Text,
    ToolUse(usize),
}

/// Turns pieces into events; tracks the open content block and its index.
#[derive(Default)]
pub(super) struct Blocks {
    open: Option<Block>,
    next_index: usize,
    called_tools: bool,
}

impl Blocks {
    fn index(&self) -> usize {
        self.next_index - 1
    }

    fn close(&mut self, out: &mut Vec<(&'static str, Json)>) {
        if self.open.take().is_some() {
            out.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": self.index()}),
            ));
        }
    }

    fn start(&mut self, b: Block, block: Json, out: &mut Vec<(&'static str, Json)>) {
        self.close(out);
        out.push(("content_block_start", json!({"type": "content_block_start", "index": self.next_index, "content_block": block})));
        self.open = Some(b);
        self.next_index += 1;
    }

    fn delta(&self, delta: Json, out: &mut Vec<(&'static str, Json)>) {
        out.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.index(), "delta": delta}),
        ));
    }

    /// The events for one piece (reasoning, then text, then tool calls).
    pub fn piece(&mut self, p: Piece) -> Vec<(&'static str, Json)> {
        let mut out = vec![];
        if !p.reasoning.is_empty() {
            if self.open != Some(Block::Thinking) {
                let b = json!({"type": "thinking", "thinking": "", "signature": ""});
                self.start(Block::Thinking, b, &mut out);
            }
            self.delta(
                json!({"type": "thinking_delta", "thinking": p.reasoning}),
                &mut out,
            );
        }
        if !p.content.is_empty() {
            if self.open != Some(Block::Text) {
                self.start(Block::Text, json!({"type": "text", "text": ""}), &mut out);
            }
            self.delta(json!({"type": "text_delta", "text": p.content}), &mut out);
        }
        for d in p.tool {
            match d {
                ToolDelta::Start { index, name, .. } => {
                    self.called_tools = true;
                    let b =
                        json!({"type": "tool_use", "id": tool_use_id(), "name": name, "input": {}});
                    self.start(Block::ToolUse(index), b, &mut out);
                }
                ToolDelta::Args { index, fragment } if self.open == Some(Block::ToolUse(index)) => {
                    self.delta(
                        json!({"type": "input_json_delta", "partial_json": fragment}),
                        &mut out,
                    );
                }
                ToolDelta::Args { .. } | ToolDelta::Content(_) => {}
            }
        }
        out
    }
}

async fn send_all(tx: &SseSender, events: Vec<(&'static str, Json)>) -> bool {
    for (name, v) in events {
        if !tx.event(name, &v).await {
            return false;
        }
    }
    true
}

pub(super) fn stream(mut p: Prepared, id: String, model: String) -> warp::reply::Response {
    let (tx, resp) = sse::channel();
    tokio::spawn(async move {
        let start = json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": p.prompt_tokens, "output_tokens": 0}}});
        let ping = json!({"type": "ping"});
        if !tx.event("message_start", &start).await || !tx.event("ping", &ping).await {
            return;
        }
        let mut blocks = Blocks::default();
        loop {
            let ev = tokio::select! {
                ev = p.stream.next() => ev,
                _ = tx.closed() => return, // client gone: dropping `p.stream` cancels the request
                _ = tokio::time::sleep(sse::KEEP_ALIVE) => {
                    if !tx.event("ping", &ping).await { return; }
                    continue;
                }
            };
            let Some(ev) = ev else { return };
            match ev {
                Event::Delta { text, .. } => {
                    let events = blocks.piece(p.assembler.push(&text));
                    if !send_all(&tx, events).await {
                        return;
                    }
                }
                Event::Error(e) => {
                    let _ = tx.event("error", &error_body(&ApiError::internal(e))).await;
                    return;
                }
                Event::Finished {
                    reason,
                    stop_reason: stop,
                    usage,
                } => {
                    let mut events = blocks.piece(p.assembler.finish());
                    blocks.close(&mut events);
                    let (r, seq) = stop_reason(reason, &stop, blocks.called_tools);
                    events.push(("message_delta", json!({"type": "message_delta",
                        "delta": {"stop_reason": r, "stop_sequence": seq},
                        "usage": {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}})));
                    events.push(("message_stop", json!({"type": "message_stop"})));
                    let _ = send_all(&tx, events).await;
                    return;
                }
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
    fn blocks_open_and_close_in_sequence() {
        let mut b = Blocks::default();
        let mut ev = b.piece(piece("hm", "", vec![]));
        ev.extend(b.piece(piece("m", "Hi", vec![])));
        ev.extend(b.piece(piece(
            "",
            "",
            vec![
                ToolDelta::Start {
                    index: 0,
                    id: "x".into(),
                    name: "f".into(),
                },
                ToolDelta::Args {
                    index: 0,
                    fragment: "{\"a\": ".into(),
                },
                ToolDelta::Args {
                    index: 0,
                    fragment: "1}".into(),
                },
            ],
        )));
        b.close(&mut ev);
        let names: Vec<&str> = ev.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop"
            ]
        );
        let idx: Vec<u64> = ev
            .iter()
            .map(|(_, v)| v["index"].as_u64().unwrap())
            .collect();
        assert_eq!(idx, [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2]);
        assert_eq!(ev[0].1["content_block"]["type"], "thinking");
        assert_eq!(ev[2].1["delta"]["thinking"], "m");
        assert_eq!(ev[5].1["delta"]["text"], "Hi");
        assert_eq!(ev[7].1["content_block"]["name"], "f");
        let args: String = ev[8..10]
            .iter()
            .map(|(_, v)| v["delta"]["partial_json"].as_str().unwrap())
            .collect();
        assert_eq!(args, "{\"a\": 1}");
        assert!(b.called_tools);
    }
}
