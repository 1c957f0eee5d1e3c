use anyhow::{bail, Context, Result};
use laguna_engine::backend::{self, Device, LoadOptions};
use laguna_engine::generate::GenerateRequest;
use laguna_engine::sample::SamplingParams;
use laguna_engine::tokenizer::Tokenizer;
use laguna_stages::recipe::SpecK;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Model folder (config.json, *.safetensors, optional tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// cpu or cuda.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Prompt as comma-separated token ids, e.g. 5,6,7.
    #[arg(long, conflicts_with = "prompt", value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Prompt text (needs tokenizer.json in the model folder).
    #[arg(long)]
    pub prompt: Option<String>,
    #[arg(long, default_value_t = 16)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// DFlash draft folder (DFlashLagunaForCausalLM config.json + *.safetensors) for speculative decoding.
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// Draft tokens proposed per step: 1 <= k < the draft's block_size (default block_size - 1),
    /// or `auto` (adaptive k up to block_size - 1 over step times measured before generating).
    #[arg(long, requires = "draft", value_name = "K|auto")]
    pub num_speculative_tokens: Option<String>,
}

pub fn run(a: Args) -> Result<()> {
    if a.device != "cpu" && a.device != "cuda" {
        bail!("--device must be cpu or cuda, got {}", a.device);
    }
    if !(a.top_p > 0.0 && a.top_p <= 1.0) {
        bail!("--top-p must be in (0, 1], got {}", a.top_p);
    }
    if a.temperature < 0.0 {
        bail!("--temperature must be >= 0, got {}", a.temperature);
    }
    super::check_model_dir(&a.model, "model")?;
    if let Some(d) = &a.draft {
        super::check_model_dir(d, "draft")?;
    }
    let tok = Tokenizer::from_dir(&a.model)?;
    let prompt = match (&a.prompt_ids, &a.prompt) {
        (Some(ids), None) => ids.clone(),
        (None, Some(text)) => match &tok {
            Some(t) => t.encode(text, true)?,
            None => bail!(
                "{} has no tokenizer.json; pass --prompt-ids instead of --prompt",
                a.model.display()
            ),
        },
        _ => bail!("give exactly one of --prompt-ids or --prompt"),
    };
    let req = GenerateRequest {
        prompt: prompt.clone(),
        max_tokens: a.max_tokens,
        sampling: SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
        },
        ignore_eos: a.ignore_eos,
        stop_token_ids: vec![],
    };
    let device = Device::parse(&a.device).map_err(anyhow::Error::msg)?;
    let spec_k = a
        .num_speculative_tokens
        .as_deref()
        .map(SpecK::parse)
        .transpose()
        .map_err(|m| anyhow::anyhow!("--num-speculative-tokens {m}"))?;
    let opts = LoadOptions {
        num_speculative_tokens: spec_k.and_then(SpecK::fixed),
        progress: true,
        ..Default::default()
    };
    let mut loaded = backend::load(device, &opts, &a.model, a.draft.as_deref())
        .with_context(|| format!("loading {} on {device}", a.model.display()))?;
    let costs = match (spec_k, loaded.spec_k()) {
        (Some(SpecK::Auto), Some(k_max)) => {
            // One sequence at this prompt's length: the table this request's steps run at.
            // Within the context the model was loaded for (a shorter prompt, then a smaller k).
            let t = std::time::Instant::now();
            let max_len = loaded.model().config().max_position_embeddings;
            let (c, fit) = loaded
                .step_costs(1, prompt.len(), max_len)?
                .expect("a draft is loaded");
            if let Some(note) = fit.note() {
                eprintln!("{note}");
            }
            if fit.k_max > 0 {
                eprintln!(
                    "adaptive k: step ms at k = 0..={} (of {k_max}), {}-token prompt: {:.2?} (measured in {:.1}s)",
                    fit.k_max,
                    fit.prompt_len,
                    c.for_batch(1),
                    t.elapsed().as_secs_f64()
                );
            }
            Some(std::sync::Arc::new(c))
        }
        _ => None,
    };
    let (res, stats) = loaded.generate(&req, false, costs)?;
    let spec = stats.map(|s| (loaded.spec_k().unwrap_or(0), s));
    let text = match &tok {
        Some(t) => t.decode(&res.completion, true)?,
        None => String::new(),
    };
    if a.json {
        let mut v = serde_json::json!({
            "prompt_ids": prompt,
            "completion_ids": res.completion,
            "text": text,
            "finish_reason": res.finish_reason.as_str(),
        });
        if let Some((k, stats)) = &spec {
            let mut o = stats.to_json();
            o["num_speculative_tokens"] = serde_json::json!(k);
            o["adaptive_k"] = serde_json::json!(spec_k == Some(SpecK::Auto));
            v["spec"] = o;
        }
        println!("{v}");
    } else {
        if tok.is_some() {
            println!("{text}");
        } else {
            println!("{:?}", res.completion);
        }
        eprintln!("finish_reason: {}", res.finish_reason.as_str());
        if let Some((k, stats)) = &spec {
            let k = match spec_k {
                Some(SpecK::Auto) => format!("auto <= {k}"),
                _ => k.to_string(),
            };
            eprintln!("speculative decoding (DFlash, k={k}): {}", stats.summary());
            eprintln!(
                "  drafts {}, draft tokens {}, accepted {}, accepted per position {:?}, acceptance lengths {:?}",
                stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens, stats.num_accepted_tokens_per_pos, stats.acceptance_lengths
            );
        }
    }
    Ok(())
}
