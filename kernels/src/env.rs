//! Every `LAGUNA_*` environment variable: one table ([`TABLE`]: name, meaning, default) and the
//! typed engine and kernel knobs among them ([`Knobs`], read once a process through [`knobs`]).
//!
//! Who reads what:
//! - [`Scope::Recipe`]: the recipe layer of `laguna-stages` (`stages/src/recipe/overrides.rs`,
//!   flag > environment > recipe file > default), through an injected lookup so its tests give
//!   their own environment. A test there checks that the names it reads are exactly these rows.
//! - [`Scope::Cli`]: a flag's fallback: [`RECIPE`] (`stages/src/recipe/args.rs`) and
//!   [`API_KEY`] (clap, `laguna serve --api-key`).
//! - [`Scope::Path`] and [`Scope::Diagnostic`]: [`Knobs`], here, and nowhere else.
//! - [`Scope::Tooling`]: the test harnesses and scripts, never the product.
//!
//! The test `laguna_names_are_read_only_here` fails when Rust code outside this file and
//! `overrides.rs` names a `LAGUNA_*` variable, or when any code or script names one missing
//! here; `docs_table_is_the_table` keeps docs/design/knobs.md equal to [`markdown`].
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;

/// Who reads a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Overrides one recipe field (stages/src/recipe/overrides.rs).
    Recipe,
    /// The environment fallback of a command-line flag.
    Cli,
    /// Where laguna keeps files.
    Path,
    /// Debugging and measurement: unset in normal use.
    Diagnostic,
    /// Read by the test harnesses and scripts only.
    Tooling,
}

impl Scope {
    fn label(self) -> &'static str {
        match self {
            Scope::Recipe => "recipe",
            Scope::Cli => "flag",
            Scope::Path => "path",
            Scope::Diagnostic => "diagnostic",
            Scope::Tooling => "tooling",
        }
    }
}

/// One environment variable.
#[derive(Debug, Clone, Copy)]
pub struct Var {
    pub name: &'static str,
    pub scope: Scope,
    pub meaning: &'static str,
    pub default: &'static str,
}

pub const RECIPE: &str = "LAGUNA_RECIPE";
pub const API_KEY: &str = "LAGUNA_API_KEY";
pub const KERNEL_CACHE: &str = "LAGUNA_KERNEL_CACHE";
pub const CACHE_DIR: &str = "LAGUNA_CACHE_DIR";
pub const NO_CUBLAS: &str = "LAGUNA_NO_CUBLAS";
pub const STAMP: &str = "LAGUNA_STAMP";
pub const STAMP_OUT: &str = "LAGUNA_STAMP_OUT";
pub const CUDA_SYNC: &str = "LAGUNA_CUDA_SYNC";
pub const DEVICE_PROFILE: &str = "LAGUNA_DEVICE_PROFILE";

const fn var(
    name: &'static str,
    scope: Scope,
    meaning: &'static str,
    default: &'static str,
) -> Var {
    Var {
        name,
        scope,
        meaning,
        default,
    }
}

/// Every `LAGUNA_*` variable laguna, its tests and its scripts read. A recipe variable's default
/// is the recipe file's value, else the one given here (recipes/README.md has the full table).
pub const TABLE: &[Var] = {
    use Scope::*;
    &[
    var("LAGUNA_MODEL", Recipe, "`[model]` repo id `org/name` or local folder (`--model`)", "none: `serve` runs the embedded test model"),
    var("LAGUNA_MODEL_REVISION", Recipe, "`[model] revision`: branch, tag or commit (`--revision`)", "`main`"),
    var("LAGUNA_DRAFT", Recipe, "`[draft]` repo id or folder, `none` disables it (`--draft`)", "none"),
    var("LAGUNA_DRAFT_REVISION", Recipe, "`[draft] revision` (`--draft-revision`)", "`main`"),
    var("LAGUNA_SERVED_MODEL_NAME", Recipe, "`served_model_name`: the name clients put in `model`", "repo name / folder name"),
    var("LAGUNA_DEVICE", Recipe, "`device`: `cpu`, `cuda` or `cuda:N`", "`cuda` (`serve` falls back to CPU without a GPU)"),
    var("LAGUNA_MAX_MODEL_LEN", Recipe, "`max_model_len`: longest prompt + completion, tokens", "the model's `max_position_embeddings`"),
    var("LAGUNA_GPU_MEMORY_UTILIZATION", Recipe, "`gpu_memory_utilization`: share of device memory laguna may use", "`0.9`"),
    var("LAGUNA_KV_CACHE_MEMORY_BYTES", Recipe, "`kv_cache_memory_bytes`: the whole KV budget (bytes or `12GiB`)", "what the cap leaves"),
    var("LAGUNA_KV_CACHE_DTYPE", Recipe, "`kv_cache_dtype`: `auto`, `bf16` or `fp8`", "`auto` (bf16)"),
    var("LAGUNA_MAX_NUM_SEQS", Recipe, "`max_num_seqs`: sequences in flight", "`8`"),
    var("LAGUNA_MAX_NUM_BATCHED_TOKENS", Recipe, "`max_num_batched_tokens`: tokens per engine step", "`8192`"),
    var("LAGUNA_SPECULATIVE_METHOD", Recipe, "`[speculative] method`", "`dflash` (the only one)"),
    var("LAGUNA_NUM_SPECULATIVE_TOKENS", Recipe, "`[speculative] num_speculative_tokens`: k >= 1, or `auto` (adaptive k)", "`6`"),
    var("LAGUNA_MEMORY_CAP_BYTES", Recipe, "`memory_cap_bytes`: hard memory ceiling (bytes or `60GiB`)", "none"),
    var("LAGUNA_HOST", Recipe, "`host`: listen address of `serve`", "`127.0.0.1`"),
    var("LAGUNA_PORT", Recipe, "`port`: listen port of `serve`", "`8000`"),
    var(RECIPE, Cli, "the recipe file (`--recipe`)", "none"),
    var(API_KEY, Cli, "`serve` requires `Authorization: Bearer KEY` on /v1 routes (`--api-key`)", "none: no auth"),
    var(KERNEL_CACHE, Path, "folder of the compiled kernel cubins", "`$XDG_CACHE_HOME/laguna/kernels`, else `~/.cache/laguna/kernels`"),
    var(CACHE_DIR, Path, "folder the embedded test model is unpacked into", "`$XDG_CACHE_HOME/laguna`, else `~/.cache/laguna`"),
    var(NO_CUBLAS, Diagnostic, "set: prefill's dense GEMMs run laguna's `gemm_bf16`, not cuBLAS (the fallback when libcublas is missing)", "unset: cuBLAS when it loads"),
    var(STAMP, Diagnostic, "set, not `0`: kernels built with timeline stamps (own cubins); `laguna bench` prints the decode step's timeline", "unset"),
    var(STAMP_OUT, Diagnostic, "file: with `LAGUNA_STAMP`, `laguna bench` also writes every timeline record there as CSV", "unset"),
    var(DEVICE_PROFILE, Diagnostic, "`gb10`: run as a GB10 (48 SMs in a green context, its shared memory limits) on a bigger GPU (`--device-profile`)", "unset: the real device"),
    var(CUDA_SYNC, Diagnostic, "set: synchronize after every kernel launch, so an error names its kernel (slow)", "unset"),
    var("LAGUNA_BIN", Tooling, "the `laguna` binary tests/serve and scripts/device-check.sh run (the script takes `laguna-dev` from its folder)", "`target/debug/laguna` (tests), `dist/laguna` (scripts)"),
    var("LAGUNA_SKIP_BUILD", Tooling, "`1`: tests/serve does not run `cargo build` first", "unset"),
    var("LAGUNA_VENV", Tooling, "scripts/venv.sh: the tests' Python virtual environment", "`.venv` in the repository"),
    var("LAGUNA_VENV_NO_ENSUREPIP", Tooling, "set: scripts/venv.sh bootstraps pip from its wheel", "unset"),
    var("LAGUNA_DFLASH_DRAFTS", Tooling, "engine tests: folder of the DFlash draft fixtures", "tests/fixtures/drafts"),
    var("LAGUNA_TEST_CHILD_ENDPOINT", Tooling, "stages `fetch_resume` test: set for its own child process only", "unset"),
    var("LAGUNA_TEST_CHILD_CACHE", Tooling, "stages `fetch_resume` test: set for its own child process only", "unset"),
    ]
};

/// The engine's and kernels' variables, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Knobs {
    /// [`NO_CUBLAS`] set (to anything).
    pub no_cublas: bool,
    /// [`STAMP`] set to anything but `0` or nothing.
    pub stamp: bool,
    /// [`STAMP_OUT`]: where `laguna bench` writes the timeline records.
    pub stamp_out: Option<PathBuf>,
    /// [`CUDA_SYNC`] set (to anything).
    pub cuda_sync: bool,
    /// [`DEVICE_PROFILE`], as given (engine/src/cuda/profile.rs parses the name).
    pub device_profile: String,
    /// [`KERNEL_CACHE`], when not empty.
    pub kernel_cache: Option<PathBuf>,
    /// [`CACHE_DIR`], when not empty.
    pub cache_dir: Option<PathBuf>,
}

impl Knobs {
    /// Parse through `env` (the process environment in [`knobs`]).
    pub fn from_env(env: &dyn Fn(&str) -> Option<OsString>) -> Knobs {
        let path = |k| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        Knobs {
            no_cublas: env(NO_CUBLAS).is_some(),
            stamp: env(STAMP).is_some_and(|v| v != "0" && !v.is_empty()),
            stamp_out: env(STAMP_OUT).map(PathBuf::from),
            cuda_sync: env(CUDA_SYNC).is_some(),
            device_profile: env(DEVICE_PROFILE)
                .map(|v| v.to_string_lossy().into_owned())
                .unwrap_or_default(),
            kernel_cache: path(KERNEL_CACHE),
            cache_dir: path(CACHE_DIR),
        }
    }
}

/// The process's knobs, read on first use.
pub fn knobs() -> &'static Knobs {
    static K: OnceLock<Knobs> = OnceLock::new();
    K.get_or_init(|| Knobs::from_env(&|k| std::env::var_os(k)))
}

/// [`TABLE`] as the Markdown table of docs/design/knobs.md.
pub fn markdown() -> String {
    let mut s = String::from("| variable | read by | meaning | default |\n|---|---|---|---|\n");
    for v in TABLE {
        s += &format!(
            "| `{}` | {} | {} | {} |\n",
            v.name,
            v.scope.label(),
            v.meaning,
            v.default
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::Path;

    fn parse(vars: &[(&str, &str)]) -> Knobs {
        let m: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Knobs::from_env(&|k| m.get(k).cloned())
    }

    #[test]
    fn knobs_parse() {
        assert_eq!(parse(&[]), Knobs::default());
        let k = parse(&[
            (NO_CUBLAS, ""),
            (STAMP, "1"),
            (STAMP_OUT, "/tmp/t.csv"),
            (CUDA_SYNC, "0"),
            (KERNEL_CACHE, "/k"),
            (CACHE_DIR, ""),
        ]);
        assert!(k.no_cublas && k.stamp && k.cuda_sync);
        assert_eq!(k.stamp_out, Some(PathBuf::from("/tmp/t.csv")));
        assert_eq!(k.kernel_cache, Some(PathBuf::from("/k")));
        assert_eq!(k.cache_dir, None, "an empty path is unset");
        assert!(!parse(&[(STAMP, "0")]).stamp && !parse(&[(STAMP, "")]).stamp);
    }

    #[test]
    fn table_names_are_unique_and_prefixed() {
        let mut seen = std::collections::HashSet::new();
        for v in TABLE {
            assert!(v.name.starts_with("LAGUNA_"), "{}", v.name);
            assert!(seen.insert(v.name), "{} twice", v.name);
            assert!(
                !v.meaning.contains('|') && !v.default.contains('|'),
                "{}",
                v.name
            );
        }
    }

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// Every file under `dir` whose name ends with one of `exts`, recursively.
    fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                files(&p, exts, out);
            } else if exts.iter().any(|x| p.to_string_lossy().ends_with(x)) {
                out.push(p);
            }
        }
    }

    /// `LAGUNA_[A-Z0-9_]+` names in `text`; with `quoted`, only whole string literals
    /// (the name between two double quotes), which is how Rust code names a variable it reads or
    /// sets.
    fn names(text: &str, quoted: bool) -> Vec<String> {
        let mut v = vec![];
        let b = text.as_bytes();
        let mut i = 0;
        while let Some(off) = text[i..].find("LAGUNA_") {
            let s = i + off;
            let mut e = s + "LAGUNA_".len();
            while e < b.len()
                && (b[e].is_ascii_uppercase() || b[e].is_ascii_digit() || b[e] == b'_')
            {
                e += 1;
            }
            let word_start = s == 0 || !(b[s - 1].is_ascii_alphanumeric() || b[s - 1] == b'_');
            let lit = s > 0 && b[s - 1] == b'"' && e < b.len() && b[e] == b'"';
            if e > s + "LAGUNA_".len() && word_start && (!quoted || lit) {
                v.push(text[s..e].to_string());
            }
            i = e;
        }
        v
    }

    /// Product code names a `LAGUNA_*` variable only in this file and in the recipe layer; every
    /// name in Rust code (tests included), scripts and the serve tests is in [`TABLE`].
    #[test]
    fn laguna_names_are_read_only_here() {
        let root = root();
        let known: Vec<&str> = TABLE.iter().map(|v| v.name).collect();
        let readers = ["kernels/src/env.rs", "stages/src/recipe/overrides.rs"];
        let mut bad = vec![];
        let mut rs = vec![];
        for c in ["kernels", "engine", "stages", "cli", "dev"] {
            files(&root.join(c).join("src"), &[".rs"], &mut rs);
            files(&root.join(c).join("tests"), &[".rs"], &mut rs);
            files(&root.join(c).join("benches"), &[".rs"], &mut rs);
        }
        assert!(
            rs.len() > 20,
            "found {} Rust files under {}",
            rs.len(),
            root.display()
        );
        for p in &rs {
            let rel = p
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(p).unwrap();
            let product = rel.contains("/src/");
            for n in names(&text, true) {
                if !known.contains(&n.as_str()) {
                    bad.push(format!("{rel}: {n} is not in kernels/src/env.rs TABLE"));
                } else if product && !readers.contains(&rel.as_str()) {
                    bad.push(format!("{rel}: reads {n}; go through laguna_kernels::env"));
                }
            }
        }
        let mut other = vec![];
        files(&root.join("scripts"), &[".sh"], &mut other);
        files(&root.join("tests/serve"), &[".py", ".md"], &mut other);
        for p in &other {
            let rel = p
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            for n in names(&std::fs::read_to_string(p).unwrap(), false) {
                if !known.contains(&n.as_str()) {
                    bad.push(format!("{rel}: {n} is not in kernels/src/env.rs TABLE"));
                }
            }
        }
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn names_finds_literals_and_words() {
        // (spelled through `n` so this file names no variable outside TABLE)
        let n = |x: &str| format!("LAGUNA_{x}");
        let t = format!(
            r#"a "{}" b {} "{} is set" MY_{} {}*"#,
            n("X"),
            n("Y"),
            n("Z"),
            n("W"),
            n("")
        );
        assert_eq!(names(&t, true), [n("X")]);
        assert_eq!(names(&t, false), [n("X"), n("Y"), n("Z")]);
    }

    /// docs/design/knobs.md holds [`markdown`] between its two marker lines.
    #[test]
    fn docs_table_is_the_table() {
        let p = root().join("docs/design/knobs.md");
        let doc = std::fs::read_to_string(&p).unwrap();
        let (begin, end) = ("<!-- TABLE BEGIN", "<!-- TABLE END");
        let a = doc.find(begin).expect("begin marker");
        let a = a + doc[a..].find('\n').unwrap() + 1;
        let b = doc.find(end).expect("end marker");
        assert_eq!(
            &doc[a..b],
            markdown(),
            "docs/design/knobs.md's table differs from kernels/src/env.rs TABLE: paste `markdown()`"
        );
    }
}
