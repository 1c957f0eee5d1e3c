//! Device sampling checks. `sample_rows` (temperature, top-k, top-p with the host's uniform) must
//! pick the token the host sampler picks on the same logits with the same Rng, over the grid of
//! `laguna_engine::sample_check` (which `laguna bench` runs too); and `generate` through the device
//! decode step (`Model::decode_step`, logits never leave the GPU) must produce what the
//! host-sampled path produces, token for token.

use anyhow::Result;
use laguna_engine::cuda::CudaModel;
use laguna_engine::generate::{generate, GenerateRequest};
use laguna_engine::model::Model;
use laguna_engine::sample::SamplingParams;
use laguna_engine::sample_check::{self, SampleCheck};

/// The device sampler against the host sampler over the grid of `laguna_engine::sample_check`.
pub fn logits_grid(m: &CudaModel, seed: u64) -> Result<SampleCheck> {
    let v = m.config().vocab_size;
    Ok(sample_check::grid(v, seed, |rows, items| {
        m.sample_logits(rows, items)
    })?)
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
