//! Chat templates: the checkpoint's Jinja template rendered with minijinja the way
//! `transformers.apply_chat_template` renders it (trim_blocks + lstrip_blocks, Python string
//! methods through pycompat, `raise_exception`, `tojson` like `json.dumps`, `{% generation %}`
//! tags neutralised). Without one, the built-in Laguna XS-2.1 format is used.
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde_json::Value as Json;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template {0}: {1}")]
    Load(String, String),
    #[error("{0}")]
    Render(String),
}

/// Laguna XS-2.1 chat format (laguna-model.md §4), used when a checkpoint ships no template.
pub const BUILTIN_LAGUNA_TEMPLATE: &str = include_str!("laguna_xs21.jinja");

pub struct ChatTemplate {
    env: Environment<'static>,
    pub bos_token: String,
    pub eos_token: String,
    /// Where the template came from (for the startup log).
    pub source: String,
}

pub struct RenderArgs<'a> {
    pub messages: &'a [Json],
    pub tools: Option<&'a [Json]>,
    pub add_generation_prompt: bool,
    /// `chat_template_kwargs` (e.g. `enable_thinking`), passed as top-level template variables.
    pub kwargs: &'a serde_json::Map<String, Json>,
}

fn raise_exception(msg: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False)` (", " and ": "
/// separators, no HTML escaping), with optional `indent` and `sort_keys`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let mut j = serde_json::to_value(value)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    if sort_keys == Some(true) {
        j = sort_json(j);
    }
    Ok(Value::from_safe_string(python_json_dumps(&j, indent)))
}

fn sort_json(v: Json) -> Json {
    match v {
        Json::Object(m) => {
            let mut pairs: Vec<(String, Json)> = m.into_iter().collect();
            pairs.sort_by(|a, b| a.0.cmp(&b.0));
            Json::Object(pairs.into_iter().map(|(k, v)| (k, sort_json(v))).collect())
        }
        Json::Array(a) => Json::Array(a.into_iter().map(sort_json).collect()),
        other => other,
    }
}

/// Python's `json.dumps(v, ensure_ascii=False)` text (with `indent`, its pretty form).
pub fn python_json_dumps(v: &Json, indent: Option<usize>) -> String {
    let mut out = String::new();
    write_json(&mut out, v, indent, 0);
    out
}

fn write_json(out: &mut String, v: &Json, indent: Option<usize>, depth: usize) {
    let nl = |out: &mut String, d: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * d));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        Json::Array(a) if !a.is_empty() => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                nl(out, depth + 1);
                write_json(out, x, indent, depth + 1);
            }
            nl(out, depth);
            out.push(']');
        }
        Json::Object(m) if !m.is_empty() => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                nl(out, depth + 1);
                out.push_str(&serde_json::to_string(k).unwrap());
                out.push_str(": ");
                write_json(out, x, indent, depth + 1);
            }
            nl(out, depth);
            out.push('}');
        }
        Json::Number(n) => {
            // Python prints floats with a fraction (1.0) and ints without, as serde_json does.
            out.push_str(&n.to_string());
        }
        other => out.push_str(&serde_json::to_string(other).unwrap()),
    }
}

/// `{% generation %}`/`{% endgeneration %}` are transformers-only tags (assistant masks). Replace them
/// by an always-true `if` so their whitespace control (`{%-`/`-%}`) still applies.
pub fn neutralise_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(i) = rest.find("{%") {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let Some(j) = tail.find("%}") else {
            out.push_str(tail);
            return out;
        };
        let tag = &tail[..j + 2];
        let inner =
            tag[2..tag.len() - 2].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        let lead = if tag[2..].starts_with('-') {
            "{%-"
        } else {
            "{%"
        };
        let trail = if tag[..tag.len() - 2].ends_with('-') {
            "-%}"
        } else {
            "%}"
        };
        match inner {
            "generation" => out.push_str(&format!("{lead} if true {trail}")),
            "endgeneration" => out.push_str(&format!("{lead} endif {trail}")),
            _ => out.push_str(tag),
        }
        rest = &tail[j + 2..];
    }
    out.push_str(rest);
    out
}

impl ChatTemplate {
    pub fn new(
        source_text: &str,
        bos_token: String,
        eos_token: String,
        source: String,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| TemplateError::Load(source.clone(), e.to_string()))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", |fmt: String| -> String {
            // Enough for templates that print today's date; UTC, no chrono dependency.
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let days = secs / 86400;
            let (y, m, d) = civil_from_days(days as i64);
            fmt.replace("%Y", &format!("{y:04}"))
                .replace("%m", &format!("{m:02}"))
                .replace("%d", &format!("{d:02}"))
        });
        env.add_filter("tojson", tojson);
        // Python slicing `[::-1]` is fine in minijinja; `|reverse` too.
        let text = neutralise_generation_tags(source_text);
        env.add_template_owned("chat", text)
            .map_err(|e| TemplateError::Load(source.clone(), format!("{e:#}")))?;
        Ok(ChatTemplate {
            env,
            bos_token,
            eos_token,
            source,
        })
    }

    /// The template of a model folder: `chat_template.jinja`, else `tokenizer_config.json`'s
    /// `chat_template` (a string, or a list of named templates: "default"), else the built-in one.
    pub fn from_dir(dir: &Path) -> Result<ChatTemplate, TemplateError> {
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Json = match std::fs::read_to_string(&cfg_path) {
            Ok(t) => serde_json::from_str(&t).map_err(|e| {
                TemplateError::Load(
                    cfg_path.display().to_string(),
                    format!("not valid JSON: {e}"),
                )
            })?,
            Err(_) => Json::Null,
        };
        let tok_str = |key: &str, default: &str| -> String {
            match cfg.get(key) {
                Some(Json::String(s)) => s.clone(),
                Some(Json::Object(o)) => o
                    .get("content")
                    .and_then(Json::as_str)
                    .unwrap_or(default)
                    .to_string(),
                _ => default.to_string(),
            }
        };
        let bos = tok_str("bos_token", "〈|EOS|〉");
        let eos = tok_str("eos_token", "〈|EOS|〉");
        let jinja = dir.join("chat_template.jinja");
        if let Ok(text) = std::fs::read_to_string(&jinja) {
            return Self::new(&text, bos, eos, jinja.display().to_string());
        }
        match cfg.get("chat_template") {
            Some(Json::String(s)) => return Self::new(s, bos, eos, cfg_path.display().to_string()),
            Some(Json::Array(list)) => {
                let pick = list
                    .iter()
                    .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                    .or_else(|| list.first())
                    .and_then(|t| t.get("template"))
                    .and_then(Json::as_str);
                if let Some(s) = pick {
                    return Self::new(s, bos, eos, cfg_path.display().to_string());
                }
            }
            _ => {}
        }
        Self::new(
            BUILTIN_LAGUNA_TEMPLATE,
            bos,
            eos,
            "built-in Laguna XS-2.1 format".into(),
        )
    }

    pub fn render(&self, a: &RenderArgs) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        let mut ctx = serde_json::Map::new();
        for (k, v) in a.kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        ctx.insert("messages".into(), Json::Array(a.messages.to_vec()));
        ctx.insert(
            "tools".into(),
            a.tools
                .map(|t| Json::Array(t.to_vec()))
                .unwrap_or(Json::Null),
        );
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(a.add_generation_prompt),
        );
        ctx.insert("bos_token".into(), Json::String(self.bos_token.clone()));
        ctx.insert("eos_token".into(), Json::String(self.eos_token.clone()));
        let ctx = Value::from(minijinja::value::Serde(Json::Object(ctx)));
        tmpl.render(ctx).map_err(|e| {
            let mut msg = e.to_string();
            if let Some(d) = e.detail() {
                msg = format!("{msg}: {d}");
            }
            TemplateError::Render(format!("chat template error: {msg}"))
        })
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_ifs() {
        assert_eq!(
            neutralise_generation_tags("a{%- generation -%}b{% endgeneration %}c"),
            "a{%- if true -%}b{% endif %}c"
        );
        assert_eq!(
            neutralise_generation_tags("{{ x }}{% if y %}{% endif %}"),
            "{{ x }}{% if y %}{% endif %}"
        );
    }

    #[test]
    fn json_dumps_like_python() {
        let v: Json = serde_json::from_str(
            r#"{"a": [1, 2.5, "x<y> & 'z' é"], "b": {}, "c": [], "d": null, "e": true, "f": 1.0}"#,
        )
        .unwrap();
        assert_eq!(
            python_json_dumps(&v, None),
            r#"{"a": [1, 2.5, "x<y> & 'z' é"], "b": {}, "c": [], "d": null, "e": true, "f": 1.0}"#
        );
        assert_eq!(
            python_json_dumps(&serde_json::json!({"a": [1]}), Some(2)),
            "{\n  \"a\": [\n    1\n  ]\n}"
        );
    }

    #[test]
    fn builtin_template_renders_the_spec_format() {
        let t = ChatTemplate::new(
            BUILTIN_LAGUNA_TEMPLATE,
            "〈|EOS|〉".into(),
            "〈|EOS|〉".into(),
            "builtin".into(),
        )
        .unwrap();
        let msgs = vec![serde_json::json!({"role": "user", "content": "hi"})];
        let kw = serde_json::Map::new();
        let s = t
            .render(&RenderArgs {
                messages: &msgs,
                tools: None,
                add_generation_prompt: true,
                kwargs: &kw,
            })
            .unwrap();
        assert_eq!(s, "〈|EOS|〉<system>You are a helpful, conversationally-fluent assistant made by Poolside. You are here to be helpful to users through natural language conversations.</system>\n<user>hi</user>\n<assistant></think>");
        let mut kw = serde_json::Map::new();
        kw.insert("enable_thinking".into(), Json::Bool(true));
        let msgs = vec![
            serde_json::json!({"role": "system", "content": ""}),
            serde_json::json!({"role": "user", "content": "hi"}),
        ];
        let s = t
            .render(&RenderArgs {
                messages: &msgs,
                tools: None,
                add_generation_prompt: true,
                kwargs: &kw,
            })
            .unwrap();
        assert!(s.ends_with("<user>hi</user>\n<assistant><think>"), "{s}");
    }

    /// Rendered strings and token ids from Python transformers (tests/fixtures/models/tiny-chat).
    #[test]
    fn matches_transformers_reference_chat() {
        let dir = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/models/tiny-chat"
        ));
        let Ok(text) = std::fs::read_to_string(dir.join("reference_chat.json")) else {
            eprintln!("skipping: {} has no reference_chat.json", dir.display());
            return;
        };
        let refj: Json = serde_json::from_str(&text).unwrap();
        let t = ChatTemplate::from_dir(dir).unwrap();
        let builtin = ChatTemplate::new(
            BUILTIN_LAGUNA_TEMPLATE,
            t.bos_token.clone(),
            t.eos_token.clone(),
            "builtin".into(),
        )
        .unwrap();
        let tok = laguna_engine::tokenizer::Tokenizer::from_dir(dir)
            .unwrap()
            .unwrap();
        let cases = refj["cases"].as_array().unwrap();
        assert!(cases.len() >= 10);
        for case in cases {
            let name = case["name"].as_str().unwrap();
            // Through the same conversion the HTTP handler uses.
            let msgs: Vec<crate::serve::openai::ChatMessage> =
                serde_json::from_value(case["messages"].clone()).unwrap();
            let msgs = crate::serve::chat::template_messages(&msgs).unwrap();
            let mut kw = serde_json::Map::new();
            kw.insert("enable_thinking".into(), case["enable_thinking"].clone());
            let tools: Option<Vec<Json>> = case["tools"].as_array().cloned();
            let args = RenderArgs {
                messages: &msgs,
                tools: tools.as_deref(),
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                kwargs: &kw,
            };
            let want = case["rendered"].as_str().unwrap();
            assert_eq!(t.render(&args).unwrap(), want, "case {name}");
            assert_eq!(
                builtin.render(&args).unwrap(),
                want,
                "built-in template, case {name}"
            );
            let ids: Vec<u32> = case["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(
                tok.encode(want, false).unwrap(),
                ids,
                "token ids, case {name}"
            );
        }
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new(
            "{{ raise_exception('nope') }}",
            String::new(),
            String::new(),
            "t".into(),
        )
        .unwrap();
        let kw = serde_json::Map::new();
        let e = t
            .render(&RenderArgs {
                messages: &[],
                tools: None,
                add_generation_prompt: true,
                kwargs: &kw,
            })
            .unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }
}
