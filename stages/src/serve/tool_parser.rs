//! poolside_v1 tool calls: `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>…</tool_call>`.
//!
//! String values are written unquoted by the model; the tool's JSON schema says which arguments are
//! strings (kept verbatim, streamed as they arrive) and the rest are parsed (JSON, then Python
//! literals `True`/`False`/`None`, else kept as a string). Streaming emits a start delta (id, name,
//! empty arguments) and then argument fragments whose concatenation is one JSON object.
use serde_json::Value as Json;

const CALL_START: &str = "<tool_call>";
const CALL_END: &str = "</tool_call>";
const KEY_START: &str = "<arg_key>";
const KEY_END: &str = "</arg_key>";
const VAL_START: &str = "<arg_value>";
const VAL_END: &str = "</arg_value>";

#[derive(Debug, Clone, PartialEq)]
pub enum ToolDelta {
    /// Text outside tool calls.
    Content(String),
    Start {
        index: usize,
        id: String,
        name: String,
    },
    Args {
        index: usize,
        fragment: String,
    },
}

/// A finished call (non-streaming responses).
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// The JSON-schema `type` of `tool.arg` from the request's `tools`, if declared.
pub fn arg_type<'a>(tools: &'a [Json], tool: &str, arg: &str) -> Option<&'a Json> {
    tools
        .iter()
        .map(|t| t.get("function").unwrap_or(t))
        .find(|f| f.get("name").and_then(Json::as_str) == Some(tool))
        .and_then(|f| f.get("parameters"))
        .and_then(|p| p.get("properties"))
        .and_then(|p| p.get(arg))
        .and_then(|a| a.get("type"))
}

pub(crate) fn is_string_type(t: Option<&Json>) -> bool {
    match t {
        Some(Json::String(s)) => s == "string",
        // ["string", "null"]: a string unless the model wrote null.
        Some(Json::Array(a)) => {
            a.iter().any(|x| x == "string") && a.iter().all(|x| x == "string" || x == "null")
        }
        _ => false,
    }
}

/// A non-string argument value: JSON, else Python literals, else the text itself.
pub fn parse_value(raw: &str) -> Json {
    let raw = raw.trim();
    if let Ok(v) = serde_json::from_str::<Json>(raw) {
        return v;
    }
    match raw {
        "True" => return Json::Bool(true),
        "False" => return Json::Bool(false),
        "None" => return Json::Null,
        _ => {}
    }
    // Python-literal containers (single quotes, True/False/None inside).
    if raw.starts_with('{') || raw.starts_with('[') {
        let pyish = raw
            .replace('\'', "\"")
            .replace("True", "true")
            .replace("False", "false")
            .replace("None", "null");
        if let Ok(v) = serde_json::from_str::<Json>(&pyish) {
            return v;
        }
    }
    Json::String(raw.to_string())
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// JSON-escaped content of a string, without the quotes.
fn escape_inner(s: &str) -> String {
    let q = json_str(s);
    q[1..q.len() - 1].to_string()
}

/// Length of the longest suffix of `buf` that is a proper prefix of `tag`.
fn partial_suffix(buf: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&i| tag.is_char_boundary(i) && buf.ends_with(&tag[..i]))
        .unwrap_or(0)
}

pub fn new_call_id() -> String {
    let mut r = laguna_engine::sample::Rng::from_entropy();
    format!("chatcmpl-tool-{:016x}{:016x}", r.next_u64(), r.next_u64())
}

#[derive(Debug, Default)]
struct Call {
    args: String,
    args_started: bool,
    seen: Vec<String>,
}

pub struct ToolCallParser {
    tools: Vec<Json>,
    buf: String,
    in_call: bool,
    name: Option<String>,
    pending_key: Option<String>,
    in_string: bool,
    calls: Vec<Call>,
    ids: Vec<(String, String)>,
}

impl ToolCallParser {
    pub fn new(tools: Vec<Json>) -> ToolCallParser {
        ToolCallParser {
            tools,
            buf: String::new(),
            in_call: false,
            name: None,
            pending_key: None,
            in_string: false,
            calls: vec![],
            ids: vec![],
        }
    }

    fn idx(&self) -> usize {
        self.calls.len() - 1
    }

    fn add_args(&mut self, out: &mut Vec<ToolDelta>, frag: String) {
        let index = self.idx();
        self.calls[index].args.push_str(&frag);
        out.push(ToolDelta::Args {
            index,
            fragment: frag,
        });
    }

    pub fn push(&mut self, text: &str) -> Vec<ToolDelta> {
        self.buf.push_str(text);
        let mut out = vec![];
        loop {
            if !self.in_call {
                match self.buf.find(CALL_START) {
                    None => {
                        let keep = partial_suffix(&self.buf, CALL_START);
                        let emit: String = self.buf.drain(..self.buf.len() - keep).collect();
                        if !emit.is_empty() {
                            out.push(ToolDelta::Content(emit));
                        }
                        break;
                    }
                    Some(i) => {
                        if i > 0 {
                            out.push(ToolDelta::Content(self.buf[..i].to_string()));
                        }
                        self.buf.drain(..i + CALL_START.len());
                        self.in_call = true;
                        self.name = None;
                        self.pending_key = None;
                        self.in_string = false;
                        continue;
                    }
                }
            }
            // Tool name: up to a newline, the first <arg_key> or </tool_call>.
            if self.name.is_none() {
                let cut = [
                    self.buf.find('\n'),
                    self.buf.find(KEY_START),
                    self.buf.find(CALL_END),
                ]
                .into_iter()
                .flatten()
                .min();
                let Some(cut) = cut else { break };
                let name = self.buf[..cut].trim().to_string();
                if name.is_empty() && self.buf[cut..].starts_with(CALL_END) {
                    // `<tool_call></tool_call>`: nothing to report.
                    self.buf.drain(..cut + CALL_END.len());
                    self.in_call = false;
                    continue;
                }
                let skip = if self.buf[cut..].starts_with('\n') {
                    cut + 1
                } else {
                    cut
                };
                self.buf.drain(..skip);
                self.calls.push(Call::default());
                let id = new_call_id();
                self.ids.push((id.clone(), name.clone()));
                out.push(ToolDelta::Start {
                    index: self.idx(),
                    id,
                    name: name.clone(),
                });
                self.name = Some(name);
                continue;
            }
            if self.in_string {
                if let Some(end) = self.buf.find(VAL_END) {
                    let raw: String = self.buf.drain(..end).collect();
                    self.buf.drain(..VAL_END.len());
                    self.in_string = false;
                    self.pending_key = None;
                    let frag = escape_inner(&raw) + "\"";
                    self.add_args(&mut out, frag);
                    continue;
                }
                let keep = partial_suffix(&self.buf, VAL_END);
                let raw: String = self.buf.drain(..self.buf.len() - keep).collect();
                if !raw.is_empty() {
                    self.add_args(&mut out, escape_inner(&raw));
                }
                break;
            }
            if let Some(key) = self.pending_key.clone() {
                let Some(vp) = self.buf.find(VAL_START) else {
                    break;
                };
                let name = self.name.clone().unwrap_or_default();
                let ty = arg_type(&self.tools, &name, &key).cloned();
                let idx = self.idx();
                let dup = self.calls[idx].seen.contains(&key);
                if is_string_type(ty.as_ref()) {
                    self.buf.drain(..vp + VAL_START.len());
                    if dup {
                        // A repeated key: drop its value (the first one wins, as in vLLM).
                        let Some(end) = self.buf.find(VAL_END) else {
                            // Wait for the whole duplicate value.
                            self.buf.insert_str(0, VAL_START);
                            break;
                        };
                        self.buf.drain(..end + VAL_END.len());
                        self.pending_key = None;
                        continue;
                    }
                    self.calls[idx].seen.push(key.clone());
                    let lead = if self.calls[idx].args_started {
                        ", "
                    } else {
                        "{"
                    };
                    self.calls[idx].args_started = true;
                    self.add_args(&mut out, format!("{lead}{}: \"", json_str(&key)));
                    self.in_string = true;
                    continue;
                }
                let Some(end) = self.buf[vp..].find(VAL_END).map(|e| e + vp) else {
                    break;
                };
                let raw = self.buf[vp + VAL_START.len()..end].to_string();
                self.buf.drain(..end + VAL_END.len());
                self.pending_key = None;
                if dup || key.is_empty() {
                    continue;
                }
                self.calls[idx].seen.push(key.clone());
                let val = parse_value(&raw);
                let lead = if self.calls[idx].args_started {
                    ", "
                } else {
                    "{"
                };
                self.calls[idx].args_started = true;
                let frag = format!(
                    "{lead}{}: {}",
                    json_str(&key),
                    super::chat_template::python_json_dumps(&val, None)
                );
                self.add_args(&mut out, frag);
                continue;
            }
            // Next argument or the end of the call.
            let end = self.buf.find(CALL_END);
            let key = self.buf.find(KEY_START);
            match (end, key) {
                (Some(e), k) if k.is_none_or(|k| e < k) => {
                    self.buf.drain(..e + CALL_END.len());
                    self.close_call(&mut out);
                    continue;
                }
                (_, Some(k)) => {
                    let Some(ke) = self.buf[k..].find(KEY_END).map(|x| x + k) else {
                        break;
                    };
                    let key = self.buf[k + KEY_START.len()..ke].trim().to_string();
                    self.buf.drain(..ke + KEY_END.len());
                    self.pending_key = Some(key);
                    continue;
                }
                _ => break,
            }
        }
        out
    }

    fn close_call(&mut self, out: &mut Vec<ToolDelta>) {
        let idx = self.idx();
        let frag = if self.calls[idx].args_started {
            "}"
        } else {
            "{}"
        };
        self.add_args(out, frag.to_string());
        self.in_call = false;
        self.name = None;
        self.pending_key = None;
        self.in_string = false;
    }

    /// End of output: close an unterminated call so its arguments stay valid JSON, and return
    /// held-back text.
    pub fn finish(&mut self) -> Vec<ToolDelta> {
        let mut out = vec![];
        if self.in_call {
            if self.name.is_none() {
                let name = self.buf.trim().to_string();
                self.buf.clear();
                if name.is_empty() {
                    self.in_call = false;
                    return out;
                }
                self.calls.push(Call::default());
                let id = new_call_id();
                self.ids.push((id.clone(), name.clone()));
                out.push(ToolDelta::Start {
                    index: self.idx(),
                    id,
                    name: name.clone(),
                });
                self.name = Some(name);
            }
            if self.in_string {
                let raw = std::mem::take(&mut self.buf);
                let mut frag = escape_inner(&raw);
                frag.push('"');
                self.add_args(&mut out, frag);
            }
            self.buf.clear();
            self.close_call(&mut out);
        } else if !self.buf.is_empty() {
            out.push(ToolDelta::Content(std::mem::take(&mut self.buf)));
        }
        out
    }

    pub fn num_calls(&self) -> usize {
        self.calls.len()
    }

    /// All calls seen so far with their full arguments.
    pub fn calls(&self) -> Vec<ParsedCall> {
        self.ids
            .iter()
            .zip(&self.calls)
            .map(|((id, name), c)| ParsedCall {
                id: id.clone(),
                name: name.clone(),
                arguments: c.args.clone(),
            })
            .collect()
    }
}

/// Parse a whole output at once: (content outside calls, calls).
pub fn parse_complete(text: &str, tools: &[Json]) -> (String, Vec<ParsedCall>) {
    let mut p = ToolCallParser::new(tools.to_vec());
    let mut content = String::new();
    for d in p.push(text).into_iter().chain(p.finish()) {
        if let ToolDelta::Content(c) = d {
            content.push_str(&c);
        }
    }
    (content, p.calls())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Vec<Json> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}, "opts": {"type": "object"}, "ratio": {"type": "number"}}}}}),
        ]
    }

    #[test]
    fn complete_call_with_typed_args() {
        let text = "Let me check.<tool_call>get_weather\n<arg_key>city</arg_key><arg_value> New York </arg_value><arg_key>days</arg_key><arg_value>3</arg_value><arg_key>metric</arg_key><arg_value>True</arg_value><arg_key>opts</arg_key><arg_value>{\"a\": [1, 2]}</arg_value><arg_key>ratio</arg_key><arg_value>0.5</arg_value></tool_call>";
        let (content, calls) = parse_complete(text, &tools());
        assert_eq!(content, "Let me check.");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        let args: Json = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(
            args,
            json!({"city": " New York ", "days": 3, "metric": true, "opts": {"a": [1, 2]}, "ratio": 0.5})
        );
        assert_eq!(
            calls[0].arguments,
            r#"{"city": " New York ", "days": 3, "metric": true, "opts": {"a": [1, 2]}, "ratio": 0.5}"#
        );
    }

    #[test]
    fn unknown_args_are_deserialized_and_zero_arg_calls_work() {
        let (c, calls) = parse_complete("<tool_call>now</tool_call><tool_call>x<arg_key>n</arg_key><arg_value>7</arg_value><arg_key>s</arg_key><arg_value>hi \"there\"</arg_value></tool_call>", &tools());
        assert_eq!(c, "");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, "{}");
        assert_eq!(
            serde_json::from_str::<Json>(&calls[1].arguments).unwrap(),
            json!({"n": 7, "s": "hi \"there\""})
        );
    }

    #[test]
    fn streaming_char_by_char_matches_complete() {
        let text = "ok <tool_call>get_weather<arg_key>city</arg_key><arg_value>Pa\"ris\n</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call> after";
        let mut p = ToolCallParser::new(tools());
        let mut deltas = vec![];
        for ch in text.chars() {
            deltas.extend(p.push(&ch.to_string()));
        }
        deltas.extend(p.finish());
        let mut content = String::new();
        let mut args = String::new();
        let mut starts = 0;
        for d in &deltas {
            match d {
                ToolDelta::Content(c) => content.push_str(c),
                ToolDelta::Start { name, index, .. } => {
                    assert_eq!((name.as_str(), *index), ("get_weather", 0));
                    assert!(args.is_empty(), "start comes before arguments");
                    starts += 1;
                }
                ToolDelta::Args { fragment, .. } => args.push_str(fragment),
            }
        }
        assert_eq!(starts, 1);
        assert_eq!(content, "ok  after");
        assert_eq!(
            serde_json::from_str::<Json>(&args).unwrap(),
            json!({"city": "Pa\"ris\n", "days": 2})
        );
        // the string value streamed in several fragments
        assert!(
            deltas
                .iter()
                .filter(|d| matches!(d, ToolDelta::Args { .. }))
                .count()
                > 4
        );
    }

    #[test]
    fn unterminated_call_is_closed() {
        let mut p = ToolCallParser::new(tools());
        let mut args = String::new();
        for d in p
            .push("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par")
            .into_iter()
            .chain(p.finish())
        {
            if let ToolDelta::Args { fragment, .. } = d {
                args.push_str(&fragment);
            }
        }
        assert_eq!(
            serde_json::from_str::<Json>(&args).unwrap(),
            json!({"city": "Par"})
        );
    }

    #[test]
    fn text_that_only_looks_like_a_tag_is_content() {
        let (c, calls) = parse_complete("a <tool b", &tools());
        assert_eq!((c.as_str(), calls.len()), ("a <tool b", 0));
    }
}
