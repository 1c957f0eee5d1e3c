//! CPU-side tests of the sweep: generated configs load and run in the CPU engine, the whole
//! harness passes with the CPU engine standing in for the device (logits within 1e-5), and the
//! checks fail when the device under test is wrong.
use super::backend::{self, Device, DeviceOpts};
use super::checks::{self, Limits};
use super::*;
use laguna_engine::config::LagunaConfig;
use laguna_engine::model::{LogitRows, Model, SeqId, StepInput, StepOutput};

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("laguna-sweep-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn settings(quick: bool) -> SweepSettings {
    SweepSettings {
        device: Device::Cpu,
        tol: 2e-2,
        limits: Limits {
            max_prompt: 40,
            gen: 4,
        },
        quick,
    }
}

/// Every shape the generator produces is one the CUDA backend takes (its loaders' shape checks,
/// from the configs alone), over 1,000 seeds; and the widths the kernels' tails exist for do
/// occur (BF16 hidden / expert / dense widths and head dims that are not multiples of 16 or 8).
#[test]
fn generated_shapes_load_on_cuda() {
    let (mut odd_hidden, mut odd_hd8, mut odd_expert) = (0, 0, 0);
    for seed in 0..1000u64 {
        let c = config_gen::case(seed);
        let t = LagunaConfig::from_value(c.target.clone()).unwrap();
        let d = c
            .draft
            .as_ref()
            .map(|d| laguna_engine::spec::DraftConfig::from_value(d.clone()).unwrap());
        backend::cuda_takes_shapes(&t, d.as_ref())
            .unwrap_or_else(|e| panic!("seed {seed}: the CUDA loader refuses {e:#}"));
        odd_hidden += (!c.nvfp4 && t.hidden_size % 16 != 0) as usize;
        odd_hd8 += (t.head_dim % 8 != 0) as usize;
        odd_expert += (!c.nvfp4 && t.moe_intermediate_size % 16 != 0) as usize;
    }
    assert!(
        odd_hidden > 100 && odd_hd8 > 100 && odd_expert > 100,
        "{odd_hidden} {odd_hd8} {odd_expert}"
    );
}

/// Synthesized weights of a sample of generated configs (BF16 and NVFP4 experts, with and
/// without drafts) load in the CPU engine and give finite logits of the right shape.
#[test]
fn synthesized_cases_run_on_the_cpu() {
    let (mut nvfp4, mut drafts) = (0, 0);
    for seed in 0..16u64 {
        let c = config_gen::case(seed);
        let dir = tmp(&format!("synth-{seed}"));
        let text = serde_json::to_string(&c.target).unwrap();
        let so = crate::cmd::synth::SynthOptions {
            seed,
            correction_bias_amp: c.bias_amp,
            ..Default::default()
        };
        crate::cmd::synth::write_checkpoint(&text, &dir.join("t"), &so)
            .unwrap_or_else(|e| panic!("seed {seed}: {e:#}\n{text}"));
        let draft = c.draft.as_ref().map(|d| {
            let dd = dir.join("d");
            crate::cmd::synth::write_checkpoint(&serde_json::to_string(d).unwrap(), &dd, &so)
                .unwrap();
            dd
        });
        let o = DeviceOpts::random(&mut config_gen::Rand::new(seed), Some(16));
        let mut l = backend::load(
            Device::Cpu,
            &dir.join("t"),
            draft.as_deref().map(|d| (d, 1)),
            &o,
        )
        .unwrap_or_else(|e| panic!("seed {seed}: {e:#}"));
        nvfp4 += c.nvfp4 as usize;
        drafts += l.dflash.is_some() as usize;
        let v = l.model.config().vocab_size;
        let s = l.model.new_seq().unwrap();
        let prompt: Vec<u32> = (0..7).map(|i| (i * 13 % v) as u32).collect();
        let out = l
            .model
            .forward(&[StepInput {
                seq: s,
                tokens: &prompt,
                start_pos: 0,
                logits: LogitRows::All,
            }])
            .unwrap();
        assert_eq!(out[0].logits.len(), 7 * v, "seed {seed}");
        assert!(out[0].logits.iter().all(|x| x.is_finite()), "seed {seed}");
        // Random weights scaled by fan-in: logits neither vanish nor explode.
        let mx = out[0].logits.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(mx > 1e-3 && mx < 1e4, "seed {seed}: max |logit| {mx}");
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(
        nvfp4 >= 2 && drafts >= 2,
        "sample too narrow: {nvfp4} nvfp4, {drafts} drafts"
    );
}

/// The whole sweep on a few cases with the CPU engine as the device: every check runs and
/// passes, and the CPU against itself (one pass, chunked prefill, batches) is within 1e-5.
#[test]
fn cpu_harness_end_to_end() {
    let mut with_draft = 0;
    for seed in [1u64, 4, 7] {
        let c = config_gen::case(seed);
        let dir = tmp(&format!("e2e-{seed}"));
        let r = run_case(&c, &settings(false), &dir);
        assert!(r.ok(), "seed {seed}: {:#?}", r);
        assert!(r.worst() <= 1e-5, "seed {seed}: worst {}", r.worst());
        let names: Vec<_> = r.checks.iter().map(|c| c.name).collect();
        let mut want = vec!["pass", "chunked", "batch", "greedy"];
        if c.draft.is_some() {
            want.push("spec");
            with_draft += 1;
        }
        want.push("sched");
        assert_eq!(names, want, "seed {seed}");
        assert!(dir.join("prompts.json").exists() && dir.join("report.json").exists());
        // The kept case reads like a fixture: the longest prompt and the CPU's greedy tokens.
        let reff = dir.join("target/reference.safetensors");
        let p = crate::cmd::device_test::read_ids(&reff, "prompt_ids").unwrap();
        let g = crate::cmd::device_test::read_ids(&reff, "greedy_ids").unwrap();
        assert_eq!(g.len(), 4);
        assert!(!p.is_empty() && p.len() <= 40);
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(with_draft >= 1);
}

/// A case that cannot even be set up is a failed case with its seed, not a panic.
#[test]
fn broken_case_is_reported() {
    let mut c = config_gen::case(3);
    c.target["num_attention_heads_per_layer"] = serde_json::json!([]);
    let dir = tmp("broken");
    let r = run_case(&c, &settings(true), &dir);
    assert!(!r.ok());
    assert_eq!(r.seed, 3);
    assert!(
        r.error
            .as_deref()
            .unwrap_or("")
            .contains("num_attention_heads_per_layer"),
        "{:?}",
        r.error
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A device whose logits are off by `bump` x max|logit| on every row's token 0.
struct Skewed {
    inner: Box<dyn Model>,
    bump: f32,
}

impl Model for Skewed {
    fn config(&self) -> &LagunaConfig {
        self.inner.config()
    }
    fn device(&self) -> &str {
        "skewed"
    }
    fn new_seq(&mut self) -> laguna_engine::Result<SeqId> {
        self.inner.new_seq()
    }
    fn free_seq(&mut self, seq: SeqId) {
        self.inner.free_seq(seq)
    }
    fn seq_len(&self, seq: SeqId) -> usize {
        self.inner.seq_len(seq)
    }
    fn truncate(&mut self, seq: SeqId, len: usize) {
        self.inner.truncate(seq, len)
    }
    fn set_taps(&mut self, layers: &[usize]) {
        self.inner.set_taps(layers)
    }
    fn forward(&mut self, batch: &[StepInput]) -> laguna_engine::Result<Vec<StepOutput>> {
        let v = self.inner.config().vocab_size;
        let mut outs = self.inner.forward(batch)?;
        for o in &mut outs {
            for row in o.logits.chunks_mut(v) {
                let mx = row.iter().fold(0f32, |m, x| m.max(x.abs()));
                row[0] += self.bump * mx;
            }
        }
        Ok(outs)
    }
}

/// The logits checks measure a device's error against the CPU rows: a 5% skew fails the 2e-2
/// tolerance at about 5e-2, a 0.1% skew passes at about 1e-3.
#[test]
fn logits_checks_measure_the_error() {
    let c = config_gen::case(2);
    let dir = tmp("skew");
    crate::cmd::synth::write_checkpoint(
        &serde_json::to_string(&c.target).unwrap(),
        &dir,
        &Default::default(),
    )
    .unwrap();
    let mut cpu = backend::load_reference(&dir).unwrap();
    let r = checks::reference(cpu.as_mut(), &[5, 6, 7, 8, 9, 10], 3).unwrap();
    for (bump, fails) in [(0.05f32, true), (0.001, false)] {
        let mut dev = Skewed {
            inner: backend::load_reference(&dir).unwrap(),
            bump,
        };
        let mut rng = config_gen::Rand::new(1);
        let (a, b, abs) = checks::logits_checks(&mut dev, &r, &mut rng, 2e-2).unwrap();
        for ch in [&a, &b] {
            assert_eq!(!ch.ok, fails, "bump {bump}: {ch:?}");
            assert!(
                (ch.err - bump as f64).abs() < 0.2 * bump as f64,
                "bump {bump}: {ch:?}"
            );
        }
        assert!(abs > 0.0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn reference_of(rows: Vec<Vec<f32>>, prompt_len: usize, cont: Vec<u32>) -> checks::Reference {
    let vocab = rows[0].len();
    checks::Reference {
        prompt: vec![1; prompt_len],
        cont,
        logits: rows.concat(),
        vocab,
    }
}

/// Greedy tokens may leave the reference only where its top-2 gap is within twice the error.
#[test]
fn greedy_verdict_follows_the_gap_rule() {
    // Prompt of 1: rows 0, 1, 2 pick continuation tokens 0, 1, 2.
    let r = reference_of(
        vec![
            vec![0.0, 1.0, 0.95],
            vec![2.0, 0.0, 0.0],
            vec![0.0, 0.0, 1.0],
        ],
        1,
        vec![1, 0, 2],
    );
    assert_eq!(checks::greedy_verdict(&[1, 0, 2], &r, 0.0), (3, None, true));
    // Differs at step 0 where the gap is 0.05: fine with an error of 0.03, not of 0.02.
    let (n, d, ok) = checks::greedy_verdict(&[2, 0, 2], &r, 0.03);
    assert_eq!((n, d.map(|d| d.0), ok), (0, Some(0), true));
    assert!(!checks::greedy_verdict(&[2, 0, 2], &r, 0.02).2);
    // Differs at step 1 where the gap is 2.
    assert!(!checks::greedy_verdict(&[1, 1, 2], &r, 0.5).2);
    // Too few tokens fail.
    assert!(!checks::greedy_verdict(&[1, 0], &r, 0.0).2);
}

/// Bitwise batch invariance is expected on CUDA only where every pass touching the rows makes
/// the same kernel choice (gemm_min_rows = 32 by default, split-KV past 64 rows, staged rings,
/// cuBLAS's choice by the GEMM pass's rows).
#[test]
fn bitwise_only_within_one_kernel_choice() {
    let o = |rows, spec_k| DeviceOpts {
        page_size: 16,
        max_rows: rows,
        spec_k,
        max_seqs: 2,
        kv_pool_bytes: None,
    };
    let cuda = |o: &DeviceOpts, rings: bool, p: usize, q: usize| {
        backend::bitwise_expected(Device::Cuda, o, rings, &[(&[p], 0), (&[q, p], 1)])
    };
    // Passes of 16 rows: all weight-streaming, no ring staging without rings.
    assert!(cuda(&o(16, 0), false, 40, 10));
    // With rings and spec_k 0 every multi-row pass is staged: 16-row passes all staged.
    assert!(cuda(&o(16, 0), true, 40, 10));
    // One pass each, 40 and 50 rows: both GEMM, both <= 64, but cuBLAS (allowed by the sweep's
    // loads) picks its algorithm by the row count.
    assert!(!cuda(&o(2048, 0), false, 40, 10));
    // 40-row passes: solo 80 rows in two, batched after 40 others in the second and third: GEMM
    // passes of one row count.
    assert!(cuda(&o(40, 0), false, 80, 40));
    // 60 rows alone (<= 64) vs 60 after 10 (70 rows: one split).
    assert!(!cuda(&o(2048, 0), false, 60, 10));
    // 48-row passes: solo 40 rows (GEMM); batched rows 10..50 in passes of 48 (GEMM) and 2.
    assert!(!cuda(&o(48, 0), false, 40, 10));
    // Short prompts: 5 rows alone, 5 after 3: both weight-streaming.
    assert!(cuda(&o(2048, 15), true, 5, 3));
    // ... unless the other sequence's rows need the staged ring path and ours do not.
    assert!(!cuda(&o(2048, 4), true, 5, 8));
    // 20 rows alone (streaming) vs 20 after 20 (one 40-row GEMM pass).
    assert!(!cuda(&o(2048, 0), false, 20, 20));
    assert!(backend::bitwise_expected(
        Device::Cpu,
        &o(48, 0),
        true,
        &[(&[40], 0), (&[10, 40], 1)]
    ));
}
