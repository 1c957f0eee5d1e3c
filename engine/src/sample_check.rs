//! The device sampler against the host sampler: a backend that samples on the device (with
//! [`sample_u`](crate::sample::sample_u)'s rule and the uniform the host hands it) must pick the
//! token [`sample`] picks on the same logits with the same [`Rng`], over a grid of parameters and
//! logit shapes. `laguna bench` and `laguna-dev device-test` both run it through the CUDA model's
//! `sample_logits`.
use crate::sample::{sample, Rng, SamplingParams};
use crate::Result;

/// Rows handed to the device sampler in one call (its batch limit).
const ROWS_PER_CALL: usize = 16;

/// The outcome of [`grid`].
pub struct SampleCheck {
    pub cases: usize,
    pub mismatches: usize,
    /// The first few mismatches, described.
    pub detail: Vec<String>,
}

fn normal(r: &mut Rng) -> f32 {
    let (a, b) = (r.uniform().max(1e-300), r.uniform());
    ((-2.0 * a.ln()).sqrt() * (2.0 * std::f64::consts::PI * b).cos()) as f32
}

/// Logit rows of width v: Gaussian at three scales, values on a coarse grid (many exact ties), and
/// one dominant token.
fn shapes(v: usize, seed: u64) -> Vec<(&'static str, Vec<f32>)> {
    let mut r = Rng::new(seed);
    let mut g = |s: f32| -> Vec<f32> { (0..v).map(|_| s * normal(&mut r)).collect() };
    let a = g(1.0);
    let b = g(4.0);
    let c = g(12.0);
    let ties: Vec<f32> = g(2.0).iter().map(|x| (x * 4.0).round() / 4.0).collect();
    let mut peak = g(1.0);
    peak[v / 3] += 20.0;
    vec![
        ("gauss1", a),
        ("gauss4", b),
        ("gauss12", c),
        ("ties", ties),
        ("peaked", peak),
    ]
}

/// The grid's cases: (shape index, params, Rng seed) over shape x temperature x top_k x top_p x
/// 3 seeds.
fn cases(v: usize, shapes: usize, seed: u64) -> Vec<(usize, SamplingParams, u64)> {
    let temps = [0.0f32, 0.3, 0.8, 1.0, 1.7];
    let top_ks = [0usize, 1, 5, 50, v + 3];
    let top_ps = [1.0f32, 0.95, 0.6, 0.1, 0.0];
    let mut out: Vec<(usize, SamplingParams, u64)> = vec![];
    for si in 0..shapes {
        for &t in &temps {
            for &k in &top_ks {
                for &p in &top_ps {
                    for d in 0..3u64 {
                        let s = seed
                            .wrapping_mul(0x9E3779B97F4A7C15)
                            .wrapping_add(out.len() as u64 * 7919 + d);
                        let sp = SamplingParams {
                            temperature: t,
                            top_k: k,
                            top_p: p,
                            seed: Some(s),
                        };
                        out.push((si, sp, s));
                    }
                }
            }
        }
    }
    out
}

/// Device draw vs host draw over the grid for a vocabulary of `v`. `device` samples up to 16
/// rows at once: each row's logits with its params and the uniform the host's `Rng` would
/// consume, returning one token per row.
pub fn grid<F>(v: usize, seed: u64, mut device: F) -> Result<SampleCheck>
where
    F: FnMut(&[&[f32]], &[(SamplingParams, f64)]) -> Result<Vec<u32>>,
{
    let rows = shapes(v, seed);
    let cases = cases(v, rows.len(), seed);
    let mut out = SampleCheck {
        cases: cases.len(),
        mismatches: 0,
        detail: vec![],
    };
    for chunk in cases.chunks(ROWS_PER_CALL) {
        let rs: Vec<&[f32]> = chunk.iter().map(|c| rows[c.0].1.as_slice()).collect();
        let items: Vec<(SamplingParams, f64)> = chunk
            .iter()
            .map(|c| (c.1.clone(), Rng::new(c.2).uniform()))
            .collect();
        let dev = device(&rs, &items)?;
        for (c, &t) in chunk.iter().zip(&dev) {
            let host = sample(&rows[c.0].1, &c.1, &mut Rng::new(c.2));
            if host != t {
                out.mismatches += 1;
                if out.detail.len() < 5 {
                    out.detail.push(format!(
                        "{} T={} top_k={} top_p={} seed={}: device {t}, host {host}",
                        rows[c.0].0, c.1.temperature, c.1.top_k, c.1.top_p, c.2
                    ));
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::sample_u;

    /// A sampler that follows `sample_u`'s rule with the handed uniform agrees on every case; one
    /// that always answers token 0 is caught.
    #[test]
    fn grid_passes_the_rule_and_catches_a_wrong_sampler() {
        let rule = |rows: &[&[f32]], items: &[(SamplingParams, f64)]| {
            Ok(rows
                .iter()
                .zip(items)
                .map(|(r, (p, u))| sample_u(r, p, *u))
                .collect())
        };
        let ok = grid(97, 11, rule).unwrap();
        assert_eq!(ok.cases, 5 * 5 * 5 * 5 * 3);
        assert_eq!(ok.mismatches, 0, "{:?}", ok.detail);
        let zero = |rows: &[&[f32]], _: &[(SamplingParams, f64)]| Ok(vec![0; rows.len()]);
        let bad = grid(97, 11, zero).unwrap();
        assert!(bad.mismatches > ok.cases / 2, "{}", bad.mismatches);
        assert_eq!(bad.detail.len(), 5);
    }
}
