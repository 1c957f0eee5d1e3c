//! `tokenizer.json` through the `tokenizers` crate. Optional: a model folder without one still
//! runs when token ids are given.
use crate::error::{EngineError, Result};
use std::path::Path;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
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
        Ok(Some(Tokenizer { inner }))
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
