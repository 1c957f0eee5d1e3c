//! Verification of k draft tokens against the target's k+1 logits rows (vLLM `rejection_sampler.py`).
//!
//! * Greedy: keep the longest prefix with `d_i == argmax L_{i-1}`, then emit `argmax L_a`
//!   (correction, or bonus after full acceptance).
//! * Temperature > 0, draft without probabilities (DFlash drafts are argmax tokens; vLLM treats the
//!   draft distribution as one-hot): `p_i = probs(L_i)` with the same temperature / top-k / top-p
//!   processing as plain sampling; accept `d_i` iff `p_{i-1}(d_i) >= u_i`, `u_i ~ U[0,1)`
//!   (`p > 0` required); on the first rejection emit a token from `p_{i-1}` with `d_i` removed
//!   (renormalised) and stop; after full acceptance emit a bonus token from `p_k`.
//!   Every emitted token is therefore distributed exactly as plain sampling would draw it.
//! * With a grammar ([`verify_constrained`]): row i is masked with the grammar's state after the
//!   tokens accepted before it, and every emitted token advances the grammar. A draft the grammar
//!   forbids has probability 0 under the masked row (greedy: is never its argmax), so it is
//!   rejected like a mismatch, and the output is what constrained decoding without the draft
//!   gives (greedy: the same tokens).
use crate::error::Result;
use crate::grammar::Constraint;
use crate::sample::argmax;
use crate::sample::{draw, probs, Rng, SamplingParams};
use std::borrow::Cow;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Number of draft tokens accepted (0..=k).
    pub accepted: usize,
    /// The emitted tokens: the accepted drafts, then the correction/bonus token (`accepted + 1`).
    pub tokens: Vec<u32>,
}

/// `rows[i]` are the target logits at verify row i (k+1 rows for k drafts).
pub fn verify(drafts: &[u32], rows: &[&[f32]], params: &SamplingParams, rng: &mut Rng) -> Verdict {
    if params.is_greedy() {
        assert_eq!(
            rows.len(),
            drafts.len() + 1,
            "verify needs k+1 target rows for k drafts"
        );
        return verify_greedy(drafts, rows);
    }
    verify_with(drafts, rows, params, rng, None).expect("no grammar, no error")
}

/// `verify` under a grammar, which is advanced by every emitted token. Errors come from the
/// grammar (a state no token can continue).
pub fn verify_constrained(
    drafts: &[u32],
    rows: &[&[f32]],
    params: &SamplingParams,
    rng: &mut Rng,
    grammar: &mut Constraint,
) -> Result<Verdict> {
    verify_with(drafts, rows, params, rng, Some(grammar))
}

fn verify_with(
    drafts: &[u32],
    rows: &[&[f32]],
    params: &SamplingParams,
    rng: &mut Rng,
    mut grammar: Option<&mut Constraint>,
) -> Result<Verdict> {
    assert_eq!(
        rows.len(),
        drafts.len() + 1,
        "verify needs k+1 target rows for k drafts"
    );
    let mut tokens = Vec::with_capacity(drafts.len() + 1);
    for (i, &d) in drafts.iter().enumerate() {
        let r = masked(grammar.as_deref_mut(), rows[i])?;
        if params.is_greedy() {
            let t = argmax(&r) as u32;
            emit(grammar.as_deref_mut(), &mut tokens, t)?;
            if t != d {
                return Ok(Verdict {
                    accepted: i,
                    tokens,
                });
            }
            continue;
        }
        let p = probs(&r, params);
        let u = rng.uniform();
        let pd = p.get(d as usize).copied().unwrap_or(0.0);
        if pd > 0.0 && pd >= u {
            emit(grammar.as_deref_mut(), &mut tokens, d)?;
            continue;
        }
        // Recovered token: p with the draft token removed, renormalised.
        let mut q = p;
        if let Some(x) = q.get_mut(d as usize) {
            *x = 0.0;
        }
        let s: f64 = q.iter().sum();
        if s > 0.0 {
            for x in q.iter_mut() {
                *x /= s;
            }
        }
        let t = draw(&q, rng) as u32;
        emit(grammar.as_deref_mut(), &mut tokens, t)?;
        return Ok(Verdict {
            accepted: i,
            tokens,
        });
    }
    let r = masked(grammar.as_deref_mut(), rows[drafts.len()])?;
    let t = if params.is_greedy() {
        argmax(&r) as u32
    } else {
        draw(&probs(&r, params), rng) as u32
    };
    emit(grammar.as_deref_mut(), &mut tokens, t)?;
    Ok(Verdict {
        accepted: drafts.len(),
        tokens,
    })
}

/// A row as sampling sees it: masked by the grammar's current state.
fn masked<'a>(g: Option<&mut Constraint>, row: &'a [f32]) -> Result<Cow<'a, [f32]>> {
    Ok(match g {
        Some(c) => Cow::Owned(c.masked(row)?),
        None => Cow::Borrowed(row),
    })
}

/// Append an emitted token, advancing the grammar.
fn emit(g: Option<&mut Constraint>, tokens: &mut Vec<u32>, t: u32) -> Result<()> {
    if let Some(c) = g {
        c.consume(t)?;
    }
    tokens.push(t);
    Ok(())
}

pub fn verify_greedy(drafts: &[u32], rows: &[&[f32]]) -> Verdict {
    let mut tokens = Vec::with_capacity(drafts.len() + 1);
    for (i, &d) in drafts.iter().enumerate() {
        let g = argmax(rows[i]) as u32;
        if g != d {
            tokens.push(g);
            return Verdict {
                accepted: i,
                tokens,
            };
        }
        tokens.push(d);
    }
    tokens.push(argmax(rows[drafts.len()]) as u32);
    Verdict {
        accepted: drafts.len(),
        tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_prefix_and_bonus() {
        let r0 = [0.0f32, 1.0, 0.0];
        let r1 = [2.0f32, 1.0, 0.0];
        let r2 = [0.0f32, 0.0, 3.0];
        let rows: Vec<&[f32]> = vec![&r0, &r1, &r2];
        assert_eq!(
            verify_greedy(&[1, 0], &rows),
            Verdict {
                accepted: 2,
                tokens: vec![1, 0, 2]
            }
        );
        assert_eq!(
            verify_greedy(&[1, 2], &rows),
            Verdict {
                accepted: 1,
                tokens: vec![1, 0]
            }
        );
        assert_eq!(
            verify_greedy(&[2, 0], &rows),
            Verdict {
                accepted: 0,
                tokens: vec![1]
            }
        );
    }

    #[test]
    fn one_hot_rejection_preserves_the_target_distribution() {
        // Single position: emitted token must be distributed as p whatever the draft is.
        let logits = [0.5f32, 1.5, -0.3, 0.9];
        let params = SamplingParams {
            temperature: 0.8,
            top_k: 3,
            top_p: 0.95,
            seed: None,
        };
        let p = probs(&logits, &params);
        let mut rng = Rng::new(11);
        let n = 200_000;
        for d in 0..4u32 {
            let mut c = [0usize; 4];
            for _ in 0..n {
                let v = verify(&[d], &[&logits, &logits], &params, &mut rng);
                c[v.tokens[0] as usize] += 1;
            }
            for i in 0..4 {
                let f = c[i] as f64 / n as f64;
                assert!(
                    (f - p[i]).abs() < 0.005,
                    "draft {d}: token {i} freq {f} vs p {}",
                    p[i]
                );
            }
        }
    }

    /// A grammar over the tiny-chat tokenizer allowing "a" or "b" then EOS (2, 24).
    fn ab() -> Option<(Constraint, u32, u32)> {
        let dir = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/models/tiny-chat"
        ));
        let tok = crate::tokenizer::Tokenizer::from_dir(dir).ok().flatten()?;
        let env = crate::grammar::GrammarEnv::new(&tok, 512, &[2, 24]).unwrap();
        let c = env.compile("start: \"a\" | \"b\"").unwrap();
        Some((c, tok.token_to_id("a")?, tok.token_to_id("b")?))
    }

    #[test]
    fn constrained_greedy_rejects_forbidden_drafts() {
        let Some((g, a, b)) = ab() else { return };
        let x = 7u32; // forbidden, and the raw argmax of row 0
        let mut r0 = vec![0.0f32; 512];
        r0[x as usize] = 9.0;
        r0[a as usize] = 2.0;
        r0[b as usize] = 1.0;
        let mut r1 = vec![0.0f32; 512];
        r1[x as usize] = 9.0;
        r1[24] = 1.0;
        let rows: Vec<&[f32]> = vec![&r0, &r1];
        let p = SamplingParams::greedy();
        let mut rng = Rng::new(1);
        let v = verify_constrained(&[x], &rows, &p, &mut rng, &mut g.clone()).unwrap();
        assert_eq!(
            v,
            Verdict {
                accepted: 0,
                tokens: vec![a]
            }
        );
        let v = verify_constrained(&[a], &rows, &p, &mut rng, &mut g.clone()).unwrap();
        assert_eq!(
            v,
            Verdict {
                accepted: 1,
                tokens: vec![a, 24]
            },
            "after \"a\" only EOS"
        );
        // Unconstrained, the forbidden draft is the argmax and accepted.
        assert_eq!(verify(&[x], &rows, &p, &mut rng).accepted, 1);
    }

    #[test]
    fn constrained_rejection_samples_the_masked_distribution() {
        let Some((g, a, b)) = ab() else { return };
        let mut row = vec![0.0f32; 512];
        row[a as usize] = 0.5;
        row[b as usize] = -0.2;
        row[7] = 3.0; // forbidden: must never come out
        let params = SamplingParams {
            temperature: 0.9,
            top_k: 0,
            top_p: 1.0,
            seed: None,
        };
        let masked = g.clone().masked(&row).unwrap();
        let p = probs(&masked, &params);
        let eos = vec![0.0f32; 512];
        let rows: Vec<&[f32]> = vec![&row, &eos];
        let mut rng = Rng::new(5);
        let n = 20_000;
        for d in [a, b, 7] {
            let (mut ca, mut cb) = (0usize, 0usize);
            for _ in 0..n {
                let v = verify_constrained(&[d], &rows, &params, &mut rng, &mut g.clone()).unwrap();
                match v.tokens[0] {
                    t if t == a => ca += 1,
                    t if t == b => cb += 1,
                    t => panic!("draft {d}: emitted {t}, which the grammar forbids"),
                }
            }
            let fa = ca as f64 / n as f64;
            assert!(
                (fa - p[a as usize]).abs() < 0.015,
                "draft {d}: a {fa} vs {}",
                p[a as usize]
            );
            assert_eq!(ca + cb, n);
        }
    }
}
