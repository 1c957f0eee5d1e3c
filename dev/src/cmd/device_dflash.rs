//! DFlash checks of `laguna-dev device-test`, for every draft fixture pair under
//! `tests/fixtures/drafts` and k in {1, 3, 6, 15} (k < block_size):
//! 1. verify batch invariance, directly: the target's logits for `[t, d_1..d_k]` verified in one
//!    k+1-row pass are bit-identical to the same rows decoded one at a time;
//! 2. greedy output with the CUDA draft is token-identical to greedy output without it: on the
//!    device-resident loop (`DeviceDraft::generate_on_device`, CUDA graphs), and through the
//!    backend-agnostic driver (`spec::generate_spec` with the CUDA draft as a `DraftModel`) both
//!    with its decode steps fused into device steps and with every step generic
//!    (`DeviceDraft::set_fused_steps(false)`);
//! 3. acceptance statistics match the CPU engine (CPU target + CPU draft) on every step until the
//!    first step where the two drafts propose different tokens.
use anyhow::{Context, Result};
use laguna_engine::backend::{self, Device, LoadOptions};
use laguna_engine::generate::{generate, GenerateRequest};
use laguna_engine::model::device::LoopTiming;
use laguna_engine::model::{LogitRows, StepInput};
use laguna_engine::sample::SamplingParams;
use laguna_engine::spec::generate_spec;
use std::path::{Path, PathBuf};

pub struct DRow {
    pub name: String,
    pub k: usize,
    pub verify_bitwise: bool,
    pub fast_same: bool,
    pub generic_same: bool,
    pub accept_cmp: String,
    pub accepted: String,
    pub ok: bool,
}

fn read_target(draft_dir: &Path) -> Result<String> {
    let sum: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        draft_dir.parent().unwrap().join("SUMMARY.json"),
    )?)?;
    let name = draft_dir.file_name().unwrap().to_string_lossy().to_string();
    sum[&name]["target"]
        .as_str()
        .map(|s| s.to_string())
        .with_context(|| format!("SUMMARY.json has no target for {name}"))
}

/// Load options for the tiny fixtures on the device (small pool and passes, rings for any k;
/// device-test uses them too).
pub fn opts() -> LoadOptions {
    LoadOptions {
        pass_rows: Some(64),
        kv_cache_bytes: Some(64 << 20),
        page_size: Some(16),
        spare_rows: Some(backend::MAX_SPEC_K),
        ..Default::default()
    }
}

/// `cpu`: also compare proposals and acceptance with the CPU engine (fixtures; far too slow for
/// a full-size checkpoint).
pub fn check_pair(
    ddir: &Path,
    tdir: &Path,
    prompt: &[u32],
    k: usize,
    gen: usize,
    o: LoadOptions,
    cpu: bool,
) -> Result<DRow> {
    let name = ddir.file_name().unwrap().to_string_lossy().to_string();
    let req = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens: gen,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        stop_token_ids: vec![],
    };
    // Plain greedy on the device.
    let mut loaded = backend::load(Device::Cuda(0), &o, tdir, None).context("cuda target")?;
    let cu = loaded.device().context("a CUDA target")?;
    let plain = generate(cu, &req, false)?.completion;
    // 1. Verify rows vs one-row decode, bitwise, for [t, plain continuation...].
    let s = cu.new_seq()?;
    cu.forward(&[StepInput {
        seq: s,
        tokens: prompt,
        start_pos: 0,
        logits: LogitRows::None,
    }])?;
    // The first verify after the prompt: [t, d_1..d_k] at positions p0.. (here the greedy tokens).
    let rows: Vec<u32> = plain[..(k + 1).min(plain.len())].to_vec();
    let p0 = prompt.len();
    let many = cu
        .forward(&[StepInput {
            seq: s,
            tokens: &rows,
            start_pos: p0,
            logits: LogitRows::All,
        }])?
        .remove(0)
        .logits;
    cu.truncate(s, p0);
    let mut one = vec![];
    for (i, &t) in rows.iter().enumerate() {
        one.extend(
            cu.forward(&[StepInput {
                seq: s,
                tokens: &[t],
                start_pos: p0 + i,
                logits: LogitRows::All,
            }])?
            .remove(0)
            .logits,
        );
    }
    cu.free_seq(s);
    let verify_bitwise = many == one;
    // 2a. Device-resident loop.
    let mut dr = cu.load_draft(ddir).context("cuda draft")?;
    let fast = dr.generate_on_device(cu, &req, k, true, LoopTiming::Wall)?;
    let fast_same = fast.completion == plain;
    // 2b. The backend-agnostic driver (what the server runs) with the CUDA draft: its greedy
    // decode steps are fused into device steps (`DraftModel::fused_greedy_step`), and with
    // `set_fused_steps(false)` every step takes the generic path (taps and logits through the host).
    cu.set_taps_on_device(false)?;
    let (fused, fstats) = generate_spec(cu, dr.as_mut(), &req, k, true, None)?;
    dr.set_fused_steps(false);
    let generic = generate_spec(cu, dr.as_mut(), &req, k, true, None);
    dr.set_fused_steps(true);
    let (generic, gstats) = generic?;
    let generic_same = generic.completion == plain && fused.completion == plain;
    // 3. Acceptance vs the CPU engine.
    let cstats = if cpu {
        let o = LoadOptions {
            num_speculative_tokens: Some(k),
            ..Default::default()
        };
        let mut cpu = backend::load(Device::Cpu, &o, tdir, Some(ddir)).context("cpu pair")?;
        cpu.generate(&req, false, None)?
            .1
            .context("the CPU pair's statistics")?
    } else {
        fast.stats.clone()
    };
    let mut agree = 0;
    let mut acc_same = true;
    for ((pc, ac), (pg, ag)) in cstats.proposals.iter().zip(&cstats.acceptance_lengths).zip(
        fast.stats
            .proposals
            .iter()
            .zip(&fast.stats.acceptance_lengths),
    ) {
        if pc != pg {
            break;
        }
        agree += 1;
        acc_same &= ac == ag;
    }
    let fast_vs_generic = fast.stats.acceptance_lengths == gstats.acceptance_lengths
        && fstats.acceptance_lengths == gstats.acceptance_lengths;
    let accept_cmp = format!(
        "{agree}/{} steps same proposals as {}{}{}",
        cstats.acceptance_lengths.len(),
        if cpu { "CPU" } else { "itself (no CPU run)" },
        if acc_same {
            ", same acceptance"
        } else {
            ", ACCEPTANCE DIFFERS"
        },
        if fast_vs_generic {
            ""
        } else {
            "; device loop / fused / generic driver acceptance differ"
        }
    );
    let accepted = format!(
        "{}/{}",
        fast.stats.num_accepted_tokens, fast.stats.num_draft_tokens
    );
    let ok = verify_bitwise && fast_same && generic_same && acc_same && fast_vs_generic;
    Ok(DRow {
        name,
        k,
        verify_bitwise,
        fast_same,
        generic_same,
        accept_cmp,
        accepted,
        ok,
    })
}

pub fn run_all(drafts: &Path, models: &Path) -> Result<Vec<DRow>> {
    let mut dirs: Vec<PathBuf> = vec![];
    for e in std::fs::read_dir(drafts).with_context(|| format!("reading {}", drafts.display()))? {
        let p = e?.path();
        if p.join("config.json").exists() {
            dirs.push(p);
        }
    }
    dirs.sort();
    let mut out = vec![];
    for d in &dirs {
        let tname = read_target(d)?;
        let tdir = models.join(&tname);
        let reff = tdir.join("reference.safetensors");
        let prompt = super::device_test::read_ids(&reff, "prompt_ids")?;
        let bs = laguna_engine::spec::DraftConfig::from_file(&d.join("config.json"))?.block_size;
        for k in [1usize, 3, 6, 15] {
            let name = d.file_name().unwrap().to_string_lossy().to_string();
            if k >= bs {
                println!("{name} k={k}: SKIP (block_size {bs})");
                continue;
            }
            match check_pair(d, &tdir, &prompt, k, 40, opts(), true) {
                Ok(r) => {
                    println!(
                        "{} k={}: verify-bitwise {} device-loop-identical {} driver-identical (fused and generic steps) {} accepted {} ({}) -> {}",
                        r.name, r.k, r.verify_bitwise, r.fast_same, r.generic_same, r.accepted, r.accept_cmp, if r.ok { "OK" } else { "FAIL" }
                    );
                    out.push(r);
                }
                Err(e) => {
                    println!("{name} k={k}: ERROR {e:#}");
                    out.push(DRow {
                        name,
                        k,
                        verify_bitwise: false,
                        fast_same: false,
                        generic_same: false,
                        accept_cmp: format!("{e:#}").chars().take(80).collect(),
                        accepted: "-".into(),
                        ok: false,
                    });
                }
            }
        }
    }
    Ok(out)
}
