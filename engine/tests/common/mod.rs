//! Shared by the engine's integration tests: fixture discovery and reference loading.
#![allow(dead_code)]
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models")
}

/// Every fixture model folder that carries a float64 reference.
pub fn reference_fixtures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .expect("tests/fixtures/models exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("reference.safetensors").exists())
        .collect();
    v.sort();
    assert!(
        !v.is_empty(),
        "no fixtures with reference.safetensors found"
    );
    v
}

pub struct Reference {
    pub prompt_ids: Vec<u32>,
    pub prompt_logits: Vec<Vec<f64>>,
    pub greedy_ids: Vec<u32>,
    pub greedy_logits: Vec<Vec<f64>>,
}

fn f64_rows(st: &SafeTensors, name: &str) -> Vec<Vec<f64>> {
    let t = st
        .tensor(name)
        .unwrap_or_else(|_| panic!("reference lacks {name}"));
    assert_eq!(t.dtype(), Dtype::F64, "{name}");
    let cols = t.shape()[1];
    let vals: Vec<f64> = t
        .data()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    vals.chunks(cols).map(|c| c.to_vec()).collect()
}

fn ids(st: &SafeTensors, name: &str) -> Vec<u32> {
    let t = st
        .tensor(name)
        .unwrap_or_else(|_| panic!("reference lacks {name}"));
    assert_eq!(t.dtype(), Dtype::I64, "{name}");
    t.data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect()
}

pub fn load_reference(dir: &Path) -> Reference {
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    Reference {
        prompt_ids: ids(&st, "prompt_ids"),
        prompt_logits: f64_rows(&st, "prompt_logits"),
        greedy_ids: ids(&st, "greedy_ids"),
        greedy_logits: f64_rows(&st, "greedy_logits"),
    }
}

/// max |a - b| / max |b| over one row.
pub fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs()));
    let d = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max((*x as f64 - y).abs()));
    d / scale
}

pub fn rel_err32(a: &[f32], b: &[f32]) -> f64 {
    let b64: Vec<f64> = b.iter().map(|&v| v as f64).collect();
    rel_err(a, &b64)
}
