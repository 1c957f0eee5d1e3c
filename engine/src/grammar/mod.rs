//! Constrained decoding: llguidance grammars over the model's vocabulary.
//!
//! [`GrammarEnv`] is built once per tokenizer (the token trie, llguidance's parser factory);
//! [`GrammarEnv::compile`] turns a Lark grammar (llguidance's dialect: `%json {...}` for JSON
//! schemas, `<tag>` for special tokens) into a [`Constraint`], the per-sequence matcher the
//! scheduler owns. Each step: [`Constraint::prepare`] computes the allowed-token mask for the
//! current state (the scheduler runs it while the forward pass runs), [`Constraint::apply`] sets
//! the disallowed logits to -inf before sampling, [`Constraint::consume`] advances the matcher by
//! the sampled token. Once the grammar is complete only the EOS tokens are allowed.
//!
//! Token bytes: every added token written `<...>` (`<tool_call>`, `</think>`, `</assistant>`...)
//! is a special token in the trie, so a grammar names it as one token and free-text parts of a
//! grammar cannot produce it; ids past the tokenizer (a padded vocabulary) are never allowed.
use crate::error::{EngineError, Result};
use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[cfg(test)]
mod tests;

/// The token trie over the model's vocabulary plus the tokenizer, for llguidance.
struct LagunaTokEnv {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for LagunaTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let n = self.trie.vocab_size() as u32;
        self.trie.tokenize_with_greedy_fallback(s, |s| {
            match self.tokenizer.encode(s, false) {
                // Ids past the model's vocabulary (a tokenizer larger than the model): the
                // trie's own tokenization instead.
                Ok(e) if e.get_ids().iter().all(|&t| t < n) => e.get_ids().to_vec(),
                _ => self.trie.greedy_tokenize(s.as_bytes()),
            }
        })
    }
}

/// Compiles grammars for one model: built once, shared by every request.
pub struct GrammarEnv {
    factory: ParserFactory,
}

impl std::fmt::Debug for GrammarEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GrammarEnv({} tokens)",
            self.factory.tok_env().tok_trie().vocab_size()
        )
    }
}

fn gerr(e: impl std::fmt::Display) -> EngineError {
    EngineError::Other(format!("grammar: {e}"))
}

/// The bytes each token id stands for, `vocab_size` of them (the model's logits width).
fn token_bytes(tok: &Tokenizer, vocab_size: usize) -> Result<Vec<Vec<u8>>> {
    let json: serde_json::Value = serde_json::from_str(
        &tok.inner()
            .to_string(false)
            .map_err(|e| gerr(format!("serialising the tokenizer: {e}")))?,
    )
    .map_err(gerr)?;
    let mut bytes = llguidance::token_bytes_from_tokenizer_json(&json).map_err(gerr)?;
    // Ids past the model's vocabulary can never be sampled: left out.
    bytes.truncate(vocab_size);
    // Added tokens written <...> are tags of the chat format: special (one token, never text).
    for (id, t) in tok.inner().get_added_tokens_decoder() {
        let c = &t.content;
        let Some(b) = bytes.get_mut(id as usize) else {
            continue;
        };
        if c.starts_with('<')
            && c.ends_with('>')
            && b.first() != Some(&TokTrie::SPECIAL_TOKEN_MARKER)
        {
            b.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
        }
    }
    // Padded ids the tokenizer does not know: special placeholders no grammar names.
    for id in bytes.len()..vocab_size {
        let mut b = format!(".<[{id}]>").into_bytes();
        b[0] = TokTrie::SPECIAL_TOKEN_MARKER;
        bytes.push(b);
    }
    Ok(bytes)
}

impl GrammarEnv {
    /// `vocab_size`: the model's logits width; `eos`: the tokens that end a sequence (allowed
    /// once the grammar is complete).
    pub fn new(tok: &Tokenizer, vocab_size: usize, eos: &[u32]) -> Result<GrammarEnv> {
        let Some(&first) = eos.first() else {
            return Err(gerr("the model has no EOS token"));
        };
        let words = token_bytes(tok, vocab_size)?;
        let info = TokRxInfo::new(vocab_size as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(LagunaTokEnv {
            trie,
            tokenizer: tok.inner().clone(),
        });
        let mut factory = ParserFactory::new_simple(&env).map_err(gerr)?;
        factory.quiet();
        Ok(GrammarEnv { factory })
    }

    /// Whether `text` is one special token (a chat-format tag such as `<tool_call>`).
    pub fn is_special(&self, text: &str) -> bool {
        self.factory
            .tok_env()
            .tok_trie()
            .get_special_token(text)
            .is_some()
    }

    /// Compile a Lark grammar into a fresh matcher; the error names what is wrong with it.
    pub fn compile(&self, lark: &str) -> std::result::Result<Constraint, String> {
        let parser = self
            .factory
            .create_parser(TopLevelGrammar::from_lark(lark.to_string()))
            .map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(Constraint {
            matcher,
            mask: None,
            stats: Arc::new(MaskStats::default()),
        })
    }
}

/// Time spent computing masks, shared with whoever asked for the constraint (`laguna bench`).
#[derive(Debug, Default)]
pub struct MaskStats {
    nanos: AtomicU64,
    count: AtomicU64,
}

impl MaskStats {
    /// Masks computed and their total time in seconds.
    pub fn get(&self) -> (u64, f64) {
        (
            self.count.load(Ordering::Relaxed),
            self.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        )
    }
}

/// One sequence's grammar state: the matcher and the mask of its current state, once computed.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    mask: Option<SimpleVob>,
    stats: Arc<MaskStats>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .field("mask_ready", &self.mask.is_some())
            .finish()
    }
}

impl Constraint {
    pub fn stats(&self) -> Arc<MaskStats> {
        self.stats.clone()
    }

    /// Whether the mask of the current state is computed (`apply` then costs only the -inf pass).
    pub fn is_prepared(&self) -> bool {
        self.mask.is_some()
    }

    /// Compute the allowed tokens of the current state (once; `consume` invalidates it). When
    /// the grammar is complete that is the EOS tokens.
    pub fn prepare(&mut self) -> Result<()> {
        if self.mask.is_some() {
            return Ok(());
        }
        let t = Instant::now();
        let m = self.matcher.compute_mask_or_eos().map_err(gerr)?;
        self.stats
            .nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.stats.count.fetch_add(1, Ordering::Relaxed);
        if m.is_zero() {
            return Err(gerr("no token can continue the output"));
        }
        self.mask = Some(m);
        Ok(())
    }

    /// Whether the grammar lets `tok` come next.
    pub fn allows(&mut self, tok: u32) -> Result<bool> {
        self.prepare()?;
        let m = self.mask.as_ref().expect("prepared");
        Ok((tok as usize) < m.len() && m.is_allowed(tok))
    }

    /// Set every logit the grammar does not allow next to -inf.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<()> {
        self.prepare()?;
        let m = self.mask.as_ref().expect("prepared");
        for (w, chunk) in m.as_slice().iter().zip(logits.chunks_mut(32)) {
            if *w == u32::MAX {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if w & (1 << b) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        // Logits past the mask (none when the mask covers the vocabulary) are not allowed.
        for l in logits.iter_mut().skip(m.as_slice().len() * 32) {
            *l = f32::NEG_INFINITY;
        }
        Ok(())
    }

    /// `logits` with the mask applied, as a new row.
    pub fn masked(&mut self, logits: &[f32]) -> Result<Vec<f32>> {
        let mut v = logits.to_vec();
        self.apply(&mut v)?;
        Ok(v)
    }

    /// Advance by the token that was emitted; an error when the grammar does not allow it.
    pub fn consume(&mut self, tok: u32) -> Result<()> {
        if self.matcher.is_stopped() {
            // Complete and ended (EOS consumed): nothing follows.
            self.mask = None;
            return Ok(());
        }
        self.mask = None;
        self.matcher.consume_token(tok).map_err(gerr)
    }

    /// The grammar is complete: the output may end here.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }

    /// The grammar can take no more tokens (it ended, or only EOS may follow).
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }
}

/// Run `f` (a forward pass) while another thread computes the masks of these constraints'
/// current states, so that sampling after it only applies them. Errors resurface (and fail the
/// sequence) when a mask is applied.
pub fn prepare_beside<T>(cs: Vec<&mut Constraint>, f: impl FnOnce() -> T) -> T {
    let cs: Vec<&mut Constraint> = cs.into_iter().filter(|c| !c.is_prepared()).collect();
    if cs.is_empty() {
        return f();
    }
    std::thread::scope(|s| {
        let h = s.spawn(move || {
            for c in cs {
                let _ = c.prepare();
            }
        });
        let out = f();
        let _ = h.join();
        out
    })
}
