//! Checks on the repository itself, run by `cargo test -p laguna-cli --test repo_checks`:
//! docs/ARCHITECTURE.md names only paths and modules that exist and stays a map (at most ~250
//! lines), no function in `engine/src`, `cli/src` or `dev/src` is longer than [`MAX_FN_LINES`]
//! lines, and no backend type is named above the engine outside the listed tools.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn architecture() -> String {
    std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md")
}

/// The `backticked` spans of one line.
fn backticked(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// Every file and directory under the repository (without `target/` and hidden entries), as
/// paths relative to the root with `/` separators; directories end in `/`.
fn repo_entries() -> Vec<String> {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || (rel.is_empty() && name == "target") {
                continue;
            }
            let path = format!("{rel}{name}");
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                out.push(format!("{path}/"));
                walk(&e.path(), &format!("{path}/"), out);
            } else {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), "", &mut out);
    out
}

/// `pattern` against `s`, where `*` matches any run of characters within one path component.
fn glob(pattern: &str, s: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == s,
        Some((head, tail)) => {
            let Some(rest) = s.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|&i| rest.is_char_boundary(i) && !rest[..i].contains('/'))
                .any(|i| glob(tail, &rest[i..]))
        }
    }
}

/// A backticked span that names a file or directory of the repository: it contains a `/` or ends
/// in a source or document extension, and is not a URL route (`/v1/...`), an environment path
/// (`$XDG_...`), an elision (`.../x`) or a template (`<name>.rs`). A `::item` suffix is dropped.
fn path_like(span: &str) -> Option<&str> {
    let span = span.split("::").next().unwrap_or(span);
    let exts = [
        ".rs", ".cu", ".cuh", ".md", ".py", ".sh", ".toml", ".cpp", ".h", ".jinja",
    ];
    let pathy = span.contains('/') || exts.iter().any(|e| span.ends_with(e));
    let bad = span.starts_with('/')
        || span.contains(['$', '<', ' ', '(', '='])
        || span.starts_with("...")
        || span.starts_with("http");
    (pathy && !bad).then_some(span)
}

#[test]
fn architecture_paths_exist() {
    let entries = repo_entries();
    let mut missing = BTreeSet::new();
    for (n, line) in architecture().lines().enumerate() {
        // A code span must not break across lines (the spans are read line by line).
        let ticks = line.matches('`').count();
        assert!(
            line.starts_with("```") || ticks % 2 == 0,
            "docs/ARCHITECTURE.md line {}: a code span breaks across lines",
            n + 1
        );
        for span in backticked(line) {
            let Some(p) = path_like(span) else { continue };
            // A path from the root must exist as written; a shorter one (`sched/engine.rs`,
            // `launch/`, `bench_*.rs`) must be the tail of some path.
            let found = entries.iter().any(|e| {
                let e = if p.ends_with('/') {
                    e.as_str()
                } else {
                    e.trim_end_matches('/')
                };
                glob(p, e) || tail_glob(p, e)
            });
            if !found {
                missing.insert(p.to_string());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

/// `p` matches the last components of `e` (`sched/engine.rs` in `engine/src/sched/engine.rs`).
fn tail_glob(p: &str, e: &str) -> bool {
    let depth = p.trim_end_matches('/').matches('/').count() + 1;
    let comps: Vec<&str> = e.trim_end_matches('/').split('/').collect();
    if comps.len() < depth {
        return false;
    }
    let mut tail = comps[comps.len() - depth..].join("/");
    if e.ends_with('/') {
        tail.push('/');
    }
    glob(p, &tail)
}

/// The module directories the map's `### dir` sections describe, one bullet per module: each
/// module there must exist, and each module that exists must have its bullet.
const MAPPED_DIRS: [&str; 3] = ["engine/src", "engine/src/cuda", "stages/src"];

/// The modules a section names: the backticked spans before the first `:` of each `- ` bullet.
fn section_modules(doc: &str, heading: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut inside = false;
    for line in doc.lines() {
        if line.starts_with('#') {
            inside = line.trim_start_matches('#').trim() == heading;
            continue;
        }
        if inside && line.starts_with("- ") {
            let head = line.split(": ").next().unwrap_or("");
            for span in backticked(head) {
                let name = span.trim_end_matches('/').trim_end_matches(".rs");
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// `name` for `dir/name.rs` and `dir/name/`, without `lib.rs`, `main.rs` and tests-only files.
fn modules_in(dir: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let module = if e.file_type().unwrap().is_dir() {
            name
        } else if let Some(stem) = name.strip_suffix(".rs") {
            stem.to_string()
        } else {
            continue;
        };
        if !["lib", "main", "tests"].contains(&module.as_str()) && !module.ends_with("_tests") {
            names.insert(module);
        }
    }
    names
}

#[test]
fn architecture_maps_every_module() {
    let doc = architecture();
    let mut problems = Vec::new();
    for dir in MAPPED_DIRS {
        let named = section_modules(&doc, dir);
        assert!(
            !named.is_empty(),
            "docs/ARCHITECTURE.md has no `### {dir}` section with module bullets"
        );
        let present = modules_in(&root().join(dir));
        for m in named.difference(&present) {
            problems.push(format!(
                "`### {dir}` names `{m}`, which is not a module there"
            ));
        }
        for m in present.difference(&named) {
            problems.push(format!("{dir}/{m} has no bullet under `### {dir}`"));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/ARCHITECTURE.md is out of date:\n{}",
        problems.join("\n")
    );
}

#[test]
fn architecture_is_a_map() {
    let lines = architecture().lines().count();
    assert!(
        lines <= 250,
        "docs/ARCHITECTURE.md has {lines} lines; move detail into docs/design/*.md"
    );
}

/// The longest function body (signature to closing brace) allowed in `engine/src`, `cli/src` and
/// `dev/src`.
const MAX_FN_LINES: usize = 200;

/// `(path::name, lines)` of every `fn` in the `.rs` files under `dir` longer than `max` lines.
fn long_functions(dir: &str, max: usize) -> Vec<(String, usize)> {
    let mut files = Vec::new();
    fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                collect(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    collect(&root().join(dir), &mut files);
    files.sort();
    let mut long = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let rel = file
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        for (name, n) in long_in(&text, max) {
            long.push((format!("{rel}::{name}"), n));
        }
    }
    long
}

/// `(name, lines)` of every `fn` in `text` longer than `max` lines, signature to closing brace.
/// Relies on rustfmt's layout: a body ends at the first later line that is a `}` at the
/// indentation of its `fn` line; a body opened and closed on one line is one line.
fn long_in(text: &str, max: usize) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut long = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        let indent = line.len() - line.trim_start().len();
        // The signature ends at the first line ending in `{` (a body), `;` (a declaration) or
        // `}` with its braces balanced (a one-line body).
        let Some(open) = (i..lines.len()).find(|&j| {
            let t = lines[j].trim_end();
            t.ends_with('{') || t.ends_with(';') || (t.ends_with('}') && balanced(t))
        }) else {
            continue;
        };
        if !lines[open].trim_end().ends_with('{') {
            continue;
        }
        let close = (open + 1..lines.len()).find(|&j| {
            let l = lines[j];
            l.len() - l.trim_start().len() == indent && l.trim_start().starts_with('}')
        });
        let n = close.map_or(lines.len(), |c| c + 1) - i;
        if n > max {
            long.push((name.to_string(), n));
        }
    }
    long
}

/// A line that opens and closes as many braces as it opens, at least one.
fn balanced(line: &str) -> bool {
    let opens = line.matches('{').count();
    opens > 0 && opens == line.matches('}').count()
}

/// The name of the function a line declares (`pub(crate) async fn name<...>(`), if it does.
fn fn_name(line: &str) -> Option<&str> {
    let t = line.trim_start();
    if t.starts_with("//") {
        return None;
    }
    let mut rest = t;
    loop {
        let word_end = rest.find([' ', '(']).unwrap_or(rest.len());
        let word = &rest[..word_end];
        if word == "fn" {
            let name = rest[2..].trim_start();
            let end = name
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(name.len());
            return (end > 0).then(|| &name[..end]);
        }
        let qualifier = [
            "pub", "const", "async", "unsafe", "extern", "\"C\"", "default",
        ]
        .contains(&word)
            || word.starts_with("pub(");
        if !qualifier {
            return None;
        }
        // `pub(crate)` and friends: skip the parenthesised part with the word.
        let skip = if word == "pub" && rest[word_end..].starts_with('(') {
            rest.find(')').map_or(rest.len(), |p| p + 1)
        } else {
            word_end
        };
        rest = rest[skip..].trim_start();
    }
}

#[test]
fn no_long_functions() {
    let mut long = long_functions("engine/src", MAX_FN_LINES);
    long.extend(long_functions("cli/src", MAX_FN_LINES));
    long.extend(long_functions("dev/src", MAX_FN_LINES));
    let over: Vec<String> = long
        .iter()
        .map(|(n, l)| format!("{n}: {l} lines"))
        .collect();
    assert!(
        over.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them by concern):\n{}",
        over.join("\n")
    );
}

#[test]
fn long_function_scanner_finds_what_it_should() {
    assert_eq!(
        fn_name("    pub(crate) async fn run_layers<'a>("),
        Some("run_layers")
    );
    assert_eq!(fn_name("pub unsafe extern \"C\" fn f() {"), Some("f"));
    assert_eq!(fn_name("    let fnord = 1;"), None);
    assert_eq!(fn_name("// fn commented()"), None);
    assert!(glob("bench_*.rs", "bench_gb10.rs") && !glob("bench_*.rs", "x/bench_gb10.rs"));
    assert!(tail_glob("sched/engine.rs", "engine/src/sched/engine.rs"));
    assert!(
        tail_glob("launch/", "engine/src/cuda/launch/")
            && !tail_glob("launch/", "engine/src/cuda/launch.rs")
    );
}

/// The engine's backend types: above the engine, code loads through `engine::backend` and uses the
/// model traits.
const BACKEND_TYPES: [&str; 5] = ["CpuModel", "CudaModel", "CpuDraft", "CudaDraft", "FusedStep"];

/// The files above the engine that still name a backend type: the tools that check or measure the
/// CUDA backend itself (its own methods: the device sampler, the fused DFlash step, graph replay).
/// This list only shrinks.
const NAMES_BACKEND_TYPES: [&str; 8] = [
    "cli/src/cmd/bench.rs",
    "cli/src/cmd/bench_draft.rs",
    "cli/src/cmd/bench_gb10.rs",
    "cli/src/cmd/bench_oracle.rs",
    "dev/src/cmd/device_dflash.rs",
    "dev/src/cmd/device_sample.rs",
    "dev/src/cmd/device_test.rs",
    "dev/src/cmd/sweep/backend.rs",
];

/// `path` of every `.rs` file under `dir` (relative to the root) whose code (comments aside)
/// names one of `words` as a whole word.
fn files_naming(dir: &str, words: &[&str]) -> Vec<String> {
    fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                collect(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    collect(&root().join(dir), &mut files);
    files.sort();
    let word = |line: &str, w: &str| {
        line.match_indices(w).any(|(i, _)| {
            let ident = |c: char| c.is_alphanumeric() || c == '_';
            !line[..i].ends_with(ident) && !line[i + w.len()..].starts_with(ident)
        })
    };
    files
        .into_iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .any(|code| words.iter().any(|w| word(code, w)))
        })
        .map(|f| {
            f.strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/")
        })
        .collect()
}

#[test]
fn backend_types_stay_in_the_engine() {
    let mut named = Vec::new();
    for dir in ["stages/src", "cli/src", "dev/src"] {
        named.extend(files_naming(dir, &BACKEND_TYPES));
    }
    let new: Vec<&String> = named
        .iter()
        .filter(|f| !NAMES_BACKEND_TYPES.contains(&f.as_str()))
        .collect();
    assert!(
        new.is_empty(),
        "these files name an engine backend type ({BACKEND_TYPES:?}); load through \
         laguna_engine::backend and use the model traits: {new:?}"
    );
    let gone: Vec<&&str> = NAMES_BACKEND_TYPES
        .iter()
        .filter(|f| !named.iter().any(|n| n == *f))
        .collect();
    assert!(
        gone.is_empty(),
        "no longer name a backend type: take them off NAMES_BACKEND_TYPES: {gone:?}"
    );
    // The scanner sees what it should: the engine's backend choice names the CUDA model.
    let engine = files_naming("engine/src", &["CudaModel"]);
    assert!(
        engine.iter().any(|f| f == "engine/src/backend.rs"),
        "{engine:?}"
    );
}

/// A module folder whose sibling modules must not use each other in a circle (A names B while B,
/// directly or through others, names A): `engine/src/cuda`.
const ACYCLIC_DIRS: [&str; 1] = ["engine/src/cuda"];

/// The `a::b::c` paths of a source (comments and `#[cfg(test)]` modules left out), with each name
/// of a `::{x, y}` group as a path of its own (`super::{x, y}`: `super::x` and `super::y`).
fn rust_paths(src: &str) -> Vec<Vec<String>> {
    let code: String = src
        .split("#[cfg(test)]")
        .next()
        .unwrap_or("")
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !ident(b[i]) || (i > 0 && (ident(b[i - 1]) || b[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let mut path = Vec::new();
        loop {
            let s = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            path.push(code[s..i].to_string());
            if !code[i..].starts_with("::") {
                break;
            }
            i += 2;
            if code[i..].starts_with('{') {
                // The group's items at its top level (`a`, `b::{C, D}`, `c as d`): their first name.
                let (mut depth, mut start) = (0, i + 1);
                let mut end = b.len();
                for (j, c) in code[i..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' | ',' if depth == 1 => {
                            let item = code[start..i + j].trim();
                            let name = item.split([':', ' ']).next().unwrap_or("");
                            if !name.is_empty() && name.bytes().all(ident) {
                                let mut p = path.clone();
                                p.push(name.to_string());
                                out.push(p);
                            }
                            start = i + j + 1;
                            if c == '}' {
                                end = i + j;
                                break;
                            }
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                i = end;
                break;
            }
            if i >= b.len() || !ident(b[i]) {
                break;
            }
        }
        out.push(path);
    }
    out
}

/// The siblings a module of `dir` names, from its files `(depth, source)` (depth: folders below
/// the module's own, 0 for `m.rs` and `m/mod.rs`): `crate::<dir module>::X`, `super::X` at the
/// module's level, and, in a depth-0 file (where `use super::*` brings the siblings in), a path
/// that starts with `X::` unless the file declares its own `mod X`.
fn sibling_uses(
    crate_path: &[&str],
    me: &str,
    siblings: &BTreeSet<String>,
    files: &[(usize, String)],
) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for (depth, src) in files {
        let own: BTreeSet<&str> = src
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let l = l.strip_prefix("pub ").unwrap_or(l);
                let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
                let l = l.strip_prefix("pub(super) ").unwrap_or(l);
                l.strip_prefix("mod ")
            })
            .map(|r| r.trim_end_matches(|c| c == ';' || c == '{' || c == ' '))
            .collect();
        for p in rust_paths(src) {
            let names: Vec<&str> = p.iter().map(String::as_str).collect();
            let supers = names.iter().take_while(|&&n| n == "super").count();
            let named = if names.len() > crate_path.len() && names.starts_with(crate_path) {
                Some(names[crate_path.len()])
            } else if supers == depth + 1 && names.len() > supers {
                Some(names[supers])
            } else if *depth == 0 && supers == 0 && names.len() >= 2 && !own.contains(names[0]) {
                Some(names[0])
            } else {
                None
            };
            if let Some(x) = named.filter(|&x| x != me && siblings.contains(x)) {
                used.insert(x.to_string());
            }
        }
    }
    used
}

/// Pairs (a, b) of modules where a reaches b and b reaches a through `uses`.
fn circles(uses: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            for n in uses.get(&m).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let mut out = Vec::new();
    for a in uses.keys() {
        for b in reach(a) {
            if a < &b && reach(&b).contains(a) {
                out.push((a.clone(), b));
            }
        }
    }
    out
}

/// The `.rs` files of a module of `dir` with their depth below it.
fn module_files(dir: &Path, module: &str) -> Vec<(usize, String)> {
    fn walk(d: &Path, depth: usize, out: &mut Vec<(usize, String)>) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, depth + 1, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let d = if p.file_name().is_some_and(|n| n == "mod.rs") {
                    depth.saturating_sub(1)
                } else {
                    depth
                };
                out.push((d, std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    let file = dir.join(format!("{module}.rs"));
    if file.is_file() {
        out.push((0, std::fs::read_to_string(file).unwrap()));
    }
    if dir.join(module).is_dir() {
        walk(&dir.join(module), 1, &mut out);
    }
    out
}

#[test]
fn no_import_circles() {
    for dir in ACYCLIC_DIRS {
        let path = root().join(dir);
        let siblings: BTreeSet<String> = modules_in(&path)
            .into_iter()
            .filter(|m| m != "mod")
            .collect();
        let krate: Vec<&str> = std::iter::once("crate")
            .chain(dir.split('/').skip(2))
            .collect();
        let uses = siblings
            .iter()
            .map(|m| {
                let files = module_files(&path, m);
                (m.clone(), sibling_uses(&krate, m, &siblings, &files))
            })
            .collect();
        let found = circles(&uses);
        assert!(
            found.is_empty(),
            "import circles between modules of {dir} (move what both need to where it belongs): {found:?}\n{uses:#?}"
        );
    }
}

#[test]
fn import_circle_scanner_finds_what_it_should() {
    let p =
        rust_paths("use super::{a, b::C};\nlet x = ring::f(crate::cuda::kv::g()); // super::z\n");
    assert!(p.contains(&vec!["super".into(), "a".into()]));
    assert!(p.contains(&vec!["ring".into(), "f".into()]));
    assert!(p.contains(&vec![
        "crate".into(),
        "cuda".into(),
        "kv".into(),
        "g".into()
    ]));
    assert!(!p.iter().any(|q| q.contains(&"z".to_string())));
    let sib: BTreeSet<String> = ["a", "b", "ring", "kv", "own"].map(String::from).into();
    let k = ["crate", "cuda"];
    let used = |depth: usize, src: &str| sibling_uses(&k, "me", &sib, &[(depth, src.into())]);
    assert_eq!(
        used(0, "use super::{a, b::{C, D}};"),
        ["a", "b"].map(String::from).into()
    );
    assert_eq!(
        used(0, "pub mod own;\nfn f() { own::x(); ring::y(); }"),
        ["ring"].map(String::from).into()
    );
    assert_eq!(
        used(1, "use super::a; use super::super::kv::X;"),
        ["kv"].map(String::from).into()
    );
    assert_eq!(
        used(1, "crate::cuda::b::f(); ring::g();"),
        ["b"].map(String::from).into()
    );
    let g = |pairs: &[(&str, &str)]| {
        let mut m = std::collections::BTreeMap::<String, BTreeSet<String>>::new();
        for (a, b) in pairs {
            m.entry(a.to_string()).or_default().insert(b.to_string());
        }
        circles(&m)
    };
    assert_eq!(g(&[("a", "b"), ("b", "c")]), vec![]);
    assert_eq!(g(&[("a", "b"), ("b", "c"), ("c", "a")]).len(), 3);
    assert_eq!(
        g(&[("x", "y"), ("y", "x")]),
        vec![("x".to_string(), "y".to_string())]
    );
}
