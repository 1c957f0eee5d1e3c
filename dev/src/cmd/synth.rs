//! `laguna-dev synth`: a random-weight checkpoint of any Laguna config (target or DFlash draft) in the exact on-disk format
//! (safetensors shards <= 5 GB + index; NVFP4 triplets for routed and shared experts when the
//! config has `quantization_config`; F32 router correction bias; weights scaled like
//! 1/sqrt(fan_in) so activations stay finite). Fast: xorshift RNG, one thread per shard, large writes.
use anyhow::{Context, Result};
use laguna_engine::config::LagunaConfig;
use laguna_engine::model::schema::{inventory, Expected};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// config.json of the model to synthesize.
    #[arg(long)]
    pub config: PathBuf,
    /// Output folder (created).
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Largest shard in bytes.
    #[arg(long, default_value_t = 5_000_000_000)]
    pub shard_bytes: u64,
}

#[derive(Clone, Copy)]
enum Fill {
    /// BF16 uniform in [-a, a].
    Bf16(f32),
    /// BF16 1 + uniform in [-a, a] (norm weights).
    Bf16One(f32),
    /// F32 uniform in [-a, a].
    F32(f32),
    F32Const(f32),
    /// Random bytes (NVFP4 codes).
    Bytes,
    /// E4M3 block scales in [0.5, 1.875].
    Scales,
}

struct T {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    fill: Fill,
}

impl T {
    fn bytes(&self) -> u64 {
        let n: usize = self.shape.iter().product();
        (n * match self.dtype {
            "BF16" => 2,
            "F32" => 4,
            _ => 1,
        }) as u64
    }
}

/// xorshift64 (also the random source of `laguna-dev kbench`).
pub(super) struct Rng(pub(super) u64);
impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn gen(t: &T, seed: u64, out: &mut Vec<u8>) {
    let n: usize = t.shape.iter().product();
    let mut h = seed ^ 0x9E37_79B9_7F4A_7C15;
    for b in t.name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01B3);
    }
    let mut r = Rng(h | 1);
    out.clear();
    let unif = |x: u64| ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
    match t.fill {
        Fill::Bf16(a) | Fill::Bf16One(a) => {
            let base = if let Fill::Bf16One(_) = t.fill {
                1.0
            } else {
                0.0
            };
            out.reserve(n * 2);
            for _ in 0..n {
                let v = base + a * unif(r.next());
                out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
            }
        }
        Fill::F32(a) => {
            for _ in 0..n {
                out.extend_from_slice(&(a * unif(r.next())).to_le_bytes());
            }
        }
        Fill::F32Const(c) => {
            for _ in 0..n {
                out.extend_from_slice(&c.to_le_bytes());
            }
        }
        Fill::Bytes => {
            out.reserve(n + 8);
            while out.len() < n {
                out.extend_from_slice(&r.next().to_le_bytes());
            }
            out.truncate(n);
        }
        Fill::Scales => {
            // exponent 6..7 (0.5..1.875), any mantissa: codes 0x30..0x3f.
            out.reserve(n + 8);
            while out.len() < n {
                for b in r.next().to_le_bytes() {
                    out.push(0x30 | (b & 0x0f));
                }
            }
            out.truncate(n);
        }
    }
}

pub fn run(a: Args) -> Result<()> {
    let text = std::fs::read_to_string(&a.config)
        .with_context(|| format!("reading {}", a.config.display()))?;
    let t0 = std::time::Instant::now();
    let w = write_checkpoint(
        &text,
        &a.out,
        &SynthOptions {
            seed: a.seed,
            shard_bytes: a.shard_bytes,
            ..Default::default()
        },
    )?;
    eprintln!(
        "wrote {} tensors, {:.2} GB in {} shard(s) to {} in {:.1}s",
        w.tensors,
        w.bytes as f64 / 1e9,
        w.shards,
        a.out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// How `write_checkpoint` fills a checkpoint.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    pub seed: u64,
    /// Largest shard in bytes.
    pub shard_bytes: u64,
    /// Router correction bias values are uniform in [-a, a].
    pub correction_bias_amp: f32,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            seed: 0,
            shard_bytes: 5_000_000_000,
            correction_bias_amp: 0.01,
        }
    }
}

/// What `write_checkpoint` wrote.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    pub tensors: usize,
    pub bytes: u64,
    pub shards: usize,
}

/// Writes `config_json` (a target or DFlash draft config, as text) and random weights for it
/// into `out` (created): what `laguna-dev synth` does, callable in-process.
pub fn write_checkpoint(config_json: &str, out: &Path, o: &SynthOptions) -> Result<Written> {
    let cfg = LagunaConfig::from_json_str(config_json)?;
    let quant = cfg.quantization.is_some();
    let mut ts: Vec<T> = vec![];
    // A DFlash draft (`DFlashLagunaForCausalLM`): the draft inventory (fc, aux norms, fused
    // qkv_proj, dense MLPs; embed_tokens and lm_head come from the target).
    let is_draft = cfg
        .architectures
        .iter()
        .any(|a| a == laguna_engine::spec::config::DRAFT_ARCH);
    let inv = if is_draft {
        laguna_stages::verify::draft::inventory(&cfg, None)
    } else {
        inventory(&cfg)
    };
    for e in inv {
        match e {
            Expected::Linear { prefix, out, inp } => {
                let expert =
                    prefix.contains(".mlp.experts.") || prefix.contains(".mlp.shared_expert.");
                if quant && expert {
                    ts.push(T {
                        name: format!("{prefix}.weight_packed"),
                        dtype: "U8",
                        shape: vec![out, inp / 2],
                        fill: Fill::Bytes,
                    });
                    ts.push(T {
                        name: format!("{prefix}.weight_scale"),
                        dtype: "F8_E4M3",
                        shape: vec![out, inp / 16],
                        fill: Fill::Scales,
                    });
                    // |e2m1| ~ 2.3 on random codes, scales ~ 1.2: divide by ~2.8 sqrt(fan_in).
                    let gs = 2.8 * (inp as f32).sqrt();
                    ts.push(T {
                        name: format!("{prefix}.weight_global_scale"),
                        dtype: "F32",
                        shape: vec![1],
                        fill: Fill::F32Const(gs),
                    });
                    ts.push(T {
                        name: format!("{prefix}.input_global_scale"),
                        dtype: "F32",
                        shape: vec![1],
                        fill: Fill::F32Const(1.0),
                    });
                } else {
                    let amp = (3.0 / inp as f32).sqrt();
                    ts.push(T {
                        name: format!("{prefix}.weight"),
                        dtype: "BF16",
                        shape: vec![out, inp],
                        fill: Fill::Bf16(amp),
                    });
                }
            }
            Expected::Tensor { name, shape } => {
                let fill = if name.ends_with("e_score_correction_bias") {
                    Fill::F32(o.correction_bias_amp)
                } else if name.ends_with("norm.weight")
                    || name.ends_with("layernorm.weight")
                    || name.starts_with("aux_hidden_norms.")
                {
                    Fill::Bf16One(0.1)
                } else if name.ends_with("embed_tokens.weight") {
                    Fill::Bf16(1.0)
                } else {
                    Fill::Bf16(0.1)
                };
                let dtype = if let Fill::F32(_) = fill {
                    "F32"
                } else {
                    "BF16"
                };
                ts.push(T {
                    name,
                    dtype,
                    shape,
                    fill,
                });
            }
        }
    }
    // Shards.
    let mut shards: Vec<Vec<T>> = vec![vec![]];
    let mut cur = 0u64;
    for t in ts {
        if cur + t.bytes() > o.shard_bytes && !shards.last().unwrap().is_empty() {
            shards.push(vec![]);
            cur = 0;
        }
        cur += t.bytes();
        shards.last_mut().unwrap().push(t);
    }
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("config.json"), config_json)?;
    let ns = shards.len();
    let names: Vec<String> = (0..ns)
        .map(|i| format!("model-{:05}-of-{:05}.safetensors", i + 1, ns))
        .collect();
    let total: u64 = shards.iter().flatten().map(|t| t.bytes()).sum();
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = shards
            .iter()
            .zip(&names)
            .map(|(sh, fname)| {
                let path = out.join(fname);
                let seed = o.seed;
                s.spawn(move || -> Result<()> {
                    let mut hdr = serde_json::Map::new();
                    let mut off = 0u64;
                    for t in sh {
                        let b = t.bytes();
                        hdr.insert(t.name.clone(), serde_json::json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + b]}));
                        off += b;
                    }
                    hdr.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
                    let mut h = serde_json::to_vec(&serde_json::Value::Object(hdr))?;
                    while h.len() % 8 != 0 {
                        h.push(b' ');
                    }
                    let f = std::fs::File::create(&path)?;
                    let mut w = std::io::BufWriter::with_capacity(64 << 20, f);
                    w.write_all(&(h.len() as u64).to_le_bytes())?;
                    w.write_all(&h)?;
                    let mut buf = vec![];
                    for t in sh {
                        gen(t, seed, &mut buf);
                        w.write_all(&buf)?;
                    }
                    w.flush()?;
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap()?;
        }
        Ok(())
    })?;
    if ns > 1 {
        let mut wm = serde_json::Map::new();
        for (sh, f) in shards.iter().zip(&names) {
            for t in sh {
                wm.insert(t.name.clone(), serde_json::Value::from(f.clone()));
            }
        }
        let idx = serde_json::json!({"metadata": {"total_size": total}, "weight_map": wm});
        std::fs::write(
            out.join("model.safetensors.index.json"),
            serde_json::to_vec_pretty(&idx)?,
        )?;
    } else {
        std::fs::rename(out.join(&names[0]), out.join("model.safetensors"))?;
    }
    Ok(Written {
        tensors: shards.iter().map(|s| s.len()).sum(),
        bytes: total,
        shards: ns,
    })
}
