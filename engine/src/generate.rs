//! Single-sequence generation without a scheduler: what `laguna generate` and the tests use.
use crate::error::{EngineError, Result};
use crate::model::{DecodeItem, LogitRows, Model, StepInput};
use crate::sample::{sample, uniform_for, Rng, SamplingParams};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

impl FinishReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub ignore_eos: bool,
    pub stop_token_ids: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct GenerateResult {
    pub completion: Vec<u32>,
    pub finish_reason: FinishReason,
    /// Logits of every generated token's step, when asked for (tests).
    pub step_logits: Vec<Vec<f32>>,
}

/// Whether `tok` ends generation for this request.
pub fn is_stop(model: &dyn Model, req: &GenerateRequest, tok: u32) -> bool {
    (!req.ignore_eos && model.config().is_eos(tok)) || req.stop_token_ids.contains(&tok)
}

pub fn check_prompt(model: &dyn Model, prompt: &[u32]) -> Result<()> {
    if prompt.is_empty() {
        return Err(EngineError::Request(
            "the prompt is empty: give at least one token".into(),
        ));
    }
    let v = model.config().vocab_size as u32;
    if let Some(t) = prompt.iter().find(|&&t| t >= v) {
        return Err(EngineError::Request(format!(
            "prompt token id {t} is outside the vocabulary (size {v})"
        )));
    }
    Ok(())
}

/// The one-token steps of `generate` on a backend that pipelines them (`decode_launch` /
/// `decode_collect`), from the first sampled token `first` until a stop token or max_tokens;
/// the same tokens and Rng draws as one `decode_step` a token.
fn decode_pipelined(
    model: &mut dyn Model,
    req: &GenerateRequest,
    seq: crate::model::SeqId,
    first: u32,
    rng: &mut Rng,
    completion: &mut Vec<u32>,
) -> Result<FinishReason> {
    let item = |prev: Option<usize>, rng: &mut Rng| DecodeItem {
        seq,
        token: first,
        params: &req.sampling,
        u: uniform_for(&req.sampling, rng),
        prev,
    };
    model.decode_launch(&[item(None, rng)])?;
    loop {
        // Queue the step after the one in flight when its token may still be wanted.
        let ahead = completion.len() + 1 < req.max_tokens;
        if ahead {
            if let Err(e) = model.decode_launch(&[item(Some(0), rng)]) {
                let _ = model.decode_collect();
                return Err(e);
            }
        }
        let t = match model.decode_collect() {
            Ok(t) => t[0],
            Err(e) => {
                if ahead {
                    let _ = model.decode_collect();
                }
                return Err(e);
            }
        };
        completion.push(t);
        if is_stop(model, req, t) {
            if ahead {
                model.decode_collect()?;
            }
            return Ok(FinishReason::Stop);
        }
        if !ahead {
            return Ok(FinishReason::Length);
        }
    }
}

/// Plain autoregressive generation: prefill the prompt, then one token per step.
pub fn generate(
    model: &mut dyn Model,
    req: &GenerateRequest,
    keep_logits: bool,
) -> Result<GenerateResult> {
    check_prompt(model, &req.prompt)?;
    let mut rng = req
        .sampling
        .seed
        .map(Rng::new)
        .unwrap_or_else(Rng::from_entropy);
    let seq = model.new_seq()?;
    let res = (|| {
        let mut completion = vec![];
        let mut step_logits = vec![];
        let mut finish = FinishReason::Length;
        let mut input: Vec<u32> = req.prompt.clone();
        let mut pos = 0;
        // After the prompt, backends that sample on the device take the one-token steps without
        // sending the logits back (same choices: the uniform comes from the same Rng).
        let on_device = !keep_logits && model.device_sampling() >= 1;
        // Backends that pipeline decode steps queue the next step (fed on the device with the
        // token this one draws) before reading this one's token back; the last step queued
        // after a stop token is collected and dropped.
        let pipelined = on_device && model.decode_pipelined();
        while completion.len() < req.max_tokens {
            if pipelined && pos > 0 && input.len() == 1 {
                finish = decode_pipelined(model, req, seq, input[0], &mut rng, &mut completion)?;
                break;
            }
            let tok = if on_device && pos > 0 && input.len() == 1 {
                let t = model.decode_step(&[DecodeItem {
                    seq,
                    token: input[0],
                    params: &req.sampling,
                    u: uniform_for(&req.sampling, &mut rng),
                    prev: None,
                }])?[0];
                pos += 1;
                t
            } else {
                let out = model.forward(&[StepInput {
                    seq,
                    tokens: &input,
                    start_pos: pos,
                    logits: LogitRows::Last,
                }])?;
                pos += input.len();
                let logits = out[0].row(0);
                if keep_logits {
                    step_logits.push(logits.to_vec());
                }
                sample(logits, &req.sampling, &mut rng)
            };
            completion.push(tok);
            if is_stop(model, req, tok) {
                finish = FinishReason::Stop;
                break;
            }
            input = vec![tok];
        }
        Ok(GenerateResult {
            completion,
            finish_reason: finish,
            step_logits,
        })
    })();
    model.free_seq(seq);
    res
}
