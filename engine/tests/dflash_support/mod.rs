//! Shared by the dflash_* integration tests: draft fixture discovery and reference loading.
#![allow(dead_code)]
use laguna_engine::cpu::CpuModel;
use laguna_engine::spec::CpuDraft;
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// Where the draft fixtures live: `LAGUNA_DFLASH_DRAFTS` (a folder of draft folders) or
/// tests/fixtures/drafts.
pub fn drafts_dir() -> PathBuf {
    std::env::var_os("LAGUNA_DFLASH_DRAFTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| fixtures().join("drafts"))
}

/// (draft dir, target dir) for every draft fixture. The target is named by the `target` metadata of
/// the draft's reference.safetensors, else by a `target` file in the draft folder (a path or a
/// fixture name), else by the longest target fixture name the draft folder's name starts with.
pub fn pairs() -> Vec<(PathBuf, PathBuf)> {
    let mut v: Vec<(PathBuf, PathBuf)> = std::fs::read_dir(drafts_dir())
        .expect("tests/fixtures/drafts exists (run tests/fixtures/make_draft_fixtures.py)")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").exists())
        .map(|p| {
            let t = target_of(&p);
            (p, t)
        })
        .collect();
    v.sort();
    assert!(v.len() >= 2, "expected at least two draft fixtures");
    v
}

/// Pairs whose draft folder has a reference.safetensors.
pub fn pairs_with_reference() -> Vec<(PathBuf, PathBuf)> {
    pairs()
        .into_iter()
        .filter(|(d, _)| d.join("reference.safetensors").exists())
        .collect()
}

fn target_of(draft: &Path) -> PathBuf {
    let models = fixtures().join("models");
    if let Ok(bytes) = std::fs::read(draft.join("reference.safetensors")) {
        let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
        if let Some(t) = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get("target").cloned())
        {
            return models.join(t);
        }
    }
    if let Ok(t) = std::fs::read_to_string(draft.join("target")) {
        let t = t.trim();
        let p = Path::new(t);
        return if p.is_absolute() {
            p.to_path_buf()
        } else if draft.join(t).exists() {
            draft.join(t)
        } else {
            models.join(t)
        };
    }
    let name = draft.file_name().unwrap().to_string_lossy().to_string();
    let mut best: Option<String> = None;
    for e in std::fs::read_dir(&models).unwrap().flatten() {
        let m = e.file_name().to_string_lossy().to_string();
        if name.starts_with(&m) && best.as_ref().is_none_or(|b| m.len() > b.len()) {
            best = Some(m);
        }
    }
    models
        .join(best.unwrap_or_else(|| panic!("cannot tell the target of draft {}", draft.display())))
}

/// The prompt for a pair: the target fixture's reference prompt, else a fixed pseudo-random one.
pub fn prompt_for(target: &Path, vocab: usize) -> Vec<u32> {
    if target.join("reference.safetensors").exists() {
        return target_prompt(target).0;
    }
    let mut rng = laguna_engine::sample::Rng::new(42);
    (0..20)
        .map(|_| 3 + (rng.next_u64() % (vocab as u64 - 3)) as u32)
        .collect()
}

pub fn load_pair(draft: &Path, target: &Path) -> (CpuModel, CpuDraft) {
    let t = CpuModel::load(target).unwrap_or_else(|e| panic!("loading {}: {e}", target.display()));
    let d =
        CpuDraft::load(draft, &t).unwrap_or_else(|e| panic!("loading {}: {e}", draft.display()));
    (t, d)
}

pub struct Tensor {
    pub shape: Vec<usize>,
    pub f64s: Vec<f64>,
    pub ids: Vec<u32>,
}

pub fn read_reference(dir: &Path) -> std::collections::HashMap<String, Tensor> {
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, t)| {
            let (f64s, ids) = match t.dtype() {
                Dtype::F64 => (
                    t.data()
                        .chunks_exact(8)
                        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                        .collect(),
                    vec![],
                ),
                Dtype::I64 => (
                    vec![],
                    t.data()
                        .chunks_exact(8)
                        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
                        .collect(),
                ),
                d => panic!("unexpected dtype {d:?} for {name}"),
            };
            (
                name,
                Tensor {
                    shape: t.shape().to_vec(),
                    f64s,
                    ids,
                },
            )
        })
        .collect()
}

/// Target reference (prompt ids, greedy ids) of a target fixture.
pub fn target_prompt(target: &Path) -> (Vec<u32>, Vec<u32>) {
    let r = read_reference(target);
    (r["prompt_ids"].ids.clone(), r["greedy_ids"].ids.clone())
}

/// max|a-b| / max|b|
pub fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    a.iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max((*x as f64 - y).abs()))
        / scale
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}
