//! Random Laguna configs for the device sweep: from a seed, an HF-style `config.json` of a target
//! (1-6 layers, any mix of full / sliding attention and dense / sparse MLPs, per-layer head counts,
//! widths that are not multiples of 16 for BF16 experts, 16-wide ones for NVFP4 experts, YaRN or
//! default rope with partial rotary, every gating mode, sinks, router softcap, 4-256 experts ...)
//! and, for about half the seeds, a DFlash draft config for it. Every value comes from the seed, so
//! a failing seed reproduces anywhere.
use laguna_engine::config::{AttnKind, Gating, LagunaConfig, MlpKind, RopeScaling};
use laguna_engine::spec::DraftConfig;
use serde_json::{json, Value};

/// splitmix64: a well-mixed stream from any seed (0 included).
pub struct Rand(u64);

impl Rand {
    pub fn new(seed: u64) -> Rand {
        Rand(seed ^ 0x5851_F42D_4C95_7F2D)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        assert!(lo <= hi);
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.range(0, xs.len() - 1)].clone()
    }
    /// An even number in `lo..=hi` (lo, hi even).
    pub fn even(&mut self, lo: usize, hi: usize) -> usize {
        2 * self.range(lo / 2, hi / 2)
    }
    /// A multiple of 16 in `lo..=hi` (both multiples of 16).
    pub fn by16(&mut self, lo: usize, hi: usize) -> usize {
        16 * self.range(lo / 16, hi / 16)
    }
    /// An even width in `lo..=hi` that is not a multiple of 16 (mostly), or any even one.
    pub fn odd_width(&mut self, lo: usize, hi: usize) -> usize {
        loop {
            let w = self.even(lo, hi);
            if w % 16 != 0 || self.chance(0.15) {
                return w;
            }
        }
    }
}

/// One sweep case: a target config, its optional draft and how to fill the weights.
#[derive(Debug, Clone)]
pub struct Case {
    pub seed: u64,
    pub target: Value,
    pub draft: Option<Value>,
    /// NVFP4 routed and shared experts (`quantization_config`).
    pub nvfp4: bool,
    /// Router correction bias amplitude for `synth`.
    pub bias_amp: f32,
}

/// The case of a seed: NVFP4 experts for about a third, a draft for about half.
pub fn case(seed: u64) -> Case {
    let mut r = Rand::new(seed);
    let nvfp4 = r.chance(0.35);
    let target = target_config(&mut r, nvfp4);
    let draft = if r.chance(0.5) {
        Some(draft_config(&mut r, &target))
    } else {
        None
    };
    let bias_amp = if r.chance(0.5) {
        0.01
    } else {
        0.02 + 0.5 * r.unit() as f32
    };
    Case {
        seed,
        target,
        draft,
        nvfp4,
        bias_amp,
    }
}

/// A rotary factor whose `int(head_dim * factor)` is `rotary_dim` (how transformers, vLLM and
/// our parser read it): the exact ratio when it is a short binary fraction (0.5, 0.75 ...), else
/// one half-dim above it, in 6 decimals, so the product never lands a rounding error below.
fn rotary_factor(head_dim: usize, rotary_dim: usize) -> f64 {
    let p = rotary_dim as f64 / head_dim as f64;
    if (p * 256.0).fract() == 0.0 {
        return p;
    }
    ((rotary_dim as f64 + 0.5) / head_dim as f64 * 1e6).round() / 1e6
}

fn rope(r: &mut Rand, head_dim: usize, yarn_p: f64, partial_p: f64) -> Value {
    let rotary_dim = if r.chance(partial_p) {
        r.even(2, head_dim)
    } else {
        head_dim
    };
    let mut p = json!({
        "rope_type": "default",
        "rope_theta": r.pick(&[50.0, 100.0, 1000.0, 10000.0, 500000.0]),
        "partial_rotary_factor": rotary_factor(head_dim, rotary_dim),
    });
    if r.chance(yarn_p) {
        let m = p.as_object_mut().unwrap();
        m.insert("rope_type".into(), json!("yarn"));
        m.insert("factor".into(), json!(r.pick(&[2.0, 4.0, 8.0, 16.0, 32.0])));
        m.insert(
            "original_max_position_embeddings".into(),
            json!(r.pick(&[8, 16, 32, 64, 128])),
        );
        m.insert(
            "beta_fast".into(),
            json!(r.pick(&[1.0, 2.0, 4.0, 32.0, 64.0])),
        );
        m.insert("beta_slow".into(), json!(r.pick(&[0.1, 0.25, 1.0])));
        if r.chance(0.5) {
            m.insert(
                "attention_factor".into(),
                json!(r.pick(&[1.0, 1.25, 1.3465735902799727])),
            );
        }
        if r.chance(0.2) {
            m.insert("truncate".into(), json!(false));
        }
    }
    p
}

fn quantization_config(dense_layers: &[usize]) -> Value {
    let mut ignore = vec![
        json!("lm_head"),
        json!("re:.*self_attn.*"),
        json!("re:.*mlp.gate$"),
    ];
    for i in dense_layers {
        ignore.push(json!(format!("re:model.layers.{i}.mlp.*")));
    }
    let fp4 = |dynamic: Value| {
        json!({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
               "symmetric": true, "dynamic": dynamic})
    };
    json!({
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "format": "nvfp4-pack-quantized",
            "targets": ["Linear"],
            "weights": fp4(json!(false)),
            "input_activations": fp4(json!("local")),
        }},
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor",
                            "symmetric": true, "dynamic": false},
        "ignore": ignore,
    })
}

/// A target `config.json` (`LagunaForCausalLM`).
pub fn target_config(r: &mut Rand, nvfp4: bool) -> Value {
    let layers = r.range(1, 6);
    let kv = r.range(1, 8);
    let heads: Vec<usize> = (0..layers)
        .map(|_| kv * r.range(1, (32 / kv).clamp(1, 4)))
        .collect();
    let head_dim = if r.chance(0.5) {
        r.even(16, 128)
    } else {
        r.pick(&[16, 32, 64, 128])
    };
    let lt: Vec<&str> = match r.range(0, 5) {
        0 => vec!["full_attention"; layers],
        1 => vec!["sliding_attention"; layers],
        _ => (0..layers)
            .map(|_| r.pick(&["full_attention", "sliding_attention"]))
            .collect(),
    };
    let mlp: Vec<&str> = match r.range(0, 5) {
        0 => vec!["sparse"; layers],
        1 => (0..layers)
            .map(|i| if i == 0 { "dense" } else { "sparse" })
            .collect(),
        _ => (0..layers).map(|_| r.pick(&["dense", "sparse"])).collect(),
    };
    let dense_layers: Vec<usize> = (0..layers).filter(|&i| mlp[i] == "dense").collect();
    // NVFP4 groups are 16 wide along each expert Linear's input: hidden and the expert widths.
    let (hidden, moe, shared) = if nvfp4 {
        (r.by16(32, 256), r.by16(16, 128), r.by16(16, 128))
    } else {
        (
            r.odd_width(18, 200),
            r.odd_width(8, 128),
            r.odd_width(8, 128),
        )
    };
    let experts = match r.range(0, 9) {
        0..=3 => r.range(4, 16),
        4..=6 => r.range(17, 64),
        _ => r.range(65, 256),
    };
    let top_k = r.range(1, experts.min(8));
    let window = match r.range(0, 19) {
        0..=6 => r.range(2, 16),
        7..=12 => r.range(17, 128),
        _ => r.range(129, 600),
    };
    let gating = r.pick(&[
        json!(false),
        json!(true),
        json!("per-head"),
        json!("per-element"),
    ]);
    let full_rope = rope(r, head_dim, 0.6, 0.6);
    let sliding_rope = rope(r, head_dim, 0.15, 0.3);
    let vocab = r.range(64, 512);
    let mut c = json!({
        "architectures": ["LagunaForCausalLM"],
        "model_type": "laguna",
        "attention_bias": false,
        "hidden_act": "silu",
        "bos_token_id": 2,
        "eos_token_id": [2, 24],
        "pad_token_id": 9,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": r.odd_width(8, 256),
        "num_hidden_layers": layers,
        "num_attention_heads": heads[0],
        "num_attention_heads_per_layer": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "layer_types": lt,
        "sliding_window": window,
        "swa_attention_sink_enabled": r.chance(0.3),
        "gating": gating,
        "rope_parameters": {"full_attention": full_rope, "sliding_attention": sliding_rope},
        "max_position_embeddings": 4096,
        "rms_norm_eps": r.pick(&[1e-6, 1e-5]),
        "num_experts": experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": moe,
        "shared_expert_intermediate_size": shared,
        "norm_topk_prob": r.chance(0.75),
        "moe_routed_scaling_factor": if r.chance(0.4) { 1.0 } else { (0.5 + 2.5 * r.unit() * 100.0).round() / 100.0 },
        "moe_router_logit_softcapping": if r.chance(0.6) { 0.0 } else { r.pick(&[0.5, 1.5, 3.0, 8.0]) },
        "tie_word_embeddings": r.chance(0.35),
        "torch_dtype": "bfloat16",
    });
    let m = c.as_object_mut().unwrap();
    if r.chance(0.85) {
        m.insert("mlp_layer_types".into(), json!(mlp));
    } else {
        // vLLM's older spelling: dense layers listed in mlp_only_layers.
        m.insert("mlp_only_layers".into(), json!(dense_layers));
        m.insert("decoder_sparse_step".into(), json!(1));
    }
    if nvfp4 {
        m.insert(
            "quantization_config".into(),
            quantization_config(&dense_layers),
        );
    }
    c
}

/// A DFlash draft (`DFlashLagunaForCausalLM`) for `target`: 1-3 dense layers of one attention
/// kind, block size 2-16, causal or not, taps on target layers.
pub fn draft_config(r: &mut Rand, target: &Value) -> Value {
    let tl = target["num_hidden_layers"].as_u64().unwrap() as usize;
    let vocab = target["vocab_size"].clone();
    let layers = r.range(1, 3);
    let kv = r.range(1, 4);
    let heads: Vec<usize> = (0..layers).map(|_| kv * r.range(1, 4)).collect();
    let sliding = r.chance(0.5);
    let mut taps: Vec<usize> = (0..tl).filter(|_| r.chance(0.5)).collect();
    if taps.is_empty() {
        taps.push(r.range(0, tl - 1));
    }
    let head_dim = r.even(8, 64);
    let mut c = json!({
        "architectures": ["DFlashLagunaForCausalLM"],
        "model_type": "laguna",
        "hidden_size": target["hidden_size"].clone(),
        "intermediate_size": r.odd_width(8, 192),
        "num_hidden_layers": layers,
        "num_attention_heads": heads[0],
        "num_attention_heads_per_layer": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "attention_bias": false,
        "gating": r.pick(&[json!(false), json!(true), json!("per-head"), json!("per-element")]),
        "rms_norm_eps": 1e-6,
        "layer_types": vec![if sliding { "sliding_attention" } else { "full_attention" }; layers],
        "mlp_layer_types": vec!["dense"; layers],
        "mlp_only_layers": (0..layers).collect::<Vec<_>>(),
        "rope_theta": r.pick(&[500.0, 1000.0, 10000.0, 500000.0]),
        "max_position_embeddings": 4096,
        "vocab_size": vocab.clone(),
        "draft_vocab_size": vocab,
        "dflash_config": {
            "block_size": r.range(2, 16),
            "mask_token_id": r.range(3, 63),
            "num_target_layers": tl,
            "target_layer_ids": taps,
            "causal": r.chance(0.5),
        },
    });
    let m = c.as_object_mut().unwrap();
    if sliding {
        let w = if r.chance(0.6) {
            r.range(2, 24)
        } else {
            r.range(25, 300)
        };
        m.insert("sliding_window".into(), json!(w));
        m.insert("swa_attention_sink_enabled".into(), json!(r.chance(0.3)));
    }
    if r.chance(0.4) {
        let rd = r.even(2, head_dim);
        m.insert(
            "partial_rotary_factor".into(),
            json!(rotary_factor(head_dim, rd)),
        );
    }
    c
}

/// A short description of a parsed case, e.g. `L3 F/S/S d/s/s h70 hd48 kv2 q4/8/8 E37k5 w9 ...`.
pub fn summary(t: &LagunaConfig, d: Option<&DraftConfig>, nvfp4: bool) -> String {
    let kinds = |f: &dyn Fn(&laguna_engine::config::LayerSpec) -> &'static str| {
        t.layers.iter().map(f).collect::<Vec<_>>().join("")
    };
    let attn = kinds(&|l| if l.attn == AttnKind::Full { "F" } else { "S" });
    let mlp = kinds(&|l| if l.mlp == MlpKind::Dense { "d" } else { "s" });
    let heads: Vec<String> = t.layers.iter().map(|l| l.num_heads.to_string()).collect();
    let rope = |k: AttnKind| {
        t.layers.iter().find(|l| l.attn == k).map(|l| {
            let y = matches!(l.rope.scaling, RopeScaling::Yarn { .. });
            format!("{}{}", if y { "yarn" } else { "rope" }, l.rope.rotary_dim)
        })
    };
    let mut s = format!(
        "L{} {attn}/{mlp} h{} i{} hd{} kv{} q{} E{}k{} m{}/{} v{}",
        t.num_layers,
        t.hidden_size,
        t.intermediate_size,
        t.head_dim,
        t.num_kv_heads,
        heads.join("/"),
        t.num_experts,
        t.top_k,
        t.moe_intermediate_size,
        t.shared_expert_intermediate_size,
        t.vocab_size,
    );
    if let Some(w) = t.sliding_window.filter(|_| attn.contains('S')) {
        s += &format!(" w{w}");
    }
    for (k, r) in [("F", rope(AttnKind::Full)), ("S", rope(AttnKind::Sliding))] {
        if let Some(r) = r {
            s += &format!(" {k}:{r}");
        }
    }
    s += match t.gating {
        Gating::None => " nogate",
        Gating::PerHead => " perhead",
        Gating::PerElement => " perelem",
    };
    if t.layers.iter().any(|l| l.sinks) {
        s += " sinks";
    }
    if t.router_softcap > 0.0 {
        s += &format!(" cap{}", t.router_softcap);
    }
    if t.routed_scaling_factor != 1.0 {
        s += &format!(" rs{}", t.routed_scaling_factor);
    }
    if !t.norm_topk_prob {
        s += " nonorm";
    }
    if t.tie_word_embeddings {
        s += " tied";
    }
    s += if nvfp4 { " nvfp4" } else { " bf16" };
    if let Some(d) = d {
        s += &format!(
            " +draft(L{} b{} {} {} taps{:?})",
            d.num_layers,
            d.block_size,
            if d.causal { "causal" } else { "noncausal" },
            d.window.map_or("full".to_string(), |w| format!("w{w}")),
            d.target_layer_ids
        );
    }
    s
}

/// The summary of a case (empty when its configs do not parse).
pub fn case_summary(c: &Case) -> String {
    let Ok(t) = LagunaConfig::from_value(c.target.clone()) else {
        return String::new();
    };
    let d = c
        .draft
        .as_ref()
        .and_then(|d| DraftConfig::from_value(d.clone()).ok());
    summary(&t, d.as_ref(), c.nvfp4)
}

/// The features of a case (none when its configs do not parse).
pub fn case_features(c: &Case) -> Vec<&'static str> {
    let Ok(t) = LagunaConfig::from_value(c.target.clone()) else {
        return vec![];
    };
    let d = c
        .draft
        .as_ref()
        .and_then(|d| DraftConfig::from_value(d.clone()).ok());
    features(&t, d.as_ref(), c.nvfp4)
}

/// The features a parsed case exercises (for coverage counts).
pub fn features(t: &LagunaConfig, d: Option<&DraftConfig>, nvfp4: bool) -> Vec<&'static str> {
    let mut f = vec![];
    let mut add = |on: bool, name: &'static str| {
        if on {
            f.push(name)
        }
    };
    let full = t.layers.iter().filter(|l| l.attn == AttnKind::Full).count();
    let dense = t.layers.iter().filter(|l| l.mlp == MlpKind::Dense).count();
    let sliding = full < t.num_layers;
    let n = t.num_layers;
    add(n == 1, "layers=1");
    add(n == 6, "layers=6");
    add(full > 0 && sliding, "mixed full/sliding");
    add(full == 0, "all sliding");
    add(full == n, "all full");
    add(dense > 0 && dense < n, "mixed dense/sparse");
    add(dense == 0, "all sparse");
    add(
        t.layers
            .iter()
            .any(|l| l.num_heads != t.layers[0].num_heads),
        "per-layer heads",
    );
    add(t.num_kv_heads == 1, "kv heads 1");
    add(t.num_kv_heads == 8, "kv heads 8");
    add(t.head_dim <= 24, "head_dim <= 24");
    add(t.head_dim >= 112, "head_dim >= 112");
    add(t.head_dim % 16 != 0, "head_dim not 16k");
    let bf16_odd = !nvfp4 && t.hidden_size % 16 != 0;
    add(bf16_odd, "bf16 hidden not 16k");
    add(!nvfp4 && t.hidden_size % 4 == 2, "bf16 hidden 2 mod 4");
    add(
        !nvfp4 && t.moe_intermediate_size % 16 != 0,
        "bf16 moe width not 16k",
    );
    add(
        !nvfp4 && t.shared_expert_intermediate_size % 16 != 0,
        "bf16 shared width not 16k",
    );
    add(t.intermediate_size % 16 != 0, "dense width not 16k");
    let w = t.sliding_window.filter(|_| sliding);
    add(w.is_some_and(|w| w <= 4), "window <= 4");
    add(w.is_some_and(|w| w >= 300), "window >= 300");
    add(w.is_some_and(|w| !w.is_power_of_two()), "window not 2^n");
    let yarn = |k: AttnKind| {
        t.layers
            .iter()
            .any(|l| l.attn == k && matches!(l.rope.scaling, RopeScaling::Yarn { .. }))
    };
    add(yarn(AttnKind::Full), "yarn full");
    add(yarn(AttnKind::Sliding), "yarn sliding");
    add(
        t.layers
            .iter()
            .any(|l| l.rope.scaling == RopeScaling::Default),
        "default rope",
    );
    add(
        t.layers.iter().any(|l| l.rope.rotary_dim < t.head_dim),
        "partial rotary",
    );
    add(t.gating == Gating::None, "gating none");
    add(t.gating == Gating::PerHead, "gating per-head");
    add(t.gating == Gating::PerElement, "gating per-element");
    add(t.layers.iter().any(|l| l.sinks), "sinks");
    add(t.router_softcap > 0.0, "router softcap");
    let sparse = dense < n;
    add(sparse && t.num_experts <= 8, "experts <= 8");
    add(sparse && t.num_experts >= 128, "experts >= 128");
    add(sparse && t.top_k == 1, "top-k 1");
    add(sparse && t.top_k == 8, "top-k 8");
    add(sparse && t.routed_scaling_factor != 1.0, "routed scale");
    add(sparse && !t.norm_topk_prob, "no top-k renorm");
    add(t.tie_word_embeddings, "tied head");
    add(!t.tie_word_embeddings, "untied head");
    // The CUDA backend folds the shared expert into the routed stack when the widths agree,
    // else runs it as its own MLP (its own GEMMs in a long pass).
    let folded = t.shared_expert_intermediate_size == t.moe_intermediate_size;
    add(sparse && folded, "shared expert folded");
    add(sparse && !folded, "shared expert unfolded");
    add(nvfp4 && sparse, "nvfp4 experts");
    add(!nvfp4 && sparse, "bf16 experts");
    add(t.vocab_size < 128, "vocab < 128");
    add(t.vocab_size > 384, "vocab > 384");
    if let Some(d) = d {
        add(true, "draft");
        add(d.causal, "draft causal");
        add(!d.causal, "draft non-causal");
        add(d.window.is_some(), "draft window");
        add(d.block_size == 2, "draft block 2");
        add(d.block_size == 16, "draft block 16");
        add(d.target_layer_ids.len() > 1, "draft taps > 1");
        add(d.gating == Gating::PerElement, "draft per-element gating");
        add(d.sinks, "draft sinks");
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotary_factor_reads_back() {
        for hd in (8..=128).step_by(2) {
            for rd in (2..=hd).step_by(2) {
                let p = rotary_factor(hd, rd);
                // Read back the way config.json is: through JSON text.
                let p: f64 = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
                assert_eq!((hd as f64 * p) as usize, rd, "{hd} {rd}");
                assert!(p > 0.0 && p <= 1.0);
            }
        }
    }

    /// Rotary factors as Python writes them (the exact ratio, shortest repr) give the rotary
    /// dim transformers computes: config.json floats must parse exactly (serde_json's
    /// `float_roundtrip`; without it 64 / 68 = 0.9411764705882353 read back as rotary dim 63).
    #[test]
    fn python_rotary_factors_parse_exactly() {
        for hd in (8..=128usize).step_by(2) {
            for rd in (2..=hd).step_by(2) {
                let p = rd as f64 / hd as f64;
                if (hd as f64 * p) as usize != rd {
                    continue; // int() in Python gives the same: not a valid pair there either
                }
                let text = format!(
                    r#"{{"model_type":"laguna","num_hidden_layers":1,"head_dim":{hd},"num_attention_heads":8,"num_key_value_heads":8,"rope_parameters":{{"rope_type":"default","rope_theta":10000.0,"partial_rotary_factor":{}}}}}"#,
                    serde_json::to_string(&p).unwrap()
                );
                let c = LagunaConfig::from_json_str(&text)
                    .unwrap_or_else(|e| panic!("head_dim {hd} rotary {rd}: {e}"));
                assert_eq!(c.layers[0].rope.rotary_dim, rd);
            }
        }
    }

    #[test]
    fn same_seed_same_case() {
        for s in 0..20 {
            assert_eq!(case(s).target, case(s).target);
            assert_eq!(case(s).draft, case(s).draft);
        }
        assert_ne!(case(1).target, case(2).target);
    }

    /// 500 seeds: every config parses (target and draft, the pair validates) and every listed
    /// feature occurs often enough to matter.
    #[test]
    fn configs_parse_and_cover_every_feature() {
        let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
        let n = 500;
        for seed in 0..n {
            let c = case(seed);
            // Through JSON text, as config.json is read.
            let t = LagunaConfig::from_json_str(&c.target.to_string())
                .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", c.target));
            assert_eq!(t.quantization.is_some(), c.nvfp4);
            assert!((1..=6).contains(&t.num_layers));
            assert!((1..=8).contains(&t.num_kv_heads));
            assert!((16..=128).contains(&t.head_dim) && t.head_dim % 2 == 0);
            assert!((64..=512).contains(&t.vocab_size));
            assert!((4..=256).contains(&t.num_experts) && (1..=8).contains(&t.top_k));
            if let Some(w) = t.sliding_window {
                assert!((2..=600).contains(&w));
            }
            if c.nvfp4 {
                for w in [
                    t.hidden_size,
                    t.moe_intermediate_size,
                    t.shared_expert_intermediate_size,
                ] {
                    assert_eq!(w % 16, 0, "seed {seed}: NVFP4 width {w}");
                }
            }
            let d = c.draft.as_ref().map(|dv| {
                let d = DraftConfig::from_json_str(&dv.to_string())
                    .unwrap_or_else(|e| panic!("seed {seed} draft: {e}\n{dv}"));
                d.validate_target(&t).unwrap();
                // synth reads a draft with the target parser for its inventory.
                LagunaConfig::from_json_str(&dv.to_string()).unwrap();
                assert!((2..=16).contains(&d.block_size));
                d
            });
            for f in features(&t, d.as_ref(), c.nvfp4) {
                *counts.entry(f).or_default() += 1;
            }
            assert!(!summary(&t, d.as_ref(), c.nvfp4).is_empty());
        }
        let want = [
            "layers=1",
            "layers=6",
            "mixed full/sliding",
            "all sliding",
            "all full",
            "mixed dense/sparse",
            "all sparse",
            "per-layer heads",
            "kv heads 1",
            "kv heads 8",
            "head_dim <= 24",
            "head_dim >= 112",
            "head_dim not 16k",
            "bf16 hidden not 16k",
            "bf16 hidden 2 mod 4",
            "bf16 moe width not 16k",
            "bf16 shared width not 16k",
            "dense width not 16k",
            "window <= 4",
            "window >= 300",
            "window not 2^n",
            "yarn full",
            "yarn sliding",
            "default rope",
            "partial rotary",
            "gating none",
            "gating per-head",
            "gating per-element",
            "sinks",
            "router softcap",
            "experts <= 8",
            "experts >= 128",
            "top-k 1",
            "top-k 8",
            "routed scale",
            "no top-k renorm",
            "tied head",
            "untied head",
            "shared expert folded",
            "shared expert unfolded",
            "nvfp4 experts",
            "bf16 experts",
            "vocab < 128",
            "vocab > 384",
            "draft",
            "draft causal",
            "draft non-causal",
            "draft window",
            "draft block 2",
            "draft block 16",
            "draft taps > 1",
            "draft per-element gating",
            "draft sinks",
        ];
        let thin: Vec<_> = want
            .iter()
            .filter(|f| counts.get(*f).copied().unwrap_or(0) < 5)
            .map(|f| (f, counts.get(f).copied().unwrap_or(0)))
            .collect();
        assert!(
            thin.is_empty(),
            "features seen fewer than 5 times in {n} seeds: {thin:?}"
        );
    }
}
