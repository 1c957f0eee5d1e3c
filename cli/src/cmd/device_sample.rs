//! Device sampling checks. `sample_rows` (temperature, top-k, top-p with the host's uniform) must
//! pick the token the host sampler (`laguna_engine::sample::sample`) picks on the same logits with
//! the same Rng, over a grid of parameters and logit shapes; and `generate` through the device
//! decode step (`Model::decode_step`, logits never leave the GPU) must produce what the
//! host-sampled path produces, token for token.

use anyhow::Result;
use laguna_engine::cuda::CudaModel;
use laguna_engine::generate::{generate, GenerateRequest};
use laguna_engine::model::Model;
use laguna_engine::sample::{sample, Rng, SamplingParams};

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

/// Device draw vs host draw over (shape x temperature x top_k x top_p x 3 uniforms).
pub fn logits_grid(m: &CudaModel, seed: u64) -> Result<SampleCheck> {
    let v = m.config().vocab_size;
    let temps = [0.0f32, 0.3, 0.8, 1.0, 1.7];
    let top_ks = [0usize, 1, 5, 50, v + 3];
    let top_ps = [1.0f32, 0.95, 0.6, 0.1, 0.0];
    let mut cases: Vec<(usize, SamplingParams, u64)> = vec![];
    let rows = shapes(v, seed);
    for si in 0..rows.len() {
        for &t in &temps {
            for &k in &top_ks {
                for &p in &top_ps {
                    for d in 0..3u64 {
                        let s = seed
                            .wrapping_mul(0x9E3779B97F4A7C15)
                            .wrapping_add(cases.len() as u64 * 7919 + d);
                        cases.push((
                            si,
                            SamplingParams {
                                temperature: t,
                                top_k: k,
                                top_p: p,
                                seed: Some(s),
                            },
                            s,
                        ));
                    }
                }
            }
        }
    }
    let mut out = SampleCheck {
        cases: cases.len(),
        mismatches: 0,
        detail: vec![],
    };
    for chunk in cases.chunks(16) {
        let rs: Vec<&[f32]> = chunk.iter().map(|c| rows[c.0].1.as_slice()).collect();
        let items: Vec<(SamplingParams, f64)> = chunk
            .iter()
            .map(|c| (c.1.clone(), Rng::new(c.2).uniform()))
            .collect();
        let dev = m.sample_logits(&rs, &items)?;
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

/// `generate` with device sampling (decode_step) against the host-sampled path (forward + sample)
/// on the same model: identical completions for greedy and seeded sampling. Returns the number
/// of parameter sets that differed and a description of the first.
pub fn generate_same(
    m: &mut CudaModel,
    prompt: &[u32],
    n: usize,
) -> Result<(usize, usize, String)> {
    if m.device_sampling() == 0 {
        anyhow::bail!("this model does not sample on the device");
    }
    let sets = [
        (0.0f32, 0usize, 1.0f32, 0u64),
        (0.8, 0, 0.9, 1),
        (1.2, 20, 1.0, 2),
        (0.5, 0, 1.0, 3),
        (1.0, 40, 0.8, 4),
    ];
    let mut bad = 0;
    let mut first = String::new();
    for &(t, k, p, s) in &sets {
        let req = GenerateRequest {
            prompt: prompt.to_vec(),
            max_tokens: n,
            sampling: SamplingParams {
                temperature: t,
                top_k: k,
                top_p: p,
                seed: Some(s),
            },
            ignore_eos: true,
            stop_token_ids: vec![],
        };
        let host = generate(m, &req, true)?.completion;
        let dev = generate(m, &req, false)?.completion;
        if host != dev {
            bad += 1;
            if first.is_empty() {
                first = format!("T={t} top_k={k} top_p={p} seed={s}: host {host:?} device {dev:?}");
            }
        }
    }
    Ok((sets.len(), bad, first))
}
