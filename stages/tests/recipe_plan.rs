//! Recipes (schema, overrides, errors) and the memory plan of the XS-2.1 recipe, with every number
//! derived independently below from laguna-model.md §5 and dflash.md §1.3.
mod common;

use laguna_engine::config::LagunaConfig;
use laguna_stages::hub::HubEnv;
use laguna_stages::plan::{
    plan_recipe, DeviceMemory, KvPlan, PlanOptions, WeightBytes, WeightsSource,
};
use laguna_stages::recipe::overrides::{ModelSpec, Overrides};
use laguna_stages::recipe::{Device, KvCacheDtype, ModelSource, Recipe, SpecK};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn xs_recipe_path() -> PathBuf {
    common::repo_root().join("recipes/xs-nvfp4-dflash.toml")
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn xs_recipe() -> Recipe {
    Recipe::resolve(Some(&xs_recipe_path()), &no_env, &Overrides::default()).unwrap()
}

fn reference(name: &str) -> LagunaConfig {
    LagunaConfig::from_file(&common::fixture("reference").join(name)).unwrap()
}

#[test]
fn xs_recipe_fields() {
    let r = xs_recipe();
    assert_eq!(
        r.model,
        ModelSource::Hub {
            repo: "poolside/Laguna-XS-2.1-NVFP4".into(),
            revision: "d32afde8b09af1539b49ff96ff5551c674485f8e".into()
        }
    );
    assert_eq!(
        r.draft,
        Some(ModelSource::Hub {
            repo: "poolside/Laguna-XS-2.1-DFlash".into(),
            revision: "main".into()
        })
    );
    assert_eq!(r.served_model_name, "laguna-nvfp4");
    assert_eq!(r.max_model_len, Some(262144));
    assert_eq!(r.gpu_memory_utilization, 0.5);
    assert_eq!(r.kv_cache_memory_bytes, Some(12884901888));
    assert_eq!(r.max_num_seqs, 2);
    assert_eq!(r.max_num_batched_tokens, 8192);
    let s = r.speculative.as_ref().unwrap();
    assert_eq!(
        (s.method.as_str(), s.num_speculative_tokens),
        ("dflash", SpecK::Auto)
    );
    assert_eq!(r.kv_cache_dtype, KvCacheDtype::Auto);
    assert_eq!(r.device, Device::Cuda(0));
}

#[test]
fn tiny_recipe_resolves_relative_path_against_recipe_folder() {
    let p = common::repo_root().join("recipes/tiny-cpu.toml");
    let r = Recipe::resolve(Some(&p), &no_env, &Overrides::default()).unwrap();
    assert_eq!(r.device, Device::Cpu);
    let ModelSource::Local(dir) = &r.model else {
        panic!("expected a local model, got {:?}", r.model)
    };
    assert_eq!(
        std::fs::canonicalize(dir).unwrap(),
        std::fs::canonicalize(common::fixture("models/tiny-chat")).unwrap()
    );
}

fn write_recipe(text: &str) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("r.toml");
    std::fs::write(&p, text).unwrap();
    (d, p)
}

#[test]
fn unknown_key_is_named_with_its_line() {
    let (_d, p) =
        write_recipe("max_model_len = 4096\n\nmax_model_length = 5\n[model]\nrepo = \"a/b\"\n");
    let e = Recipe::resolve(Some(&p), &no_env, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_model_length"), "{e}");
    assert!(e.contains("line 3"), "{e}");
    assert!(e.contains("r.toml"), "{e}");
    let (_d, p) = write_recipe("[model]\nrepo = \"a/b\"\nbranch = \"x\"\n");
    let e = Recipe::resolve(Some(&p), &no_env, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("branch") && e.contains("line 3"), "{e}");
}

#[test]
fn precedence_flag_env_recipe_default() {
    let (_d, p) = write_recipe(
        "max_num_seqs = 3\nport = 7000\n[model]\nrepo = \"org/m\"\nrevision = \"v1\"\n",
    );
    let env: HashMap<&str, &str> =
        [("LAGUNA_PORT", "7100"), ("LAGUNA_MAX_MODEL_LEN", "1000")].into();
    let getenv = |k: &str| env.get(k).map(|s| s.to_string());
    let flags = Overrides {
        port: Some(7200),
        ..Default::default()
    };
    let r = Recipe::resolve(Some(&p), &getenv, &flags).unwrap();
    assert_eq!(r.port, 7200, "flag beats env and recipe");
    assert_eq!(r.max_model_len, Some(1000), "env beats recipe/default");
    assert_eq!(r.max_num_seqs, 3, "recipe beats default");
    assert_eq!(r.host, "127.0.0.1", "default");
    assert_eq!(
        r.model,
        ModelSource::Hub {
            repo: "org/m".into(),
            revision: "v1".into()
        }
    );
    let r = Recipe::resolve(Some(&p), &getenv, &Overrides::default()).unwrap();
    assert_eq!(r.port, 7100, "env beats recipe");
    // Naming another repo drops the recipe's revision (it belonged to the other repo).
    let flags = Overrides {
        model: Some(ModelSpec::Repo("org/other".into())),
        ..Default::default()
    };
    let r = Recipe::resolve(Some(&p), &no_env, &flags).unwrap();
    assert_eq!(
        r.model,
        ModelSource::Hub {
            repo: "org/other".into(),
            revision: "main".into()
        }
    );
    // A revision alone keeps the repo.
    let env2: HashMap<&str, &str> = [("LAGUNA_MODEL_REVISION", "v2")].into();
    let r = Recipe::resolve(
        Some(&p),
        &|k| env2.get(k).map(|s| s.to_string()),
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(
        r.model,
        ModelSource::Hub {
            repo: "org/m".into(),
            revision: "v2".into()
        }
    );
}

#[test]
fn bad_values_name_their_source() {
    let env: HashMap<&str, &str> = [("LAGUNA_MAX_NUM_SEQS", "lots")].into();
    let e = Recipe::resolve(
        Some(&xs_recipe_path()),
        &|k| env.get(k).map(|s| s.to_string()),
        &Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("LAGUNA_MAX_NUM_SEQS") && e.contains("lots"),
        "{e}"
    );
    let (_d, p) = write_recipe("gpu_memory_utilization = 1.5\n[model]\nrepo = \"a/b\"\n");
    let e = Recipe::resolve(Some(&p), &no_env, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("gpu_memory_utilization") && e.contains("1.5"),
        "{e}"
    );
    let (_d, p) = write_recipe("kv_cache_dtype = \"int3\"\n[model]\nrepo = \"a/b\"\n");
    let e = Recipe::resolve(Some(&p), &no_env, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("kv_cache_dtype") && e.contains("int3"), "{e}");
    let e = Recipe::resolve(None, &no_env, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("model") && e.contains("--recipe"), "{e}");
}

/// `num_speculative_tokens`: `auto` or an integer >= 1 in the file, the environment and the
/// flags; junk and 0 are refused naming the field and the value.
#[test]
fn num_speculative_tokens_auto_or_positive() {
    let recipe = |k: &str| {
        write_recipe(&format!(
            "[model]\nrepo = \"a/b\"\n[draft]\nrepo = \"a/d\"\n[speculative]\nnum_speculative_tokens = {k}\n"
        ))
    };
    let k_of = |p: &Path, env: &dyn Fn(&str) -> Option<String>, flags: &Overrides| {
        Recipe::resolve(Some(p), env, flags).map(|r| r.spec_k())
    };
    for (text, want) in [
        ("\"auto\"", SpecK::Auto),
        ("\"AUTO\"", SpecK::Auto),
        ("7", SpecK::Fixed(7)),
        ("\"3\"", SpecK::Fixed(3)),
    ] {
        let (_d, p) = recipe(text);
        assert_eq!(
            k_of(&p, &no_env, &Overrides::default()).unwrap(),
            Some(want),
            "{text}"
        );
    }
    for (text, shown) in [("\"fast\"", "fast"), ("0", "0"), ("-2", "-2"), ("2.5", "")] {
        let (_d, p) = recipe(text);
        let e = k_of(&p, &no_env, &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("num_speculative_tokens") && e.contains(shown),
            "{text}: {e}"
        );
    }
    // A draft without [speculative] keeps the fixed default; env and flags override the file.
    let (_d, p) = write_recipe("[model]\nrepo = \"a/b\"\n[draft]\nrepo = \"a/d\"\n");
    assert_eq!(
        k_of(&p, &no_env, &Overrides::default()).unwrap(),
        Some(SpecK::Fixed(6))
    );
    let env = |v: &'static str| {
        move |k: &str| (k == "LAGUNA_NUM_SPECULATIVE_TOKENS").then(|| v.to_string())
    };
    assert_eq!(
        k_of(&p, &env("auto"), &Overrides::default()).unwrap(),
        Some(SpecK::Auto)
    );
    assert_eq!(
        k_of(&p, &env(" 4 "), &Overrides::default()).unwrap(),
        Some(SpecK::Fixed(4))
    );
    for bad in ["fast", "0"] {
        let e = k_of(&p, &env(bad), &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("LAGUNA_NUM_SPECULATIVE_TOKENS") && e.contains(bad),
            "{e}"
        );
    }
    let flags = Overrides {
        num_speculative_tokens: Some(SpecK::Fixed(2)),
        ..Default::default()
    };
    assert_eq!(
        k_of(&p, &env("auto"), &flags).unwrap(),
        Some(SpecK::Fixed(2)),
        "flag beats env"
    );
    // The flag's text goes through the same parser.
    assert_eq!(SpecK::parse("auto"), Ok(SpecK::Auto));
    assert_eq!(SpecK::parse("15"), Ok(SpecK::Fixed(15)));
    for bad in ["fast", "0", "", "-1", "6x"] {
        let e = SpecK::parse(bad).unwrap_err();
        assert!(e.contains(&format!("`{bad}`")), "{e}");
    }
    assert_eq!(
        (SpecK::Auto.to_string(), SpecK::Fixed(6).to_string()),
        ("auto".into(), "6".into())
    );
}

// ---- plan ------------------------------------------------------------------------------------

const GIB: u64 = 1 << 30;

fn mem(total: u64) -> DeviceMemory {
    DeviceMemory {
        total,
        free: total,
        source: "test".into(),
        unified: false,
    }
}

/// Weights of the NVFP4 build computed by hand (laguna-model.md §5.1): BF16 non-expert tensors
/// plus NVFP4 routed+shared experts, each Linear 512x2048 = packed 524,288 + E4M3 scales 65,536 +
/// two F32 global scales.
fn xs_weights_by_hand() -> (u64, u64) {
    let bf16_non_expert: u64 = 411_041_792 // embed
        + 411_041_792 // lm_head
        + 2_861_957_120 // attention q/k/v/o/g
        + 100_663_296 // dense MLP of layer 0
        + 40_894_464 // routers
        + 19_968 // e_score_correction_bias (BF16)
        + 352_256; // norms
    let nvfp4_linear: u64 = 512 * 2048 / 2 + 512 * 2048 / 16 + 8;
    let experts = 39 * (256 + 1) * 3 * nvfp4_linear;
    // DFlash draft (dflash.md §1.3), BF16: fc [2048, 5*2048], 5 layers of qkv [10240,2048],
    // o [2048,8192], g [64,2048], mlp 3x[8192,2048], 4 vectors of 2048/128, + 7 norm vectors.
    let layer: u64 = 10240 * 2048 + 2048 * 8192 + 64 * 2048 + 3 * 8192 * 2048 + 2 * 2048 + 2 * 128;
    let draft = 2 * (2048 * 10240 + 5 * layer + 7 * 2048);
    (bf16_non_expert + experts, draft)
}

#[test]
fn xs21_plan_numbers() {
    let r = xs_recipe();
    let (cfg, dcfg) = (
        reference("laguna-xs-2.1-nvfp4.config.json"),
        reference("laguna-xs-2.1-dflash.config.json"),
    );
    let (wt, wd) = xs_weights_by_hand();
    let w = WeightBytes {
        target: wt,
        draft: wd,
        source: WeightsSource::Config,
    };
    let p = KvPlan::compute(&cfg, Some(&dcfg), &r, w, mem(128 * GIB));

    // laguna-model.md §5.3: K+V = 2 x 8 x 128 values = 4096 B per token per layer in BF16,
    // 10 full-attention layers -> 40,960 B/token.
    assert_eq!(p.kv_bytes_per_token_layer, 4096);
    assert_eq!(p.kv_bytes_per_token, 40_960);
    assert_eq!((p.full_layers, p.sliding_layers), (10, 30));
    // num_speculative_tokens = auto plans for its largest k, the draft's block_size 16 - 1 = 15.
    assert_eq!((p.speculative_tokens, p.speculative_auto), (15, true));
    // Rings: 30 SWA layers x (512 + 15) slots x 4096 B; draft 5 SWA layers likewise, and (prefix
    // cache on, every draft layer windowed) room for 4 snapshots of them: 5 copies.
    assert_eq!(p.ring_bytes_per_seq, 30 * 527 * 4096);
    assert_eq!(p.draft_ring_bytes_per_seq, 5 * 5 * 527 * 4096);
    assert_eq!(p.ring_bytes(), 2 * (30 + 25) * 527 * 4096);
    // Pool: (12 GiB - rings) / 40,960, rounded down to 16-token pages.
    let pool = (12_884_901_888u64 - 2 * 55 * 527 * 4096) / 40_960 / 16 * 16;
    assert_eq!(pool, 308_768);
    assert_eq!(p.pool_tokens, Some(pool));
    assert!((p.concurrency().unwrap() - 308_768.0 / 262_144.0).abs() < 1e-12);
    // Activations: T = 8192; widest fused qkvg is a SWA layer: 64*128 + 2*8*128 + 64 gates = 10,304;
    // Q 8192; M = max(8192 dense, 8*512 + 512) = 8192; + router f32 [T, 256]; + logits f32 for
    // 2 seqs x 16 rows (k = 15) x 100,352; + 5 tap rows of 2048 BF16 per token.
    let act: u64 = 8192 * (4 * 2048 + 10_304 + 8192 + 2 * 8192) * 2
        + 8192 * 256 * 4
        + 2 * 16 * 100_352 * 4
        + 8192 * 5 * 2048 * 2;
    assert_eq!(act, 894_697_472);
    assert_eq!(p.activations, act);
    assert_eq!(p.reserve, GIB);
    // The CUDA GEMV's tile-interleaved copies: every BF16 Linear it reads once more (rows are
    // multiples of 16 here): the target's attention q/k/v/o/g, layer 0's dense MLP and lm_head,
    // and the draft's 5 layers of q|k|v|g [10304, 2048], o [2048, 8192], MLP 3 x [8192, 2048].
    let copies: u64 = 2_861_957_120
        + 100_663_296
        + 411_041_792
        + 2 * 5 * (10_304 * 2048 + 2048 * 8192 + 3 * 8192 * 2048);
    assert_eq!(p.gemv_copies, copies);
    assert_eq!(p.total, wt + wd + copies + 12_884_901_888 + act + GIB);
    assert_eq!(p.cap, 64 * GIB);
    p.check().unwrap();
    let text = p.to_string();
    assert!(
        text.contains("KV pool: 308,768 tokens, 1.18x of 262,144"),
        "{text}"
    );
    assert!(text.contains("40,960 B/token"), "{text}");

    // FP8 KV halves the per-token bytes and the rings.
    let mut r8 = r.clone();
    r8.kv_cache_dtype = KvCacheDtype::Fp8;
    let p8 = KvPlan::compute(&cfg, Some(&dcfg), &r8, w, mem(128 * GIB));
    assert_eq!(p8.kv_bytes_per_token, 20_480);
    assert_eq!(
        p8.pool_tokens,
        Some((12_884_901_888u64 - 2 * 55 * 527 * 2048) / 20_480 / 16 * 16)
    );

    // Peak during load: weights + copies + reserve on a discrete GPU; on unified memory (GB10)
    // also the largest tensor (embed / lm_head: 100,352 x 2048 BF16) twice, its file pages and
    // the loader's host copy.
    assert_eq!(p.largest_tensor, 411_041_792);
    assert_eq!(p.load_peak, wt + wd + copies + GIB);
    let unified = |total: u64, free: u64| DeviceMemory {
        total,
        free,
        source: "test".into(),
        unified: true,
    };
    let pu = KvPlan::compute(&cfg, Some(&dcfg), &r, w, unified(128 * GIB, 128 * GIB));
    assert_eq!(pu.load_peak, wt + wd + copies + GIB + 2 * 411_041_792);
    pu.check().unwrap();
    assert!(pu.to_string().contains("peak during load"), "{pu}");
    // A load whose peak exceeds the free unified memory is refused before loading, naming the
    // need and what is available, even with an explicit (small) K/V budget.
    let mut tight = r.clone();
    tight.kv_cache_memory_bytes = Some(GIB);
    tight.max_model_len = Some(8192);
    let free = pu.load_peak - 1;
    let e = KvPlan::compute(&cfg, Some(&dcfg), &tight, w, unified(128 * GIB, free))
        .check()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("loading needs a peak of") && e.contains("nothing was loaded"),
        "{e}"
    );
}

#[test]
fn xs21_plan_from_recipe_uses_builtin_config_before_fetch() {
    let cache = tempfile::tempdir().unwrap();
    let env = HubEnv {
        endpoint: "http://127.0.0.1:9".into(),
        token: None,
        cache_dir: cache.path().into(),
        offline: true,
    };
    let opts = PlanOptions {
        device_memory: Some(128 * GIB),
        ..Default::default()
    };
    let (p, src) = plan_recipe(&xs_recipe(), &env, &opts).unwrap();
    assert!(
        src.model_config.contains("built-in"),
        "{}",
        src.model_config
    );
    let (wt, wd) = xs_weights_by_hand();
    assert_eq!((p.weights.target, p.weights.draft), (wt, wd));
    assert_eq!(p.pool_tokens, Some(308_768));
    p.check().unwrap();
}

#[test]
fn plan_refuses_with_the_number_to_change() {
    let r = xs_recipe();
    let (cfg, dcfg) = (
        reference("laguna-xs-2.1-nvfp4.config.json"),
        reference("laguna-xs-2.1-dflash.config.json"),
    );
    let (wt, wd) = xs_weights_by_hand();
    let w = WeightBytes {
        target: wt,
        draft: wd,
        source: WeightsSource::Config,
    };
    // 48 GiB device at 0.5: 24 GiB cap < ~35 GiB total.
    let e = KvPlan::compute(&cfg, Some(&dcfg), &r, w, mem(48 * GIB))
        .check()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("gpu_memory_utilization") && e.contains("cap"),
        "{e}"
    );
    // KV budget too small for one max_model_len sequence.
    let mut small = r.clone();
    small.kv_cache_memory_bytes = Some(4 * GIB);
    let e = KvPlan::compute(&cfg, Some(&dcfg), &small, w, mem(128 * GIB))
        .check()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("kv_cache_memory_bytes") && e.contains("max_model_len"),
        "{e}"
    );
    // Context longer than the model supports; more speculative tokens than the draft's block.
    let mut long = r.clone();
    long.max_model_len = Some(300_000);
    let e = KvPlan::compute(&cfg, Some(&dcfg), &long, w, mem(128 * GIB))
        .check()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("max_model_len") && e.contains("max_position_embeddings"),
        "{e}"
    );
    let mut many = r.clone();
    many.speculative.as_mut().unwrap().num_speculative_tokens = SpecK::Fixed(16);
    let e = KvPlan::compute(&cfg, Some(&dcfg), &many, w, mem(128 * GIB))
        .check()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("num_speculative_tokens") && e.contains("block_size 16"),
        "{e}"
    );
    // Not enough free memory right now.
    let busy = DeviceMemory {
        total: 128 * GIB,
        free: 20 * GIB,
        source: "test".into(),
        unified: false,
    };
    let e = KvPlan::compute(&cfg, Some(&dcfg), &r, w, busy)
        .check()
        .unwrap_err()
        .to_string();
    assert!(e.contains("free"), "{e}");
}

#[test]
fn plan_reads_weights_from_headers_when_present() {
    let dir = common::fixture("models/tiny-chat");
    let p = common::repo_root().join("recipes/tiny-cpu.toml");
    let r = Recipe::resolve(Some(&p), &no_env, &Overrides::default()).unwrap();
    let env = HubEnv {
        endpoint: "http://127.0.0.1:9".into(),
        token: None,
        cache_dir: "/nonexistent".into(),
        offline: true,
    };
    let (plan, _) = plan_recipe(
        &r,
        &env,
        &PlanOptions {
            device_memory: Some(GIB),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(plan.weights.source, WeightsSource::Headers);
    // Independent: sum of (end - start) over the safetensors header of model.safetensors.
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let h: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data: u64 = h
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(_, t)| {
            t["data_offsets"][1].as_u64().unwrap() - t["data_offsets"][0].as_u64().unwrap()
        })
        .sum();
    assert_eq!(plan.weights.target, data);
    assert_eq!(plan.reserve, 0, "no CUDA reserve on cpu");
    plan.check().unwrap();
    let _ = Path::new("");
}

/// Auto plans exactly what a fixed k of block_size - 1 plans (the k the draft is loaded with),
/// and says so; a fixed k plans its own k.
#[test]
fn plan_with_auto_k_is_the_largest_fixed_k() {
    let (cfg, dcfg) = (
        reference("laguna-xs-2.1-nvfp4.config.json"),
        reference("laguna-xs-2.1-dflash.config.json"),
    );
    let (wt, wd) = xs_weights_by_hand();
    let w = WeightBytes {
        target: wt,
        draft: wd,
        source: WeightsSource::Config,
    };
    let with = |k: SpecK| {
        let mut r = xs_recipe();
        r.speculative.as_mut().unwrap().num_speculative_tokens = k;
        KvPlan::compute(&cfg, Some(&dcfg), &r, w, mem(128 * GIB))
    };
    let (auto, fixed15, fixed6) = (
        with(SpecK::Auto),
        with(SpecK::Fixed(15)),
        with(SpecK::Fixed(6)),
    );
    assert_eq!(auto.speculative_tokens, 15);
    assert_eq!(fixed6.speculative_tokens, 6);
    assert_eq!(
        (auto.ring_bytes(), auto.activations, auto.pool_tokens),
        (
            fixed15.ring_bytes(),
            fixed15.activations,
            fixed15.pool_tokens
        )
    );
    assert_eq!(fixed6.ring_slots, 512 + 6);
    auto.check().unwrap();
    assert!(
        auto.to_string()
            .contains("15 speculative, auto's largest k"),
        "{auto}"
    );
    assert!(!fixed15.to_string().contains("auto's"), "{fixed15}");
    // Auto without a block size to bound it is refused by name.
    let mut dnob = dcfg.clone();
    dnob.raw.as_object_mut().unwrap().remove("dflash_config");
    let mut r = xs_recipe();
    r.speculative.as_mut().unwrap().num_speculative_tokens = SpecK::Auto;
    let e = KvPlan::compute(&cfg, Some(&dnob), &r, w, mem(128 * GIB))
        .check()
        .unwrap_err()
        .to_string();
    assert!(e.contains("auto") && e.contains("block_size"), "{e}");
}

/// The CUDA backend splits the same budget the same way: `laguna serve` gives the target the
/// budget minus the draft's rings, the target takes its rings and pages the rest (64-position
/// pages, so at most one page below the plan's 16-token rounding).
#[test]
fn cuda_kv_layout_matches_the_plan() {
    use laguna_engine::config::AttnKind;
    use laguna_engine::cuda::ring::kv_layout;
    let r = xs_recipe();
    let (cfg, dcfg) = (
        reference("laguna-xs-2.1-nvfp4.config.json"),
        reference("laguna-xs-2.1-dflash.config.json"),
    );
    let windows = |c: &LagunaConfig| -> Vec<usize> {
        c.layers
            .iter()
            .map(|l| {
                if l.attn == AttnKind::Sliding {
                    c.sliding_window.unwrap_or(0)
                } else {
                    0
                }
            })
            .collect()
    };
    let (wt, wd) = xs_weights_by_hand();
    let w = WeightBytes {
        target: wt,
        draft: wd,
        source: WeightsSource::Config,
    };
    for dtype in [KvCacheDtype::Bf16, KvCacheDtype::Fp8] {
        let mut rr = r.clone();
        rr.kv_cache_dtype = dtype;
        let p = KvPlan::compute(&cfg, Some(&dcfg), &rr, w, mem(128 * GIB));
        let elt = dtype.bytes() as usize;
        // The engine loads an auto draft with k = block_size - 1 (`LoadOptions`: None).
        let k = 16 - 1;
        let seqs = rr.max_num_seqs;
        let kvw = |c: &LagunaConfig| c.num_kv_heads * c.head_dim;
        let d = kv_layout(
            &windows(&dcfg),
            true,
            k,
            seqs,
            kvw(&dcfg),
            elt,
            64,
            usize::MAX,
        )
        .unwrap();
        let budget = rr.kv_cache_memory_bytes.unwrap() as usize;
        let t = kv_layout(
            &windows(&cfg),
            true,
            k,
            seqs,
            kvw(&cfg),
            elt,
            64,
            budget - d.ring_bytes * (1 + laguna_engine::model::prefix::OWN_SNAPSHOTS_PER_SEQ),
        )
        .unwrap();
        assert_eq!(t.ring, 512 + 15);
        // The engine reserves the draft's own snapshot buffers (every draft layer has a window,
        // the recipe caches prefixes) beside its rings: `CudaDraft::ring_bytes`.
        let d_own = d.ring_bytes * (1 + laguna_engine::model::prefix::OWN_SNAPSHOTS_PER_SEQ);
        assert_eq!((t.ring_bytes + d_own) as u64, p.ring_bytes(), "{dtype:?}");
        let engine_tokens = (t.pages * 64) as u64;
        let plan_tokens = p.pool_tokens.unwrap();
        assert!(
            engine_tokens <= plan_tokens && plan_tokens < engine_tokens + 64,
            "{dtype:?}: engine {engine_tokens}, plan {plan_tokens}"
        );
    }
}

/// Without kv_cache_memory_bytes the plan's K/V budget is what max_num_seqs sequences of
/// max_model_len tokens need (plus rings), not every byte under the cap: a tiny model on a big
/// machine plans megabytes, and a real model still gets the cap's share when that is smaller.
#[test]
fn default_kv_budget_never_exceeds_what_sequences_need() {
    let mut r = xs_recipe();
    r.kv_cache_memory_bytes = None;
    r.max_model_len = Some(4096);
    r.max_num_seqs = 3;
    let cfg = reference("laguna-xs-2.1-nvfp4.config.json");
    let w = WeightBytes {
        target: GIB,
        draft: 0,
        source: WeightsSource::Config,
    };
    let p = KvPlan::compute(&cfg, None, &r, w, mem(128 * GIB));
    // 3 sequences x 4096 tokens x 40,960 B/token (10 full layers, BF16), plus 3 rings.
    assert_eq!(p.pool_tokens, Some(3 * 4096));
    assert_eq!(p.kv_budget, p.ring_bytes() + 3 * 4096 * 40_960);
    p.check().unwrap();
    // At full context the cap's share is the smaller one.
    r.max_model_len = None;
    r.max_num_seqs = 64;
    let p = KvPlan::compute(&cfg, None, &r, w, mem(128 * GIB));
    assert!(p.kv_budget < p.ring_bytes() + 64 * 262_144 * 40_960);
}
