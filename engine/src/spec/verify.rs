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
use crate::sample::argmax;
use crate::sample::{draw, probs, Rng, SamplingParams};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Number of draft tokens accepted (0..=k).
    pub accepted: usize,
    /// The emitted tokens: the accepted drafts, then the correction/bonus token (`accepted + 1`).
    pub tokens: Vec<u32>,
}

/// `rows[i]` are the target logits at verify row i (k+1 rows for k drafts).
pub fn verify(drafts: &[u32], rows: &[&[f32]], params: &SamplingParams, rng: &mut Rng) -> Verdict {
    assert_eq!(
        rows.len(),
        drafts.len() + 1,
        "verify needs k+1 target rows for k drafts"
    );
    if params.is_greedy() {
        return verify_greedy(drafts, rows);
    }
    let mut tokens = Vec::with_capacity(drafts.len() + 1);
    for (i, &d) in drafts.iter().enumerate() {
        let p = probs(rows[i], params);
        let u = rng.uniform();
        let pd = p.get(d as usize).copied().unwrap_or(0.0);
        if pd > 0.0 && pd >= u {
            tokens.push(d);
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
        tokens.push(draw(&q, rng) as u32);
        return Verdict {
            accepted: i,
            tokens,
        };
    }
    let p = probs(rows[drafts.len()], params);
    tokens.push(draw(&p, rng) as u32);
    Verdict {
        accepted: drafts.len(),
        tokens,
    }
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
}
