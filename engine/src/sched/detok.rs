//! Incremental detokenization (UTF-8 safe) and stop-string matching for one request.
use crate::tokenizer::Tokenizer;

/// Turns a growing list of token ids into text deltas. Like vLLM/TGI: decode a short window
/// `ids[prefix..]` and emit what grew past `ids[prefix..read]`, holding back while the text ends
/// in an incomplete UTF-8 sequence (U+FFFD).
pub struct Detokenizer {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
    skip_special: bool,
}

impl Detokenizer {
    pub fn new(skip_special: bool) -> Detokenizer {
        Detokenizer {
            ids: vec![],
            prefix: 0,
            read: 0,
            skip_special,
        }
    }

    pub fn push(&mut self, tok: &Tokenizer, new: &[u32]) -> String {
        self.ids.extend_from_slice(new);
        let before = tok
            .decode(&self.ids[self.prefix..self.read], self.skip_special)
            .unwrap_or_default();
        let after = tok
            .decode(&self.ids[self.prefix..], self.skip_special)
            .unwrap_or_default();
        if after.len() > before.len() && !after.ends_with('\u{FFFD}') {
            let delta = match after.get(before.len()..) {
                Some(d) if after.starts_with(&before) => d.to_string(),
                // The window re-decoded differently (rare); fall back to the new tail.
                _ => after.chars().skip(before.chars().count()).collect(),
            };
            self.prefix = self.read;
            self.read = self.ids.len();
            delta
        } else {
            String::new()
        }
    }

    /// Whatever is still held back (an incomplete character at the very end).
    pub fn flush(&mut self, tok: &Tokenizer) -> String {
        if self.read == self.ids.len() {
            return String::new();
        }
        let before = tok
            .decode(&self.ids[self.prefix..self.read], self.skip_special)
            .unwrap_or_default();
        let after = tok
            .decode(&self.ids[self.prefix..], self.skip_special)
            .unwrap_or_default();
        self.prefix = self.read;
        self.read = self.ids.len();
        after.get(before.len()..).unwrap_or("").to_string()
    }
}

/// Holds back text that could be the start of a stop string.
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

pub enum StopCheck {
    /// Text safe to emit now.
    Emit(String),
    /// A stop string matched: the text before it, and the stop string.
    Stopped(String, String),
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    pub fn push(&mut self, delta: &str) -> StopCheck {
        if self.stops.is_empty() {
            return StopCheck::Emit(delta.to_string());
        }
        self.pending.push_str(delta);
        // Earliest match wins.
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|p| (p, s.clone())))
            .min_by_key(|(p, _)| *p);
        if let Some((p, s)) = hit {
            let before = self.pending[..p].to_string();
            self.pending.clear();
            return StopCheck::Stopped(before, s);
        }
        // Keep the longest suffix that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                let pre = &s[..i];
                if i > keep && self.pending.ends_with(pre) {
                    keep = i;
                }
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopCheck::Emit(out)
    }

    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], parts: &[&str]) -> (String, Option<String>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in parts {
            match m.push(p) {
                StopCheck::Emit(t) => out.push_str(&t),
                StopCheck::Stopped(t, s) => {
                    out.push_str(&t);
                    return (out, Some(s));
                }
            }
        }
        out.push_str(&m.flush());
        (out, None)
    }

    /// Token-by-token deltas concatenate to the full decode, multi-byte characters included.
    #[test]
    fn incremental_decode_matches_full_decode() {
        let dir = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/models/tiny-chat"
        ));
        let Ok(Some(tok)) = Tokenizer::from_dir(dir) else {
            eprintln!("skipping: no tiny-chat tokenizer");
            return;
        };
        for text in [
            "café 中国 😀\n\n\tx",
            "<think>hmm</think> Hello world!",
            "fn main() {\n    println!(\"é\");\n}",
        ] {
            let ids = tok.encode(text, false).unwrap();
            for skip in [true, false] {
                let mut d = Detokenizer::new(skip);
                let mut out = String::new();
                for id in &ids {
                    let delta = d.push(&tok, &[*id]);
                    assert!(
                        !delta.contains('\u{FFFD}'),
                        "{text:?}: partial character leaked: {delta:?}"
                    );
                    out += &delta;
                }
                out += &d.flush(&tok);
                assert_eq!(out, tok.decode(&ids, skip).unwrap(), "{text:?}");
            }
        }
    }

    #[test]
    fn stop_strings_across_deltas() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "D tail"]),
            ("abc ".to_string(), Some("END".to_string()))
        );
        assert_eq!(run(&["END"], &["abc E", "x"]), ("abc Ex".to_string(), None));
        assert_eq!(
            run(&["\n\n", "stop"], &["a\n", "b s", "to", "p"]),
            ("a\nb ".to_string(), Some("stop".to_string()))
        );
        assert_eq!(run(&[], &["a", "b"]), ("ab".to_string(), None));
        assert_eq!(
            run(&["é!"], &["café", "!"]),
            ("caf".to_string(), Some("é!".to_string()))
        );
    }
}
