//! `laguna verify`: is a fetched (or local) checkpoint complete, uncorrupted and the shape the
//! config says? One line per file, a summary, and [`Report::ok`] only when all is well.
//!
//! Checks, per folder: no `*.incomplete` leftovers; sizes and SHA-256 against the fetch manifest;
//! cache blobs against their names (64-hex SHA-256, 40-hex git blob SHA-1); every shard the index
//! lists exists and holds the tensors the index says; every safetensors header parses with ranges
//! inside the file; the tensor inventory matches the Laguna schema (target) or the DFlash schema
//! (draft), including NVFP4 triplets; the draft's vocab and tap layers fit the target.
pub mod digest;
pub mod draft;
pub mod header;
mod inventory;

use crate::fetch::pool::parallel;
use crate::fetch::progress::{commas, human, Progress};
use crate::hub::{HubEnv, HubError, Manifest};
use crate::recipe::Recipe;
use digest::{etag_kind, hash_file, EtagKind};
use laguna_engine::config::LagunaConfig;
use laguna_engine::model::schema;
use laguna_engine::weights::store::{WeightStore, INDEX_FILE};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// Skip hashing (sizes, headers and the inventory are still checked).
    pub fast: bool,
    pub progress: bool,
    pub workers: usize,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        let workers = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        VerifyOptions {
            fast: false,
            progress: true,
            workers,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Model,
    Draft,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Model => "model",
            Role::Draft => "draft",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashStatus {
    /// Matched the named reference ("sha256 = manifest", "sha256 = blob name", ...).
    Ok(String),
    Skipped,
    /// No reference to compare with (not fetched by laguna, not a cache blob).
    NoReference,
    Mismatch,
    NotApplicable,
}

#[derive(Debug, Clone)]
pub struct FileLine {
    pub path: String,
    pub size: Option<u64>,
    pub hash: HashStatus,
    pub problems: Vec<String>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Section {
    pub role: Role,
    pub dir: PathBuf,
    pub files: Vec<FileLine>,
    /// Problems that are not about one file.
    pub general: Vec<String>,
    pub tensors_checked: usize,
}

impl Section {
    pub fn ok(&self) -> bool {
        self.general.is_empty() && self.files.iter().all(|f| f.problems.is_empty())
    }
    fn file(&mut self, path: &str) -> &mut FileLine {
        if let Some(i) = self.files.iter().position(|f| f.path == path) {
            return &mut self.files[i];
        }
        self.files.push(FileLine {
            path: path.to_string(),
            size: None,
            hash: HashStatus::NotApplicable,
            problems: vec![],
            notes: vec![],
        });
        self.files.last_mut().unwrap()
    }
    fn problem(&mut self, file: Option<&str>, msg: String) {
        match file {
            Some(f) => self.file(f).problems.push(msg),
            None => self.general.push(msg),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Report {
    pub sections: Vec<Section>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.sections.iter().all(Section::ok)
    }
    /// `role/file: reason` for every problem.
    pub fn problems(&self) -> Vec<String> {
        let mut v = vec![];
        for s in &self.sections {
            for f in &s.files {
                for p in &f.problems {
                    v.push(format!("{}/{}: {p}", s.role, f.path));
                }
            }
            for p in &s.general {
                v.push(format!("{}: {p}", s.role));
            }
        }
        v
    }
    /// Names of the bad files (`role/file`).
    pub fn bad_files(&self) -> Vec<String> {
        self.sections
            .iter()
            .flat_map(|s| {
                s.files
                    .iter()
                    .filter(|f| !f.problems.is_empty())
                    .map(move |f| format!("{}/{}", s.role, f.path))
            })
            .collect()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut nfiles = 0;
        let mut bytes = 0;
        for s in &self.sections {
            writeln!(f, "{}: {}", s.role, s.dir.display())?;
            for l in &s.files {
                nfiles += 1;
                bytes += l.size.unwrap_or(0);
                let size = l.size.map_or("missing".to_string(), human);
                let hash = match &l.hash {
                    HashStatus::Ok(what) => what.clone(),
                    HashStatus::Skipped => "hash skipped (--fast)".into(),
                    HashStatus::NoReference => "no Hub hash to compare".into(),
                    HashStatus::Mismatch => "HASH MISMATCH".into(),
                    HashStatus::NotApplicable => String::new(),
                };
                let notes = if l.notes.is_empty() {
                    String::new()
                } else {
                    format!("; {}", l.notes.join("; "))
                };
                if l.problems.is_empty() {
                    writeln!(f, "  ok    {}  {size}  {hash}{notes}", l.path)?;
                } else {
                    writeln!(f, "  FAIL  {}  {size}  {}", l.path, l.problems.join("; "))?;
                }
            }
            for g in &s.general {
                writeln!(f, "  FAIL  ({})  {g}", s.role)?;
            }
            if s.tensors_checked > 0 {
                writeln!(
                    f,
                    "  {} expected tensors/linears checked against the config",
                    commas(s.tensors_checked as u64)
                )?;
            }
        }
        let bad = self.bad_files();
        let general: usize = self.sections.iter().map(|s| s.general.len()).sum();
        if self.ok() {
            write!(f, "verify: OK, {nfiles} files, {}", human(bytes))
        } else {
            write!(
                f,
                "verify: FAILED, {} bad file(s) of {nfiles}{}{}",
                bad.len(),
                if bad.is_empty() {
                    String::new()
                } else {
                    format!(": {}", bad.join(", "))
                },
                if general > 0 {
                    format!("; {general} other problem(s)")
                } else {
                    String::new()
                }
            )
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Hub(#[from] HubError),
    #[error("verify needs a model folder: give --recipe FILE or --model DIR")]
    NoModel,
}

/// Every file under `dir` (relative, `/`-separated), skipping the `.cache` folder of local downloads.
fn list_files(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p
                .strip_prefix(base)
                .unwrap_or(&p)
                .to_string_lossy()
                .replace('\\', "/");
            if rel == ".cache" || rel == ".git" {
                continue;
            }
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut v = vec![];
    walk(dir, dir, &mut v);
    v.sort();
    v
}

/// What a file's content must hash to, and where that expectation came from.
#[derive(Debug, Clone)]
struct HashRef {
    kind: EtagKind,
    want: String,
    from: &'static str,
}

fn hash_refs(dir: &Path, rel: &str, manifest: Option<&Manifest>) -> Vec<HashRef> {
    let mut v = vec![];
    if let Some(m) = manifest.and_then(|m| m.file(rel)) {
        v.push(HashRef {
            kind: EtagKind::Sha256,
            want: m.sha256.to_ascii_lowercase(),
            from: "manifest",
        });
    }
    if let Ok(target) = std::fs::read_link(dir.join(rel)) {
        if let Some(name) = target.file_name().map(|n| n.to_string_lossy().into_owned()) {
            match etag_kind(&name) {
                EtagKind::Sha256 => v.push(HashRef {
                    kind: EtagKind::Sha256,
                    want: name.to_ascii_lowercase(),
                    from: "blob name",
                }),
                EtagKind::GitSha1 => v.push(HashRef {
                    kind: EtagKind::GitSha1,
                    want: name.to_ascii_lowercase(),
                    from: "blob name",
                }),
                EtagKind::Opaque => {}
            }
        }
    }
    v
}

/// Check one model folder. `target` is the target config when `role` is the draft.
pub fn verify_dir(
    role: Role,
    dir: &Path,
    target: Option<&LagunaConfig>,
    opts: &VerifyOptions,
    progress: &Progress,
) -> (Section, Option<LagunaConfig>) {
    let mut s = Section {
        role,
        dir: dir.to_path_buf(),
        files: vec![],
        general: vec![],
        tensors_checked: 0,
    };
    if !dir.is_dir() {
        s.general.push(format!(
            "{} is not a folder; run `laguna fetch` or pass the folder that holds config.json",
            dir.display()
        ));
        return (s, None);
    }
    for rel in list_files(dir) {
        let size = std::fs::metadata(dir.join(&rel)).map(|m| m.len()).ok();
        let l = s.file(&rel);
        l.size = size;
        if size.is_none() {
            l.problems
                .push("unreadable (a dangling link into the cache? re-run `laguna fetch`)".into());
        }
        if rel.ends_with(".incomplete") {
            l.problems.push(
                "partial download left behind (*.incomplete); re-run `laguna fetch` to finish it"
                    .into(),
            );
        }
    }
    // Partial downloads outside the folder: cache blobs, or the local-dir download area.
    let canon = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let manifest_path = Manifest::path_for_dir(dir);
    let mut partial_dirs = vec![dir.join(".cache").join("laguna").join("download")];
    if canon
        .parent()
        .and_then(|p| p.file_name())
        .is_some_and(|n| n == "snapshots")
    {
        if let Some(root) = canon.parent().and_then(Path::parent) {
            partial_dirs.push(root.join("blobs"));
        }
    }
    for pd in partial_dirs {
        for p in list_files(&pd)
            .into_iter()
            .filter(|p| p.ends_with(".incomplete"))
        {
            s.general.push(format!(
                "partial download {} is left behind; re-run `laguna fetch` to finish it",
                pd.join(p).display()
            ));
        }
    }
    // Manifest: every file present with its size.
    let manifest = match Manifest::load(&manifest_path) {
        Some(Ok(m)) => Some(m),
        Some(Err(e)) => {
            s.general.push(e);
            None
        }
        None => None,
    };
    if let Some(m) = &manifest {
        for mf in &m.files {
            let l = s.file(&mf.path);
            match l.size {
                None if !l.problems.is_empty() => {}
                None => l.problems.push(format!(
                    "missing: the fetch manifest lists it ({} bytes); re-run `laguna fetch`",
                    commas(mf.size)
                )),
                Some(sz) if sz != mf.size => {
                    l.problems.push(format!(
                    "size is {} bytes, the Hub says {} ({}); delete it and re-run `laguna fetch`",
                    commas(sz),
                    commas(mf.size),
                    if sz < mf.size { "truncated" } else { "too long" }
                ))
                }
                _ => {}
            }
        }
    }
    // Hashes, in parallel, with one bar over all bytes.
    let jobs: Vec<(String, Vec<HashRef>)> = s
        .files
        .iter()
        .filter(|l| l.size.is_some())
        .map(|l| (l.path.clone(), hash_refs(dir, &l.path, manifest.as_ref())))
        .collect();
    if opts.fast {
        for (rel, refs) in &jobs {
            s.file(rel).hash = if refs.is_empty() {
                HashStatus::NoReference
            } else {
                HashStatus::Skipped
            };
        }
    } else {
        let todo: Vec<&(String, Vec<HashRef>)> =
            jobs.iter().filter(|(_, r)| !r.is_empty()).collect();
        let total: u64 = todo
            .iter()
            .map(|(p, _)| std::fs::metadata(dir.join(p)).map(|m| m.len()).unwrap_or(0))
            .sum();
        let bar = progress.total("sha256", total);
        bar.set_message(format!("{role}"));
        let results = parallel(&todo, opts.workers, |(rel, _)| {
            hash_file(&dir.join(rel), &|n| bar.inc(n))
        });
        bar.finish_and_clear();
        for ((rel, refs), r) in todo.iter().zip(results) {
            let l = s.file(rel);
            match r {
                Err(e) => {
                    l.hash = HashStatus::Mismatch;
                    l.problems.push(format!("cannot read: {e}"));
                }
                Ok((sha256, git)) => {
                    let mut ok = vec![];
                    let mut bad = false;
                    for hr in refs.iter() {
                        let (got, name) = match hr.kind {
                            EtagKind::GitSha1 => (&git, "git sha1"),
                            _ => (&sha256, "sha256"),
                        };
                        if *got == hr.want {
                            ok.push(format!("{name} = {}", hr.from));
                        } else {
                            bad = true;
                            l.problems.push(format!(
                                "{name} is {got} but the {} says {}: the file is corrupt; delete it and re-run `laguna fetch`",
                                hr.from, hr.want
                            ));
                        }
                    }
                    l.hash = if bad {
                        HashStatus::Mismatch
                    } else {
                        HashStatus::Ok(ok.join(", "))
                    };
                }
            }
        }
        for (rel, refs) in &jobs {
            if refs.is_empty() {
                s.file(rel).hash = HashStatus::NoReference;
            }
        }
    }

    // config.json
    let cfg_path = dir.join("config.json");
    let cfg = if !cfg_path.exists() {
        s.problem(
            Some("config.json"),
            "missing; every Laguna checkpoint needs one".into(),
        );
        None
    } else {
        match LagunaConfig::from_file(&cfg_path) {
            Ok(c) => Some(c),
            Err(e) => {
                s.problem(Some("config.json"), e.to_string());
                None
            }
        }
    };
    if role == Role::Draft {
        if let Some(d) = &cfg {
            for p in draft::check_config(d, target) {
                s.problem(Some("config.json"), p);
            }
        }
    }

    // Index and safetensors headers.
    let index_ok = check_headers(dir, &mut s);

    // Inventory, only on a structurally sound checkpoint.
    let open = |dir: &Path| {
        let spin = progress.spinner(&format!("{role}: checking the tensor inventory"));
        let store = WeightStore::open(dir);
        spin.finish_and_clear();
        store
    };
    match (&cfg, index_ok) {
        (Some(c), true) => {
            match open(dir) {
                Err(e) => s.general.push(format!("cannot open the checkpoint: {e}")),
                Ok(store) => {
                    let expected = match role {
                        Role::Model => schema::inventory(c),
                        Role::Draft => draft::inventory(c, target),
                    };
                    let r = inventory::check(&store, &expected);
                    s.tensors_checked = r.checked;
                    for (f, p) in r.problems {
                        s.problem(f.as_deref(), p);
                    }
                    for (f, n) in r.foreign_files {
                        s.file(&f).notes.push(format!("holds none of the model's tensors ({n} other tensors; not a weight shard)"));
                    }
                }
            }
        }
        (None, _) => s
            .general
            .push("tensor inventory not checked: config.json is missing or invalid".into()),
        (_, false) => s
            .general
            .push("tensor inventory not checked: fix the file problems above first".into()),
    }
    s.files.sort_by(|a, b| a.path.cmp(&b.path));
    (s, cfg)
}

/// Index ↔ shards ↔ headers. Returns whether the checkpoint is sound enough to open.
fn check_headers(dir: &Path, s: &mut Section) -> bool {
    let mut sound = true;
    let index_path = dir.join(INDEX_FILE);
    let mut index: Option<BTreeMap<String, String>> = None;
    if index_path.exists() {
        match std::fs::read_to_string(&index_path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(|e| e.to_string()))
        {
            Err(e) => {
                s.problem(
                    Some(INDEX_FILE),
                    format!("not valid JSON ({e}); re-run `laguna fetch`"),
                );
                return false;
            }
            Ok(v) => match v.get("weight_map").and_then(|w| w.as_object()) {
                None => {
                    s.problem(Some(INDEX_FILE), "has no `weight_map` object".into());
                    return false;
                }
                Some(wm) => {
                    index = Some(
                        wm.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                            .collect(),
                    )
                }
            },
        }
    }
    let shards: Vec<String> = match &index {
        Some(ix) => ix
            .values()
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        None => list_files(dir)
            .into_iter()
            .filter(|f| f.ends_with(".safetensors") && !f.contains('/'))
            .collect(),
    };
    if shards.is_empty() {
        s.general.push(format!(
            "no *.safetensors files and no {INDEX_FILE}; run `laguna fetch`"
        ));
        return false;
    }
    let mut headers: BTreeMap<String, header::Header> = BTreeMap::new();
    for sh in &shards {
        let p = dir.join(sh);
        if !p.exists() {
            s.problem(
                Some(sh),
                format!("missing: {INDEX_FILE} lists it; re-run `laguna fetch`"),
            );
            sound = false;
            continue;
        }
        match header::read(&p) {
            Ok(h) => {
                let n = h.tensors.len();
                s.file(sh).notes.push(format!("{n} tensors"));
                headers.insert(sh.clone(), h);
            }
            Err(problems) => {
                sound = false;
                for pr in problems {
                    s.problem(Some(sh), pr);
                }
            }
        }
    }
    if let Some(ix) = &index {
        for (tensor, shard) in ix {
            if let Some(h) = headers.get(shard) {
                if !h.tensors.contains_key(tensor) {
                    s.problem(
                        Some(shard),
                        format!(
                            "{INDEX_FILE} says it holds tensor `{tensor}`, but its header does not"
                        ),
                    );
                    sound = false;
                }
            }
        }
        for (shard, h) in &headers {
            for t in h.tensors.keys() {
                match ix.get(t) {
                    Some(f) if f == shard => {}
                    Some(f) => {
                        s.problem(
                            Some(shard),
                            format!("holds tensor `{t}`, which {INDEX_FILE} places in {f}"),
                        );
                        sound = false;
                    }
                    None => {
                        s.problem(
                            Some(shard),
                            format!("holds tensor `{t}`, which {INDEX_FILE} does not list"),
                        );
                        sound = false;
                    }
                }
            }
        }
        // Safetensors files the index does not mention.
        for f in list_files(dir)
            .into_iter()
            .filter(|f| f.ends_with(".safetensors") && !f.contains('/'))
        {
            if !shards.contains(&f) {
                s.file(&f).notes.push(format!(
                    "not referenced by {INDEX_FILE} (ignored by the loader)"
                ));
            }
        }
    }
    sound
}

/// Verify explicit folders (`--model DIR [--draft DIR]`).
pub fn verify_dirs(model: &Path, draft: Option<&Path>, opts: &VerifyOptions) -> Report {
    let progress = Progress::new(opts.progress);
    let (m, cfg) = verify_dir(Role::Model, model, None, opts, &progress);
    let mut sections = vec![m];
    if let Some(d) = draft {
        let (ds, _) = verify_dir(Role::Draft, d, cfg.as_ref(), opts, &progress);
        sections.push(ds);
    }
    Report { sections }
}

/// Verify the folders a recipe names (cache snapshots at the pinned revisions, or local paths).
pub fn verify_recipe(
    recipe: &Recipe,
    env: &HubEnv,
    opts: &VerifyOptions,
) -> Result<Report, VerifyError> {
    let model = crate::hub::local_dir(env, &recipe.model)?;
    let draft = match &recipe.draft {
        Some(d) => Some(crate::hub::local_dir(env, d)?),
        None => None,
    };
    Ok(verify_dirs(&model, draft.as_deref(), opts))
}
