//! `tokenizer.json` through the `tokenizers` crate. Optional: a model folder without one still
//! runs when token ids are given.
use crate::error::{EngineError, Result};
use std::path::Path;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    max_token_bytes: Option<usize>,
}

impl Tokenizer {
    /// `Ok(None)` when the folder has no tokenizer.json.
    pub fn from_dir(dir: &Path) -> Result<Option<Tokenizer>> {
        let p = dir.join("tokenizer.json");
        if !p.exists() {
            return Ok(None);
        }
        let inner = tokenizers::Tokenizer::from_file(&p)
            .map_err(|e| EngineError::Tokenizer(format!("{}: {e}", p.display())))?;
        let max_token_bytes = max_token_bytes(&inner);
        Ok(Some(Tokenizer {
            inner,
            max_token_bytes,
        }))
    }

    /// The most bytes of input text one token can stand for, when that is provable: no normalizer
    /// (one could shrink the text), pre-tokenizers that only split or map bytes (none that drops
    /// characters), no added token that strips whitespace around it. Then a text of `n` bytes
    /// encodes to at least `n / max_token_bytes` tokens, which lets the server refuse a prompt far
    /// over the context before tokenizing it. The length of a vocabulary string in UTF-8 is at
    /// least the bytes it matches (a byte-level char is 1-2 UTF-8 bytes for one input byte, `▁` is
    /// 3 bytes for one space); 4 covers an unknown token, which stands for one char.
    pub fn max_token_bytes(&self) -> Option<usize> {
        self.max_token_bytes
    }

    /// Encode text; `add_special` adds the post-processor's tokens (a rendered chat prompt must not).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    pub fn token_to_id(&self, tok: &str) -> Option<u32> {
        self.inner.token_to_id(tok)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

fn max_token_bytes(t: &tokenizers::Tokenizer) -> Option<usize> {
    if t.get_normalizer().is_some() {
        return None;
    }
    if let Some(p) = t.get_pre_tokenizer() {
        let v = serde_json::to_value(p).ok()?;
        if !pre_tokenizer_keeps_bytes(&v) {
            return None;
        }
    }
    let added = t.get_added_tokens_decoder();
    if added.values().any(|a| a.lstrip || a.rstrip) {
        return None;
    }
    let vocab = t.get_vocab(true).into_keys().map(|s| s.len());
    let added = added.values().map(|a| a.content.len());
    vocab.chain(added).max().map(|m| m.max(4))
}

/// Whether a pre-tokenizer (as its JSON) keeps every input byte: Split without `Removed`,
/// ByteLevel, Digits, Punctuation, and sequences of these.
fn pre_tokenizer_keeps_bytes(v: &serde_json::Value) -> bool {
    match v.get("type").and_then(|t| t.as_str()) {
        Some("Sequence") => v
            .get("pretokenizers")
            .and_then(|p| p.as_array())
            .is_some_and(|ps| ps.iter().all(pre_tokenizer_keeps_bytes)),
        Some("Split") => v.get("behavior").and_then(|b| b.as_str()) != Some("Removed"),
        Some("ByteLevel" | "Digits" | "Punctuation") => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Tokenizer {
        let dir = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/models/tiny-chat"
        ));
        Tokenizer::from_dir(dir).unwrap().unwrap()
    }

    /// The bound holds on texts built to pack many bytes into few tokens: every vocabulary
    /// entry (the longest ones included), repeated, and random bytes.
    #[test]
    fn max_token_bytes_bounds_real_encodings() {
        let t = tiny();
        let m = t
            .max_token_bytes()
            .expect("a byte-level BPE without normalizer is bounded");
        let mut texts: Vec<String> = vec![];
        let vocab = t.inner().get_vocab(true);
        let mut entries: Vec<u32> = vocab.values().copied().collect();
        entries.sort();
        let decoded: Vec<String> = entries
            .iter()
            .map(|&id| t.decode(&[id], false).unwrap_or_default())
            .collect();
        texts.push(decoded.concat());
        let longest = decoded.iter().max_by_key(|s| s.len()).unwrap().clone();
        texts.push(longest.repeat(50));
        texts.push(" ".repeat(5000));
        texts.push("\n".repeat(5000));
        texts.push("aaaa ".repeat(1000));
        let mut x: u64 = 7;
        let rand: String = (0..20000)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                char::from_u32((x >> 33) as u32 % 0x3000).unwrap_or('?')
            })
            .collect();
        texts.push(rand);
        for s in &texts {
            let n = t.encode(s, false).unwrap().len();
            assert!(
                n * m >= s.len(),
                "{} bytes in {n} tokens with bound {m}",
                s.len()
            );
        }
    }
}
