//! Constrained decoding for the API: `tool_choice` "required" / a named function and
//! `response_format` json_object / json_schema become an llguidance Lark grammar over the chat
//! format (see docs/design/constrained-decoding.md), compiled into the engine's per-request
//! [`Constraint`].
//!
//! * Tool calls use the poolside_v1 syntax the tool parser reads back:
//!   `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>`, one or more
//!   calls (one with `parallel_tool_calls: false`), nothing else after the reasoning. Arguments
//!   follow the tool's `parameters` schema: declared properties in schema order, required ones
//!   always, optional ones may be left out. A string-typed argument (the parser's rule,
//!   `tool_parser::is_string_type`) is raw text (enum / const / pattern / minLength / maxLength
//!   enforced, never containing `</arg_value>`); any other is JSON valid for its schema.
//! * With thinking on, the prompt ends in `<think>`: free reasoning text (without `</think>`),
//!   then `</think>`, then the constrained part.
use super::errors::ApiError;
use super::state::AppState;
use super::tool_parser::is_string_type;
use laguna_engine::grammar::{Constraint, GrammarEnv};
use serde_json::{json, Map, Value as Json};

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Demand {
    /// One or more tool calls (`parallel`) of these tools (the request's `function` objects).
    ToolCalls { tools: Vec<Json>, parallel: bool },
    /// A JSON value valid for this schema.
    Json(Json),
}

/// The demand of a chat request's `tool_choice` / `response_format` (None: unconstrained). A
/// tool choice that forces a call wins over the response format.
pub fn demand(
    tools: Option<&[Json]>,
    tool_choice: Option<&Json>,
    response_format: Option<&Json>,
    parallel_tool_calls: Option<bool>,
) -> Result<Option<Demand>, ApiError> {
    let funcs: Vec<Json> = tools
        .unwrap_or_default()
        .iter()
        .map(|t| t.get("function").unwrap_or(t).clone())
        .collect();
    let name_of = |f: &Json| f.get("name").and_then(Json::as_str).map(str::to_string);
    let parallel = parallel_tool_calls.unwrap_or(true);
    match tool_choice {
        Some(Json::String(s)) if s == "required" => {
            return Ok(Some(Demand::ToolCalls {
                tools: funcs,
                parallel,
            }))
        }
        Some(Json::Object(o)) => {
            let Some(name) = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Json::as_str)
            else {
                return Ok(None);
            };
            let Some(f) = funcs.iter().find(|f| name_of(f).as_deref() == Some(name)) else {
                let known: Vec<String> = funcs.iter().filter_map(name_of).collect();
                return Err(ApiError::bad_request(format!(
                    "tool_choice names the function `{name}`, which is not in `tools` ({}).",
                    known.join(", ")
                ))
                .with_param("tool_choice"));
            };
            return Ok(Some(Demand::ToolCalls {
                tools: vec![f.clone()],
                parallel,
            }));
        }
        _ => {}
    }
    let Some(rf) = response_format.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let bad = |m: &str| Err(ApiError::bad_request(m.to_string()).with_param("response_format"));
    match rf.get("type").and_then(Json::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Demand::Json(json!({"type": "object"})))),
        Some("json_schema") => {
            let Some(js) = rf.get("json_schema").filter(|v| v.is_object()) else {
                return bad("response_format of type json_schema needs a `json_schema` object ({\"name\": ..., \"schema\": {...}}).");
            };
            match js.get("schema") {
                None | Some(Json::Null) => Ok(Some(Demand::Json(json!({})))),
                Some(s) if s.is_object() || s.is_boolean() => Ok(Some(Demand::Json(s.clone()))),
                Some(_) => bad("response_format.json_schema.schema must be a JSON Schema object."),
            }
        }
        _ => bad("response_format.type must be `text`, `json_object` or `json_schema`."),
    }
}

/// Compile a demand for this server's model; a 400 names what is wrong with the schema.
pub fn compile(state: &AppState, d: &Demand, thinking: bool) -> Result<Constraint, ApiError> {
    let Some(env) = state.grammar.as_deref() else {
        return Err(ApiError::bad_request(
            "Constrained decoding (tool_choice required / named, response_format json) is not available: the grammar engine could not read this model's tokenizer.",
        ));
    };
    compile_with(env, d, thinking)
}

pub fn compile_with(env: &GrammarEnv, d: &Demand, thinking: bool) -> Result<Constraint, ApiError> {
    let (lark, param) = match d {
        Demand::ToolCalls { tools, parallel } => {
            (tool_calls_lark(env, tools, *parallel, thinking)?, "tools")
        }
        Demand::Json(schema) => (json_lark(env, schema, thinking), "response_format"),
    };
    env.compile(&lark).map_err(|e| {
        ApiError::bad_request(format!("The schema cannot be enforced: {e}")).with_param(param)
    })
}

/// `demand` then `compile`: the constraint for a chat request, if it asks for one.
pub fn for_chat(
    state: &AppState,
    tools: Option<&[Json]>,
    tool_choice: Option<&Json>,
    response_format: Option<&Json>,
    parallel_tool_calls: Option<bool>,
    thinking: bool,
) -> Result<Option<Constraint>, ApiError> {
    match demand(tools, tool_choice, response_format, parallel_tool_calls)? {
        None => Ok(None),
        Some(d) => compile(state, &d, thinking).map(Some),
    }
}

const THINK_END: &str = "</think>";

/// A chat-format tag: one special token when the tokenizer has it, else its text.
fn tag(env: &GrammarEnv, t: &str) -> String {
    if env.is_special(t) {
        t.to_string()
    } else {
        lit(t)
    }
}

/// A Lark string literal (JSON string syntax).
fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

/// A Lark regex literal: `/` escaped unless it already is.
fn rx(r: &str) -> String {
    let mut out = String::from("/");
    let mut esc = false;
    for c in r.chars() {
        if c == '/' && !esc {
            out.push('\\');
        }
        esc = c == '\\' && !esc;
        out.push(c);
    }
    out.push('/');
    out
}

/// Text that does not contain `end` (as a regex, for `&` with others).
fn without(end: &str) -> String {
    format!("~/(?s:.*){}(?s:.*)/", rx_escape(end))
}

fn rx_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$/#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The start rule: reasoning first when thinking is on.
fn start(env: &GrammarEnv, body: &str, thinking: bool, rules: &mut Vec<String>) {
    if thinking {
        rules.push(format!("start: think? {} {body}", tag(env, THINK_END)));
        rules.push("think: THINK".into());
        rules.push(format!("THINK: /(?s:.+)/ & {}", without(THINK_END)));
    } else {
        rules.push(format!("start: {body}"));
    }
}

fn json_lark(env: &GrammarEnv, schema: &Json, thinking: bool) -> String {
    let mut rules = vec![];
    start(env, "json_value", thinking, &mut rules);
    rules.push(format!("json_value: %json {}", with_ws(schema.clone())));
    rules.join("\n")
}

/// Whitespace between JSON tokens: up to 24 characters (a model stuck on spaces cannot run on).
fn with_ws(mut schema: Json) -> Json {
    if let Json::Object(o) = &mut schema {
        if !o.contains_key("x-guidance") {
            o.insert(
                "x-guidance".into(),
                json!({"whitespace_pattern": "[\\x20\\x0A\\x0D\\x09]{1,24}"}),
            );
        }
    }
    schema
}

fn tool_calls_lark(
    env: &GrammarEnv,
    tools: &[Json],
    parallel: bool,
    thinking: bool,
) -> Result<String, ApiError> {
    if tools.is_empty() {
        return Err(ApiError::bad_request("tool_choice needs `tools`.").with_param("tool_choice"));
    }
    let mut rules = vec![];
    start(
        env,
        if parallel { "call+" } else { "call" },
        thinking,
        &mut rules,
    );
    let names: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
    rules.push(format!("call: {}", names.join(" | ")));
    for (i, f) in tools.iter().enumerate() {
        tool_rules(env, i, f, &mut rules)?;
    }
    Ok(rules.join("\n"))
}

/// `call_i` and its arguments' rules.
fn tool_rules(
    env: &GrammarEnv,
    i: usize,
    f: &Json,
    rules: &mut Vec<String>,
) -> Result<(), ApiError> {
    let name = f.get("name").and_then(Json::as_str).unwrap_or_default();
    let params = f.get("parameters").cloned().unwrap_or(json!({}));
    let bad = |m: String| Err(ApiError::bad_request(m).with_param("tools"));
    if !params.is_object() {
        return bad(format!(
            "tools: the parameters of `{name}` must be a JSON Schema object."
        ));
    }
    let props = params
        .get("properties")
        .and_then(Json::as_object)
        .cloned()
        .unwrap_or_default();
    let required: Vec<String> = params
        .get("required")
        .and_then(Json::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Json::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    // Declared properties in order, then required names the schema does not declare.
    let extra = match params.get("additionalProperties") {
        Some(s @ Json::Object(_)) => s.clone(),
        _ => json!({}),
    };
    let mut args: Vec<(String, Json, bool)> = props
        .iter()
        .map(|(k, s)| (k.clone(), s.clone(), required.contains(k)))
        .collect();
    for r in &required {
        if !props.contains_key(r) {
            args.push((r.clone(), extra.clone(), true));
        }
    }
    let defs: Map<String, Json> = ["$defs", "definitions"]
        .iter()
        .filter_map(|k| params.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect();
    let mut seq = vec![tag(env, "<tool_call>"), lit(name)];
    for (j, (key, schema, req)) in args.iter().enumerate() {
        let r = format!("arg_{i}_{j}");
        seq.push(if *req { r.clone() } else { format!("{r}?") });
        let value = arg_value(&format!("{r}_v"), schema, &defs, rules)?;
        rules.push(format!(
            "{r}: {} {} {} {} {value} {}",
            tag(env, "<arg_key>"),
            lit(key),
            tag(env, "</arg_key>"),
            tag(env, "<arg_value>"),
            tag(env, "</arg_value>")
        ));
    }
    seq.push(tag(env, "</tool_call>"));
    rules.push(format!("call_{i}: {}", seq.join(" ")));
    Ok(())
}

/// The grammar of one argument's value text (a rule name or an inline expression).
fn arg_value(
    rule: &str,
    schema: &Json,
    defs: &Map<String, Json>,
    rules: &mut Vec<String>,
) -> Result<String, ApiError> {
    if !is_string_type(schema.get("type")) {
        // Parsed as JSON by the tool parser: JSON valid for the property's schema.
        let mut s = schema.clone();
        if let Json::Object(o) = &mut s {
            for (k, v) in defs {
                o.entry(k.clone()).or_insert(v.clone());
            }
        }
        rules.push(format!("{rule}: %json {}", with_ws(s)));
        return Ok(rule.to_string());
    }
    // Raw text, kept verbatim as the string value.
    let strings = |v: &Json| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().filter_map(Json::as_str).map(lit).collect())
            .unwrap_or_default()
    };
    if let Some(e) = schema.get("enum") {
        let alts = strings(e);
        if alts.is_empty() {
            return Err(ApiError::bad_request(format!(
                "tools: the enum of a string argument ({e}) has no strings."
            ))
            .with_param("tools"));
        }
        rules.push(format!("{rule}: {}", alts.join(" | ")));
        return Ok(rule.to_string());
    }
    if let Some(Json::String(c)) = schema.get("const") {
        return Ok(lit(c));
    }
    let term = rule.to_uppercase();
    let mut parts = vec![format!("/(?s:.+)/ & {}", without("</arg_value>"))];
    let min = schema.get("minLength").and_then(Json::as_u64);
    let max = schema.get("maxLength").and_then(Json::as_u64);
    if min.is_some() || max.is_some() {
        parts.push(format!(
            "/(?s:.{{{},{}}})/",
            min.unwrap_or(0),
            max.map(|m| m.to_string()).unwrap_or_default()
        ));
    }
    if let Some(p) = schema.get("pattern").and_then(Json::as_str) {
        // JSON Schema patterns search: unanchored ends match anything.
        let (head, p) = match p.strip_prefix('^') {
            Some(rest) => ("", rest),
            None => ("(?s:.*)", p),
        };
        let (p, tail) = match p.strip_suffix('$').filter(|r| !r.ends_with('\\')) {
            Some(rest) => (rest, ""),
            None => (p, "(?s:.*)"),
        };
        parts.push(rx(&format!("{head}(?:{p}){tail}")));
    }
    // Terminals match at least one character: the empty value is the terminal left out.
    let may_be_empty = min.unwrap_or(0) == 0 && schema.get("pattern").is_none();
    rules.push(format!("{term}: {}", parts.join(" & ")));
    rules.push(format!(
        "{rule}: {term}{}",
        if may_be_empty { "?" } else { "" }
    ));
    Ok(rule.to_string())
}

#[cfg(test)]
mod tests;
