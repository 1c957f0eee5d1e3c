//! Grammars of tool calls and JSON over the tiny-chat tokenizer: random walks through the masks
//! (uniform among the allowed tokens: the worst a model can do) must give text that the server's
//! own tool parser reads back as calls whose arguments satisfy the schema (checked by hand here).
use super::*;
use crate::serve::tool_parser::parse_complete;
use laguna_engine::sample::Rng;
use laguna_engine::tokenizer::Tokenizer;

fn env() -> Option<(GrammarEnv, Tokenizer)> {
    let dir = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/models/tiny-chat"
    ));
    let tok = Tokenizer::from_dir(dir).ok().flatten()?;
    Some((GrammarEnv::new(&tok, 512, &[2, 24]).unwrap(), tok))
}

fn walk(c: &mut Constraint, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    let mut out = vec![];
    for _ in 0..20000 {
        let mut l = vec![0.0f32; 512];
        c.apply(&mut l).unwrap();
        let ok: Vec<u32> = (0..512u32).filter(|&t| l[t as usize] == 0.0).collect();
        let t = ok[(rng.next_u64() % ok.len() as u64) as usize];
        c.consume(t).unwrap();
        if t == 2 || t == 24 {
            return out;
        }
        out.push(t);
    }
    panic!("walk did not end");
}

fn weather() -> Json {
    json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 6},
            "days": {"type": "integer", "minimum": 1, "maximum": 9},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "code": {"type": "string", "pattern": "^[a-z]{2}$"}
        },
        "required": ["city", "days"]
    }}})
}

fn search() -> Json {
    json!({"type": "function", "function": {"name": "search", "parameters": {
        "type": "object",
        "properties": {"q": {"type": ["string", "null"], "maxLength": 5}, "exact": {"type": "boolean"}},
        "required": ["q", "exact"]
    }}})
}

fn check_weather(a: &Json) {
    let o = a.as_object().unwrap();
    assert!(o
        .keys()
        .all(|k| ["city", "days", "unit", "code"].contains(&k.as_str())));
    assert!(o["city"].as_str().unwrap().chars().count() <= 6);
    assert!((1..=9).contains(&o["days"].as_i64().unwrap()), "{a}");
    if let Some(u) = o.get("unit") {
        assert!(u == "c" || u == "f", "{a}");
    }
    if let Some(c) = o.get("code") {
        let c = c.as_str().unwrap();
        assert!(
            c.len() == 2 && c.bytes().all(|b| b.is_ascii_lowercase()),
            "{a}"
        );
    }
}

fn check_search(a: &Json) {
    let o = a.as_object().unwrap();
    assert_eq!(o.len(), 2, "{a}");
    assert!(o["q"].as_str().unwrap().chars().count() <= 5);
    assert!(o["exact"].is_boolean());
}

#[test]
fn forced_tool_calls_parse_and_validate() {
    let Some((g, tok)) = env() else { return };
    let tools = vec![weather(), search()];
    for thinking in [false, true] {
        for parallel in [true, false] {
            let d = demand(Some(&tools), Some(&json!("required")), None, Some(parallel))
                .unwrap()
                .unwrap();
            for seed in 0..6 {
                let mut c = compile_with(&g, &d, thinking).unwrap();
                let text = tok.decode(&walk(&mut c, seed), false).unwrap();
                let body = if thinking {
                    let (r, b) = text.split_once("</think>").expect("reasoning ends");
                    assert!(!r.contains("</think>"));
                    b.to_string()
                } else {
                    text.clone()
                };
                let (content, calls) = parse_complete(&body, &tools);
                assert_eq!(content, "", "nothing but calls: {text:?}");
                assert!(
                    !calls.is_empty() && (parallel || calls.len() == 1),
                    "{text:?}"
                );
                for call in calls {
                    let a: Json = serde_json::from_str(&call.arguments).unwrap();
                    match call.name.as_str() {
                        "get_weather" => check_weather(&a),
                        "search" => check_search(&a),
                        n => panic!("unknown tool {n}: {text:?}"),
                    }
                }
            }
        }
    }
}

#[test]
fn named_tool_choice_calls_that_tool() {
    let Some((g, tok)) = env() else { return };
    let tools = vec![weather(), search()];
    let tc = json!({"type": "function", "function": {"name": "search"}});
    let d = demand(Some(&tools), Some(&tc), None, None)
        .unwrap()
        .unwrap();
    for seed in 0..4 {
        let mut c = compile_with(&g, &d, false).unwrap();
        let text = tok.decode(&walk(&mut c, seed), false).unwrap();
        let (_, calls) = parse_complete(&text, &tools);
        assert!(calls.iter().all(|c| c.name == "search"), "{text:?}");
        for call in calls {
            check_search(&serde_json::from_str(&call.arguments).unwrap());
        }
    }
}

#[test]
fn json_response_format_gives_json() {
    let Some((g, tok)) = env() else { return };
    let rf = json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {
        "type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 99, "minimum": 0}},
        "required": ["ok", "n"], "additionalProperties": false}}});
    let d = demand(None, None, Some(&rf), None).unwrap().unwrap();
    for seed in 0..6 {
        let mut c = compile_with(&g, &d, false).unwrap();
        let text = tok.decode(&walk(&mut c, seed), false).unwrap();
        let v: Json = serde_json::from_str(&text).unwrap();
        assert!(
            v["ok"].is_boolean() && (0..=99).contains(&v["n"].as_i64().unwrap()),
            "{text}"
        );
        assert_eq!(v.as_object().unwrap().len(), 2);
    }
    let d = demand(None, None, Some(&json!({"type": "json_object"})), None)
        .unwrap()
        .unwrap();
    let mut c = compile_with(&g, &d, false).unwrap();
    let text = tok.decode(&walk(&mut c, 1), false).unwrap();
    assert!(
        serde_json::from_str::<Json>(&text).unwrap().is_object(),
        "{text}"
    );
}

#[test]
fn demands_and_their_errors() {
    let tools = vec![weather()];
    assert_eq!(
        demand(Some(&tools), Some(&json!("auto")), None, None).unwrap(),
        None
    );
    assert_eq!(
        demand(Some(&tools), None, Some(&json!({"type": "text"})), None).unwrap(),
        None
    );
    let e = demand(
        Some(&tools),
        Some(&json!({"type": "function", "function": {"name": "nope"}})),
        None,
        None,
    )
    .unwrap_err();
    assert_eq!(e.status.as_u16(), 400);
    assert!(
        e.message.contains("`nope`") && e.message.contains("get_weather"),
        "{}",
        e.message
    );
    assert!(demand(None, None, Some(&json!({"type": "yaml"})), None).is_err());
    assert!(demand(None, None, Some(&json!({"type": "json_schema"})), None).is_err());
    // A forced call wins over the response format.
    let d = demand(
        Some(&tools),
        Some(&json!("required")),
        Some(&json!({"type": "json_object"})),
        None,
    )
    .unwrap()
    .unwrap();
    assert!(matches!(d, Demand::ToolCalls { .. }));
    let Some((g, _)) = env() else { return };
    let bad = Demand::Json(json!({"type": "object", "properties": {"a": {"type": "wat"}}}));
    let e = compile_with(&g, &bad, false).unwrap_err();
    assert!(e.message.contains("cannot be enforced"), "{}", e.message);
}
