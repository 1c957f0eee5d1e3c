//! The tensor inventory check: every tensor the config implies (engine `schema::inventory` for the
//! target, [`super::draft::inventory`] for a DFlash draft) is present with its shape and dtype,
//! every NVFP4 Linear has its full triplet, and nothing unexpected is left over.
use laguna_engine::model::schema::{is_auxiliary, Expected};
use laguna_engine::weights::linear::LinearSource;
use laguna_engine::weights::store::WeightStore;
use safetensors::Dtype;
use std::collections::{BTreeMap, HashSet};

/// Problems keyed by the file they concern (`None`: the checkpoint as a whole).
pub type Findings = Vec<(Option<String>, String)>;

pub struct InventoryResult {
    pub problems: Findings,
    /// Files that hold none of the expected tensors (e.g. a reference/extra file): notes, not errors.
    pub foreign_files: BTreeMap<String, usize>,
    pub checked: usize,
}

fn file_of(store: &WeightStore, name: &str) -> Option<String> {
    let info = store.info(name)?;
    let p = &store.files[info.file];
    Some(
        p.strip_prefix(&store.dir)
            .unwrap_or(p)
            .to_string_lossy()
            .into_owned(),
    )
}

/// The file that holds tensors next to `prefix` (same parent module), for "expected in …" hints.
fn neighbour_file(store: &WeightStore, prefix: &str) -> Option<String> {
    let parent = prefix.rsplit_once('.').map(|(p, _)| format!("{p}."))?;
    let n = store.names().find(|n| n.starts_with(&parent))?.clone();
    file_of(store, &n)
}

const NVFP4_PARTS: [&str; 4] = [
    "weight_packed",
    "weight_scale",
    "weight_global_scale",
    "input_global_scale",
];

pub fn check(store: &WeightStore, expected: &[Expected]) -> InventoryResult {
    let mut problems: Findings = vec![];
    let mut claimed: HashSet<String> = HashSet::new();
    for e in expected {
        match e {
            Expected::Linear { prefix, out, inp } => match store.linear(prefix, *out, *inp) {
                Ok(LinearSource::Dense(_)) => {
                    claimed.insert(format!("{prefix}.weight"));
                }
                Ok(LinearSource::Nvfp4 { .. }) => {
                    for part in NVFP4_PARTS {
                        claimed.insert(format!("{prefix}.{part}"));
                    }
                }
                Err(err) => {
                    let file = file_of(store, &format!("{prefix}.weight_packed"))
                        .or_else(|| file_of(store, &format!("{prefix}.weight")))
                        .or_else(|| neighbour_file(store, prefix));
                    // Claim whatever parts exist so they are not reported twice as unexpected.
                    let present: Vec<&str> = NVFP4_PARTS
                        .iter()
                        .copied()
                        .chain(["weight"])
                        .filter(|p| store.contains(&format!("{prefix}.{p}")))
                        .collect();
                    for p in &present {
                        claimed.insert(format!("{prefix}.{p}"));
                    }
                    let have = if present.is_empty() {
                        String::new()
                    } else {
                        format!(" (present: {})", present.join(", "))
                    };
                    problems.push((
                        file,
                        format!("Linear `{prefix}` [{out}, {inp}]: {err}{have}"),
                    ));
                }
            },
            Expected::Tensor { name, shape } => {
                claimed.insert(name.clone());
                match store.get(name) {
                    Err(_) => {
                        let hint = neighbour_file(store, name)
                            .map(|f| format!(" (its neighbours are in {f})"))
                            .unwrap_or_default();
                        problems
                            .push((None, format!("tensor `{name}` {shape:?} is missing{hint}")));
                    }
                    Ok(t) => {
                        if t.shape != shape.as_slice() {
                            problems.push((
                                file_of(store, name),
                                format!(
                                    "tensor `{name}` has shape {:?}, the config implies {shape:?}",
                                    t.shape
                                ),
                            ));
                        }
                        if !matches!(t.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
                            problems.push((
                                file_of(store, name),
                                format!(
                                    "tensor `{name}` has dtype {:?}, expected BF16, F16 or F32",
                                    t.dtype
                                ),
                            ));
                        }
                    }
                }
            }
        }
    }
    // Leftovers: per file, unless the file holds nothing we expect at all.
    let mut per_file: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    for n in store.names() {
        let f = file_of(store, n).unwrap_or_default();
        let entry = per_file.entry(f).or_default();
        if claimed.contains(n) {
            entry.0 += 1;
        } else if !is_auxiliary(n) {
            entry.1.push(n.clone());
        }
    }
    let mut foreign_files = BTreeMap::new();
    for (f, (ours, mut extra)) in per_file {
        if extra.is_empty() {
            continue;
        }
        if ours == 0 {
            foreign_files.insert(f, extra.len());
            continue;
        }
        extra.sort();
        let shown: Vec<String> = extra.iter().take(8).map(|n| format!("`{n}`")).collect();
        let more = if extra.len() > 8 {
            format!(" and {} more", extra.len() - 8)
        } else {
            String::new()
        };
        problems.push((
            Some(f),
            format!(
                "{} unexpected tensor(s) not in the Laguna schema for this config: {}{more} (renamed, or a config/checkpoint mismatch)",
                extra.len(),
                shown.join(", ")
            ),
        ));
    }
    InventoryResult {
        problems,
        foreign_files,
        checked: expected.len(),
    }
}
