//! The grammar module over the tiny-chat fixture's tokenizer (the Laguna layout: chat tags are
//! added tokens, EOS 2 and `</assistant>` 24): random walks through the masks must produce text
//! the grammar describes, checked here by parsing it independently.
use super::*;
use crate::sample::Rng;
use serde_json::Value as Json;

fn tokenizer() -> Option<Tokenizer> {
    let dir = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/models/tiny-chat"
    ));
    Tokenizer::from_dir(dir).ok().flatten()
}

fn env() -> Option<(GrammarEnv, Tokenizer)> {
    let tok = tokenizer()?;
    Some((GrammarEnv::new(&tok, 512, &[2, 24]).unwrap(), tok))
}

/// Sample uniformly among the allowed tokens until an EOS token; the tokens (EOS excluded).
fn random_walk(c: &mut Constraint, rng: &mut Rng, limit: usize) -> Vec<u32> {
    let mut out = vec![];
    for _ in 0..limit {
        let mut logits = vec![0.0f32; 512];
        c.apply(&mut logits).unwrap();
        let allowed: Vec<u32> = (0..512u32).filter(|&t| logits[t as usize] == 0.0).collect();
        assert!(!allowed.is_empty());
        let t = allowed[(rng.next_u64() % allowed.len() as u64) as usize];
        c.consume(t).unwrap();
        if t == 2 || t == 24 {
            assert!(c.is_stopped());
            return out;
        }
        out.push(t);
    }
    panic!(
        "no EOS within {limit} tokens: {:?}",
        out.iter().rev().take(20).collect::<Vec<_>>()
    );
}

#[test]
fn chat_tags_are_special_tokens() {
    let Some((g, _)) = env() else { return };
    for t in [
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "</arg_value>",
        "</think>",
    ] {
        assert!(g.is_special(t), "{t}");
    }
    assert!(!g.is_special("get_weather"));
    assert!(!g.is_special("<nope>"));
}

#[test]
fn special_tokens_are_forced_as_one_token() {
    let Some((g, _)) = env() else { return };
    let mut c = g
        .compile("start: <tool_call> \"hmm\" </tool_call>")
        .unwrap();
    let allowed: Vec<u32> = (0..512).filter(|&t| c.allows(t).unwrap()).collect();
    assert_eq!(allowed, vec![25], "only <tool_call> (25) may start");
    c.consume(25).unwrap();
    assert!(!c.allows(26).unwrap(), "the name comes first");
    assert!(
        c.consume(26).is_err(),
        "a token the grammar forbids is an error"
    );
}

#[test]
fn complete_grammar_allows_only_eos() {
    let Some((g, tok)) = env() else { return };
    let mut c = g.compile("start: \"Paris\"").unwrap();
    let ids = tok.encode("Paris", false).unwrap();
    for &t in &ids {
        c.consume(t).unwrap();
    }
    assert!(c.is_accepting());
    let allowed: Vec<u32> = (0..512).filter(|&t| c.allows(t).unwrap()).collect();
    assert_eq!(allowed, vec![2, 24]);
    c.consume(24).unwrap();
    assert!(c.is_stopped());
}

#[test]
fn apply_masks_exactly_the_disallowed_tokens() {
    let Some((g, _)) = env() else { return };
    let mut c = g.compile("start: %json {\"type\": \"integer\"}").unwrap();
    let row: Vec<f32> = (0..512).map(|i| (i % 7) as f32 - 3.0).collect();
    let m = c.masked(&row).unwrap();
    for t in 0..512u32 {
        let ok = c.allows(t).unwrap();
        assert_eq!(m[t as usize] == f32::NEG_INFINITY, !ok, "token {t}");
        if ok {
            assert_eq!(m[t as usize], row[t as usize]);
        }
    }
    let (n, secs) = c.stats().get();
    assert_eq!(n, 1, "the mask of one state is computed once");
    assert!(secs >= 0.0);
}

fn schema() -> Json {
    serde_json::json!({
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": -5, "maximum": 500},
            "color": {"enum": ["red", "green"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
            "ok": {"type": "boolean"}
        },
        "required": ["n", "color"],
        "additionalProperties": false
    })
}

/// An independent check of `schema()`.
fn valid(v: &Json) -> bool {
    let Some(o) = v.as_object() else { return false };
    let n_ok = o
        .get("n")
        .and_then(Json::as_i64)
        .is_some_and(|n| (-5..=500).contains(&n));
    let color_ok = matches!(o.get("color").and_then(Json::as_str), Some("red" | "green"));
    let tags_ok = o.get("tags").is_none_or(|t| {
        t.as_array().is_some_and(|a| {
            a.len() <= 3
                && a.iter()
                    .all(|s| s.as_str().is_some_and(|s| s.chars().count() <= 4))
        })
    });
    let ok_ok = o.get("ok").is_none_or(Json::is_boolean);
    let keys_ok = o
        .keys()
        .all(|k| ["n", "color", "tags", "ok"].contains(&k.as_str()));
    n_ok && color_ok && tags_ok && ok_ok && keys_ok
}

#[test]
fn random_walks_through_a_json_schema_validate() {
    let Some((g, tok)) = env() else { return };
    let lark = format!("start: %json {}", schema());
    for seed in 0..12 {
        let mut c = g.compile(&lark).unwrap();
        let ids = random_walk(&mut c, &mut Rng::new(seed), 4000);
        let text = tok.decode(&ids, false).unwrap();
        let v: Json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(valid(&v), "seed {seed}: {text}");
    }
}

#[test]
fn invalid_grammars_and_schemas_are_errors() {
    let Some((g, _)) = env() else { return };
    let e = g
        .compile("start: %json {\"type\": \"frobnicate\"}")
        .unwrap_err();
    assert!(!e.is_empty());
    assert!(g.compile("start: (").is_err());
    assert!(g.compile("start: <no_such_tag>").is_err());
}
