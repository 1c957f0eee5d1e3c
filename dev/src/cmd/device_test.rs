//! `laguna-dev device-test`: the CUDA backend against the CPU reference, in-process, on every
//! fixture model. For device machines without cargo. Prints one line per check and a table last.
use anyhow::{Context, Result};
use laguna_engine::cpu::CpuModel;
use laguna_engine::cuda::{CudaModel, CudaOptions};
use laguna_engine::model::{LogitRows, Model, SeqId, StepInput};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Fixture folders (each with config.json, model.safetensors, reference.safetensors), or a
    /// folder of them.
    #[arg(long, default_value = "tests/fixtures/models")]
    pub fixtures: PathBuf,
    /// Relative tolerance: max|cuda - cpu| <= tol * max|cpu logit| per position.
    #[arg(long, default_value_t = 2e-2)]
    pub tol: f64,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// DFlash draft fixtures (pairs named in SUMMARY.json); checked unless --no-dflash.
    #[arg(long, default_value = "tests/fixtures/drafts")]
    pub drafts: PathBuf,
    #[arg(long)]
    pub no_dflash: bool,
    /// Only the DFlash checks.
    #[arg(long)]
    pub only_dflash: bool,
    /// Instead of the fixtures: DFlash on one draft and target pair, `DRAFT,TARGET` (e.g. the
    /// synthetic XS-2.1 checkpoints of `laguna-dev synth`), k = 6, a fixed 64-token prompt: verify
    /// rows bit-identical to the decoded ones, the device loop's and the driver's tokens the
    /// plain greedy ones. Exits non-zero on a failure.
    #[arg(long, value_name = "DRAFT,TARGET")]
    pub dflash_pair: Option<String>,
    /// The random-config sweep (`--random-configs N --seed S ...`).
    #[command(flatten)]
    pub sweep: super::device_sweep::SweepArgs,
    /// Skip the prefix-cache checks (a multi-turn session cached vs cold, with and without a draft).
    #[arg(long)]
    pub no_prefix: bool,
    /// Only the prefix-cache checks, on one pair `DRAFT,TARGET` (e.g. the synthetic XS-2.1
    /// checkpoints), a 2048-token first prompt.
    #[arg(long, value_name = "DRAFT,TARGET")]
    pub prefix_pair: Option<String>,
    /// Only the prefix store check on one target (no scheduler): restored sequences against ones
    /// that never left, at resume points inside and at the edges of pages and windows, after
    /// prefill and after decode steps. Exits non-zero on a difference.
    #[arg(long, value_name = "TARGET")]
    pub prefix_store: Option<PathBuf>,
}

pub fn read_ids(path: &Path, name: &str) -> Result<Vec<u32>> {
    let bytes = std::fs::read(path)?;
    let st = safetensors::SafeTensors::deserialize(&bytes)?;
    let t = st.tensor(name)?;
    Ok(match t.dtype() {
        safetensors::Dtype::I64 => t
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect(),
        safetensors::Dtype::I32 => t
            .data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect(),
        d => anyhow::bail!("{name}: unexpected dtype {d:?}"),
    })
}

/// Worst row of max|a-b| / max|b| over rows of width v.
pub fn rel_err(a: &[f32], b: &[f32], v: usize) -> (f64, f64) {
    let mut worst = 0f64;
    let mut worst_abs = 0f64;
    for (ra, rb) in a.chunks(v).zip(b.chunks(v)) {
        let mx = rb
            .iter()
            .fold(0f64, |m, &x| m.max((x as f64).abs()))
            .max(1e-30);
        let d = ra.iter().zip(rb).fold(0f64, |m, (&x, &y)| {
            if x.is_finite() {
                m.max((x as f64 - y as f64).abs())
            } else {
                f64::INFINITY
            }
        });
        worst = worst.max(d / mx);
        worst_abs = worst_abs.max(d);
    }
    (worst, worst_abs)
}

pub fn argmax(x: &[f32]) -> usize {
    let mut b = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[b] {
            b = i;
        }
    }
    b
}

pub fn top2_gap(x: &[f32]) -> f64 {
    let b = argmax(x);
    let second = x
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != b)
        .fold(f32::NEG_INFINITY, |m, (_, &v)| m.max(v));
    (x[b] - second) as f64
}

struct Row {
    name: String,
    rows: usize,
    err_pass: f64,
    err_decode: f64,
    batch_inv: bool,
    greedy: String,
    ok: bool,
    note: String,
}

/// Kernel regimes checked: every pass on the f32 weight-streaming kernels ("gemv"), and every pass
/// (decode steps too) on the tensor-core GEMMs ("gemm"). Production mixes them by pass size
/// (`CudaOptions::gemm_min_rows`); each regime is batch-invariant on its own. "fp8": K/V stored
/// as FP8 E4M3 with the production mix, against a CPU reference that rounds its K/V the same way.
/// "cublas": every pass on the GEMM path with the dense BF16 Linears through cuBLAS (production
/// prefill when libcublas loads; "gemm" then checks laguna's own GEMM kernels, the fallback).
/// Third field: FP8 K/V; fourth: cuBLAS allowed.
const MODES: &[(&str, usize, bool, bool)] = &[
    ("gemv", usize::MAX, false, false),
    ("gemm", 1, false, false),
    ("cublas", 1, false, true),
    ("fp8", 32, true, true),
];

/// All logits of `tokens` at `start` of `seq` in one forward.
fn pass_logits(m: &mut CudaModel, seq: SeqId, tokens: &[u32], start: usize) -> Result<Vec<f32>> {
    Ok(m.forward(&[StepInput {
        seq,
        tokens,
        start_pos: start,
        logits: LogitRows::All,
    }])?
    .remove(0)
    .logits)
}

/// Logits of `tokens` fed one row per forward from `start` on `seq` (1-row decode steps).
fn step_logits(m: &mut CudaModel, seq: SeqId, tokens: &[u32], start: usize) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(tokens.len() * m.config().vocab_size);
    for (i, &t) in tokens.iter().enumerate() {
        out.extend(
            m.forward(&[StepInput {
                seq,
                tokens: &[t],
                start_pos: start + i,
                logits: LogitRows::Last,
            }])?
            .remove(0)
            .logits,
        );
    }
    Ok(out)
}

fn check_one(dir: &Path, tol: f64, mode: (&str, usize, bool, bool)) -> Result<Row> {
    let name = format!(
        "{} [{}]",
        dir.file_name().unwrap().to_string_lossy(),
        mode.0
    );
    let reff = dir.join("reference.safetensors");
    let prompt = read_ids(&reff, "prompt_ids")?;
    let greedy = read_ids(&reff, "greedy_ids")?;
    let mut all = prompt.clone();
    all.extend_from_slice(&greedy[..greedy.len().saturating_sub(1)]);
    let mut cpu = CpuModel::load(dir).context("cpu load")?;
    cpu.set_kv_fp8(mode.2);
    let v = cpu.config().vocab_size;
    let cs = cpu.new_seq()?;
    let cref = cpu
        .forward(&[StepInput {
            seq: cs,
            tokens: &all,
            start_pos: 0,
            logits: LogitRows::All,
        }])?
        .remove(0)
        .logits;

    let opts = CudaOptions {
        gemm_min_rows: mode.1,
        kv_fp8: mode.2,
        ..super::device_dflash::opts()
    };
    let mut cu = CudaModel::load(dir, opts.clone()).context("cuda load")?;
    cu.set_cublas(mode.3);
    // A: one pass over everything.
    let s1 = cu.new_seq()?;
    let a = pass_logits(&mut cu, s1, &all, 0)?;
    let (err_pass, abs_pass) = rel_err(&a, &cref, v);
    // B: prefill the prompt, then one token at a time.
    let s2 = cu.new_seq()?;
    let mut b = pass_logits(&mut cu, s2, &prompt, 0)?;
    b.extend(step_logits(
        &mut cu,
        s2,
        &all[prompt.len()..],
        prompt.len(),
    )?);
    let (err_decode, abs_dec) = rel_err(&b, &cref, v);
    // R: sliding-window rings against storing every position (rings off), in the gemm regime
    // (every pass on attention_prefill, which reads a ring, the stage or the paged pool with the
    // same arithmetic): identical logits bit for bit, one pass and prefill + 1-row steps. (In the
    // other regimes a long pass takes attention_prefill with rings and the split-KV kernels
    // without, so they agree only to rounding; the CPU comparison covers them.)
    let ring_ok = if cu.ring_spare().is_some() && mode.1 == 1 {
        Some(rings_bitwise(dir, &opts, mode.3, &all, &prompt, &a, &b)?)
    } else {
        None
    };
    // C: batch invariance: the prompt rows computed in a batch with another sequence equal the
    // rows of pass A bit for bit.
    let s3 = cu.new_seq()?;
    let s4 = cu.new_seq()?;
    let half = &prompt[..prompt.len() / 2 + 1];
    let outs = cu.forward(&[
        StepInput {
            seq: s4,
            tokens: half,
            start_pos: 0,
            logits: LogitRows::All,
        },
        StepInput {
            seq: s3,
            tokens: &prompt,
            start_pos: 0,
            logits: LogitRows::All,
        },
    ])?;
    let np = prompt.len() * v;
    let batch_inv = outs[1].logits[..] == a[..np] && outs[0].logits[..] == a[..half.len() * v];
    // D: rewind s2 (prefill + 1-row steps) and redo its tail the same way: identical to B. With
    // sliding-window rings a sequence can be rewound by at most the ring's spare slots + 1 (what
    // speculative decoding needs); F: rewinding further is refused with an error instead of
    // reading overwritten keys.
    let cont = all.len() - prompt.len();
    let back = cu.ring_spare().map_or(cont, |s| cont.min(s + 1));
    let keep = all.len() - back;
    cu.truncate(s2, keep);
    let redo = step_logits(&mut cu, s2, &all[keep..], keep)?;
    let mut trunc_ok = redo[..] == b[keep * v..];
    if let Some(spare) = cu.ring_spare() {
        if cont > spare + 1 {
            cu.truncate(s1, prompt.len());
            let r = cu.forward(&[StepInput {
                seq: s1,
                tokens: &all[prompt.len()..],
                start_pos: prompt.len(),
                logits: LogitRows::All,
            }]);
            trunc_ok &= r.is_err();
        }
    }
    cu.free_seq(s1);
    // E: greedy through the on-device decode step (CUDA graph): compare with the CPU's greedy
    // picks where the CPU's top-2 gap exceeds the measured error.
    let measured = abs_pass.max(abs_dec);
    let (greedy_s, mism) = greedy_check(&mut cu, &prompt, &greedy, &cref, v, measured)?;
    let ok = err_pass <= tol
        && err_decode <= tol
        && mism == 0
        && trunc_ok
        && ring_ok != Some(false)
        && a.iter().all(|x| x.is_finite());
    let note = format!(
        "abs {abs_pass:.2e}/{abs_dec:.2e}{}{}",
        match ring_ok {
            None => String::new(),
            Some(r) => format!(
                " rings (spare {}) = no rings bitwise: {r}",
                cu.ring_spare().unwrap_or(0)
            ),
        },
        if trunc_ok { "" } else { " truncate-mismatch" }
    );
    Ok(Row {
        name,
        rows: all.len(),
        err_pass,
        err_decode,
        batch_inv,
        greedy: greedy_s,
        ok,
        note,
    })
}

/// Check R of [`check_one`]: the model loaded without sliding-window rings gives logits
/// bit-identical to `a` (one pass over `all`) and `b` (prefill of `prompt`, then 1-row steps).
fn rings_bitwise(
    dir: &Path,
    opts: &CudaOptions,
    cublas: bool,
    all: &[u32],
    prompt: &[u32],
    a: &[f32],
    b: &[f32],
) -> Result<bool> {
    let mut nr = CudaModel::load(
        dir,
        CudaOptions {
            rings: false,
            ..opts.clone()
        },
    )
    .context("cuda load (no rings)")?;
    nr.set_cublas(cublas);
    let t1 = nr.new_seq()?;
    let a2 = pass_logits(&mut nr, t1, all, 0)?;
    let t2 = nr.new_seq()?;
    let mut b2 = pass_logits(&mut nr, t2, prompt, 0)?;
    b2.extend(step_logits(
        &mut nr,
        t2,
        &all[prompt.len()..],
        prompt.len(),
    )?);
    Ok(a == a2 && b == b2)
}

/// Check E of [`check_one`]: greedy through the on-device decode step (CUDA graph) against the
/// CPU's greedy picks in `cref` (teacher-forced rows of `v` logits), counted as a mismatch only
/// where the CPU's top-2 gap exceeds the `measured` error. The summary and the mismatches.
fn greedy_check(
    cu: &mut CudaModel,
    prompt: &[u32],
    greedy: &[u32],
    cref: &[f32],
    v: usize,
    measured: f64,
) -> Result<(String, usize)> {
    let s5 = cu.new_seq()?;
    let first = cu
        .forward(&[StepInput {
            seq: s5,
            tokens: prompt,
            start_pos: 0,
            logits: LogitRows::Last,
        }])?
        .remove(0)
        .logits;
    let mut tok = argmax(&first) as u32;
    let mut mism = 0;
    let mut checked = 0;
    let mut diverged_at = None;
    let mut left_ref = None;
    let mut none = None;
    for step in 0..greedy.len() {
        let crow = &cref[(prompt.len() - 1 + step) * v..(prompt.len() + step) * v];
        let cpu_tok = argmax(crow) as u32;
        if tok != cpu_tok {
            if top2_gap(crow) > 2.0 * measured {
                mism += 1;
            }
            diverged_at = Some(step);
            break;
        }
        checked += 1;
        // The CPU rows were teacher-forced on the reference continuation: once the CPU's own
        // pick leaves it (possible with FP8 K/V, whose rounding the reference lacks), the rows no
        // longer follow the path the GPU decodes; stop comparing there.
        if cpu_tok != greedy[step] {
            left_ref = Some(step);
            break;
        }
        if step + 1 < greedy.len() {
            tok = cu.decode_greedy(s5, tok, &mut none)?;
        }
    }
    let greedy_s = match diverged_at {
        None => match left_ref {
            None => format!("{checked}/{} same", greedy.len()),
            Some(s) => format!(
                "{checked}/{} same (CPU greedy leaves the reference continuation after step {s})",
                greedy.len()
            ),
        },
        Some(s) => format!(
            "{checked}/{} same, differs at {s}{}",
            greedy.len(),
            if mism > 0 {
                " (gap > error!)"
            } else {
                " (within error)"
            }
        ),
    };
    Ok((greedy_s, mism))
}

pub fn run(a: Args) -> Result<()> {
    if a.sweep.random_configs.is_some() {
        return super::device_sweep::run(&a.sweep, a.tol, a.json);
    }
    if let Err(e) = laguna_engine::cuda::gpu_available() {
        println!("SKIP device-test: {e}");
        return Ok(());
    }
    if let Some(pair) = &a.dflash_pair {
        return dflash_pair(pair);
    }
    if let Some(t) = &a.prefix_store {
        return prefix_store(t);
    }
    if let Some(pair) = &a.prefix_pair {
        return prefix_pair(pair);
    }
    let mut dirs = fixture_dirs(&a.fixtures)?;
    let dflash = if a.no_dflash {
        vec![]
    } else {
        super::device_dflash::run_all(&a.drafts, &a.fixtures)?
    };
    let dfails = dflash.iter().filter(|r| !r.ok).count();
    if a.only_dflash {
        dirs.clear();
    }
    let rows = fixture_rows(&dirs, a.tol);
    let srows = if a.only_dflash {
        vec![]
    } else {
        sampling_rows(&dirs)
    };
    let prows = prefix_rows(&a);
    let fails = rows.iter().filter(|r| !r.ok).count()
        + dfails
        + srows.iter().filter(|r| !r.2).count()
        + prows.iter().filter(|r| !r.ok).count();
    if a.json {
        let items: Vec<_> = rows.iter().map(|r| serde_json::json!({"fixture": r.name, "rows": r.rows, "rel_err_pass": r.err_pass, "rel_err_decode": r.err_decode, "batch_invariant": r.batch_inv, "greedy": r.greedy, "ok": r.ok, "note": r.note})).collect();
        println!(
            "{}",
            serde_json::json!({"fixtures": items, "failures": fails})
        );
    } else {
        print_tables(&rows, &srows, &dflash);
    }
    if fails > 0 {
        anyhow::bail!("{fails} fixture(s) failed");
    }
    Ok(())
}

/// `--dflash-pair DRAFT,TARGET`: the DFlash checks on one real pair at k = 6.
fn dflash_pair(pair: &str) -> Result<()> {
    let (dd, td) = pair
        .split_once(',')
        .context("--dflash-pair takes DRAFT,TARGET")?;
    let prompt: Vec<u32> = (0..64u32).map(|i| 100 + 37 * i).collect();
    // (A K/V budget for the XS-2.1 shape's 30 sliding-window rings of 8 sequences.)
    let o = CudaOptions {
        kv_pool_bytes: Some(2 << 30),
        ..super::device_dflash::opts()
    };
    let r =
        super::device_dflash::check_pair(Path::new(dd), Path::new(td), &prompt, 6, 24, o, false)?;
    println!(
        "{} k={}: verify-bitwise {} device-loop-identical {} driver-identical (fused and generic steps) {} accepted {} ({}) -> {}",
        r.name, r.k, r.verify_bitwise, r.fast_same, r.generic_same, r.accepted, r.accept_cmp, if r.ok { "OK" } else { "FAIL" }
    );
    anyhow::ensure!(r.ok, "DFlash pair check failed");
    Ok(())
}

/// `--prefix-store TARGET`: the prefix store's export / restore at block and window edges.
fn prefix_store(t: &Path) -> Result<()> {
    let cfg = laguna_engine::LagunaConfig::from_file(&t.join("config.json"))?;
    let w = cfg.sliding_window.unwrap_or(0);
    let mut points = vec![
        (1, 0),
        (63, 0),
        (64, 0),
        (65, 0),
        (127, 11),
        (2059, 11),
        (2048, 0),
    ];
    if w > 1 {
        points.extend([(w - 1, 0), (w, 0), (w + 1, 0), (w + 7, 3), (2 * w + 5, 0)]);
    }
    let mut fails = 0;
    for chunk in [64, 2048] {
        for r in super::device_prefix::store_check("cuda", t, &points, chunk)? {
            let ok = r.same_tokens && r.max_diff == 0.0;
            println!(
                "prefix store chunk {chunk} pos {} (last {} decoded): max |diff| {:.3e}, tokens {} -> {}",
                r.pos,
                r.decoded,
                r.max_diff,
                if r.same_tokens { "same" } else { "differ" },
                if ok { "OK" } else { "FAIL" }
            );
            fails += usize::from(!ok);
        }
    }
    anyhow::ensure!(fails == 0, "prefix store check failed");
    Ok(())
}

/// `--prefix-pair DRAFT,TARGET`: the prefix cache through the scheduler on one real pair.
fn prefix_pair(pair: &str) -> Result<()> {
    let (dd, td) = pair
        .split_once(',')
        .context("--prefix-pair takes DRAFT,TARGET")?;
    let mut fails = 0;
    let drafts = [None, Some(Path::new(dd))];
    for r in super::device_prefix::check("cuda", Path::new(td), &drafts, 2048)? {
        println!(
            "{} [prefix cache]: cached {:?} {} -> {}",
            r.name,
            r.cached,
            r.note,
            if r.ok { "OK" } else { "FAIL" }
        );
        fails += usize::from(!r.ok);
    }
    anyhow::ensure!(fails == 0, "prefix-cache check failed");
    Ok(())
}

/// The fixture folders: `fixtures` itself when it is one, else its subfolders that are, sorted.
fn fixture_dirs(fixtures: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = vec![];
    if fixtures.join("reference.safetensors").exists() {
        dirs.push(fixtures.to_path_buf());
    } else {
        for e in std::fs::read_dir(fixtures)
            .with_context(|| format!("reading {}", fixtures.display()))?
        {
            let p = e?.path();
            if p.join("reference.safetensors").exists() && p.join("config.json").exists() {
                dirs.push(p);
            }
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// [`check_one`] on every fixture in every mode, one line printed each; an error is a failed row.
fn fixture_rows(dirs: &[PathBuf], tol: f64) -> Vec<Row> {
    let mut rows = vec![];
    for d in dirs.iter().flat_map(|d| MODES.iter().map(move |m| (d, *m))) {
        let (d, mode) = d;
        match check_one(d, tol, mode) {
            Ok(r) => {
                println!(
                    "{}: pass-err {:.3e} decode-err {:.3e} batch-invariant {} greedy {} {} -> {}",
                    r.name,
                    r.err_pass,
                    r.err_decode,
                    r.batch_inv,
                    r.greedy,
                    r.note,
                    if r.ok { "OK" } else { "FAIL" }
                );
                rows.push(r)
            }
            Err(e) => {
                println!("{}: ERROR {e:#}", d.display());
                rows.push(Row {
                    name: format!("{} [{}]", d.file_name().unwrap().to_string_lossy(), mode.0),
                    rows: 0,
                    err_pass: f64::NAN,
                    err_decode: f64::NAN,
                    batch_inv: false,
                    greedy: "-".into(),
                    ok: false,
                    note: format!("{e:#}").chars().take(80).collect(),
                });
            }
        }
    }
    rows
}

/// Sampling on the device, per fixture: sample_rows against the host sampler on a grid of
/// logits and parameters, and generate through pipelined decode steps (decode_launch /
/// decode_collect) against the host-sampled path. Rows of (fixture, note, ok).
fn sampling_rows(dirs: &[PathBuf]) -> Vec<(String, String, bool)> {
    let mut srows: Vec<(String, String, bool)> = vec![];
    for d in dirs {
        let name = d.file_name().unwrap().to_string_lossy().to_string();
        let r = (|| -> Result<(String, bool)> {
            let mut cu = CudaModel::load(d, super::device_dflash::opts())?;
            let g = super::device_sample::logits_grid(&cu, 5)?;
            let prompt = read_ids(&d.join("reference.safetensors"), "prompt_ids")?;
            let (sets, bad, first) = super::device_sample::generate_same(&mut cu, &prompt, 24)?;
            let ok = g.mismatches == 0 && bad == 0;
            let mut note = format!(
                "device sampler = host sampler: {} of {} differ; generate via pipelined decode steps = host-sampled: {} of {sets} parameter sets differ",
                g.mismatches, g.cases, bad
            );
            for x in g.detail.iter().take(2) {
                note.push_str(&format!("; {x}"));
            }
            if !first.is_empty() {
                note.push_str(&format!("; {first}"));
            }
            Ok((note, ok))
        })();
        let (note, ok) = r.unwrap_or_else(|e| (format!("ERROR {e:#}"), false));
        println!(
            "{name} [sampling]: {note} -> {}",
            if ok { "OK" } else { "FAIL" }
        );
        srows.push((name, note, ok));
    }
    srows
}

/// The prefix cache: cached against cold through the scheduler, on the DFlash fixture pair.
fn prefix_rows(a: &Args) -> Vec<super::device_prefix::PrefixRow> {
    let mut prows = vec![];
    let (pt, pd) = (
        a.fixtures.join("swa-yarn-perhead"),
        a.drafts.join("swa-yarn-perhead-causal-w8"),
    );
    if !a.no_prefix && !a.only_dflash && pt.join("config.json").exists() {
        let mut drafts = vec![None];
        if pd.join("config.json").exists() {
            drafts.push(Some(pd.as_path()));
        }
        let rows = super::device_prefix::check("cuda", &pt, &drafts, 20).unwrap_or_else(|e| {
            vec![super::device_prefix::PrefixRow {
                name: pt.display().to_string(),
                ok: false,
                cached: vec![],
                note: format!("ERROR {e:#}"),
            }]
        });
        for r in rows {
            println!(
                "{} [prefix cache]: cached {:?} {} -> {}",
                r.name,
                r.cached,
                r.note,
                if r.ok { "OK" } else { "FAIL" }
            );
            prows.push(r);
        }
    }
    prows
}

/// The summary tables: fixtures, device sampling, DFlash pairs.
fn print_tables(
    rows: &[Row],
    srows: &[(String, String, bool)],
    dflash: &[super::device_dflash::DRow],
) {
    println!(
        "\n| fixture | rows | rel err 1-pass | rel err decode | batch-inv | greedy | result |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {:.2e} | {:.2e} | {} | {} | {} |",
            r.name,
            r.rows,
            r.err_pass,
            r.err_decode,
            r.batch_inv,
            r.greedy,
            if r.ok { "OK" } else { "FAIL" }
        );
    }
    if !srows.is_empty() {
        println!("\n| fixture | device sampling | result |\n|---|---|---|");
        for (n, note, ok) in srows {
            println!("| {n} | {note} | {} |", if *ok { "OK" } else { "FAIL" });
        }
    }
    if !dflash.is_empty() {
        println!("\n| draft pair | k | verify rows bitwise = 1-row decode | device loop = no-draft greedy | driver (fused / generic steps) = no-draft greedy | accepted | vs CPU engine | result |");
        println!("|---|---|---|---|---|---|---|---|");
        for r in dflash {
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.name,
                r.k,
                r.verify_bitwise,
                r.fast_same,
                r.generic_same,
                r.accepted,
                r.accept_cmp,
                if r.ok { "OK" } else { "FAIL" }
            );
        }
    }
}
