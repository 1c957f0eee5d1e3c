//! `laguna verify` on damaged copies of the committed fixtures: a flipped byte in each shard, a
//! truncated shard, a missing shard, a renamed tensor, a missing NVFP4 triplet member, a leftover
//! `.incomplete`, a draft whose taps do not exist in the target.
mod common;

use common::{copy_dir, fixture, git_sha1_hex, sha256_hex};
use laguna_stages::hub::{Manifest, ManifestFile, RepoCache};
use laguna_stages::verify::{verify_dirs, HashStatus, Report, VerifyOptions};
use std::path::{Path, PathBuf};

fn opts() -> VerifyOptions {
    VerifyOptions {
        fast: false,
        progress: false,
        workers: 2,
    }
}

fn check(model: &Path, draft: Option<&Path>) -> Report {
    let r = verify_dirs(model, draft, &opts());
    println!("{r}");
    r
}

fn sharded_copy() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("m");
    copy_dir(&fixture("models/tied-sharded-gatingtrue"), &d);
    (t, d)
}

/// A Hugging Face cache holding `src` as `org/tiny` at a made-up commit: safetensors as LFS
/// blobs (named by SHA-256), the rest as git blobs (named by git SHA-1), relative links, a ref and
/// a laguna manifest. Returns the snapshot folder.
fn cache_copy(src: &Path, cache: &Path, with_manifest: bool) -> PathBuf {
    let rc = RepoCache::new(cache, "org/tiny");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    std::fs::create_dir_all(rc.blobs_dir()).unwrap();
    let mut files = vec![];
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let bytes = std::fs::read(e.path()).unwrap();
        let etag = if name.ends_with(".safetensors") {
            sha256_hex(&bytes)
        } else {
            git_sha1_hex(&bytes)
        };
        std::fs::write(rc.blob(&etag), &bytes).unwrap();
        rc.link(commit, &name, &etag).unwrap();
        files.push(ManifestFile {
            path: name,
            size: bytes.len() as u64,
            etag,
            sha256: sha256_hex(&bytes),
        });
    }
    rc.write_ref("main", commit).unwrap();
    if with_manifest {
        let m = Manifest {
            repo: "org/tiny".into(),
            revision: "main".into(),
            commit: commit.into(),
            endpoint: "test".into(),
            files,
        };
        m.save(&Manifest::cache_path(&rc.root, commit)).unwrap();
    }
    rc.snapshot_dir(commit)
}

fn flip_byte(path: &Path, at: usize) {
    let real = std::fs::canonicalize(path).unwrap();
    let mut b = std::fs::read(&real).unwrap();
    b[at] ^= 0x01;
    std::fs::write(&real, b).unwrap();
}

const SHARDS: [&str; 2] = [
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
];

#[test]
fn committed_fixtures_verify_clean() {
    for m in [
        "models/tiny-chat",
        "models/nvfp4-experts",
        "models/tied-sharded-gatingtrue",
        "models/swa-yarn-perhead",
    ] {
        let r = check(&fixture(m), None);
        assert!(r.ok(), "{m}: {:?}", r.problems());
    }
    let r = check(
        &fixture("models/tied-sharded-gatingtrue"),
        Some(&fixture("drafts/tied-sharded-gatingtrue-causal-w5")),
    );
    assert!(r.ok(), "{:?}", r.problems());
}

#[test]
fn cache_snapshot_hashes_match_blob_names_and_manifest() {
    let t = tempfile::tempdir().unwrap();
    let snap = cache_copy(&fixture("models/tied-sharded-gatingtrue"), t.path(), true);
    let r = check(&snap, None);
    assert!(r.ok(), "{:?}", r.problems());
    let files = &r.sections[0].files;
    let shard = files.iter().find(|f| f.path == SHARDS[0]).unwrap();
    assert_eq!(
        shard.hash,
        HashStatus::Ok("sha256 = manifest, sha256 = blob name".into())
    );
    let cfg = files.iter().find(|f| f.path == "config.json").unwrap();
    assert_eq!(
        cfg.hash,
        HashStatus::Ok("sha256 = manifest, git sha1 = blob name".into())
    );
}

#[test]
fn a_flipped_byte_in_any_shard_is_caught_and_named() {
    for with_manifest in [true, false] {
        for shard in SHARDS {
            let t = tempfile::tempdir().unwrap();
            let snap = cache_copy(
                &fixture("models/tied-sharded-gatingtrue"),
                t.path(),
                with_manifest,
            );
            let len = std::fs::metadata(snap.join(shard)).unwrap().len() as usize;
            flip_byte(&snap.join(shard), len - 3); // inside tensor data, header still valid
            let r = check(&snap, None);
            assert!(!r.ok());
            assert_eq!(
                r.bad_files(),
                vec![format!("model/{shard}")],
                "manifest={with_manifest}"
            );
            assert!(
                r.problems()[0].contains("sha256") && r.problems()[0].contains("corrupt"),
                "{:?}",
                r.problems()
            );
            // --fast does not hash, so it cannot see it.
            let fast = verify_dirs(
                &snap,
                None,
                &VerifyOptions {
                    fast: true,
                    ..opts()
                },
            );
            assert!(fast.ok(), "{:?}", fast.problems());
        }
    }
}

#[test]
fn a_truncated_shard_is_named() {
    let (_t, d) = sharded_copy();
    let p = d.join(SHARDS[1]);
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 1000)
        .unwrap();
    let r = check(&d, None);
    assert_eq!(r.bad_files(), vec![format!("model/{}", SHARDS[1])]);
    assert!(
        r.problems().iter().any(|p| p.contains("truncated")),
        "{:?}",
        r.problems()
    );
}

#[test]
fn a_truncated_blob_is_named_by_size_against_the_manifest() {
    let t = tempfile::tempdir().unwrap();
    let snap = cache_copy(&fixture("models/tied-sharded-gatingtrue"), t.path(), true);
    let real = std::fs::canonicalize(snap.join(SHARDS[0])).unwrap();
    let len = std::fs::metadata(&real).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&real)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let r = verify_dirs(
        &snap,
        None,
        &VerifyOptions {
            fast: true,
            ..opts()
        },
    );
    assert_eq!(r.bad_files(), vec![format!("model/{}", SHARDS[0])]);
    assert!(
        r.problems()
            .iter()
            .any(|p| p.contains("truncated") && p.contains("the Hub says")),
        "{:?}",
        r.problems()
    );
}

#[test]
fn a_missing_shard_is_named() {
    let (_t, d) = sharded_copy();
    std::fs::remove_file(d.join(SHARDS[0])).unwrap();
    let r = check(&d, None);
    assert!(!r.ok());
    assert_eq!(r.bad_files(), vec![format!("model/{}", SHARDS[0])]);
    assert!(
        r.problems()[0].contains("missing") && r.problems()[0].contains("index"),
        "{:?}",
        r.problems()
    );
}

/// Rewrite a safetensors file through `edit` on its (name, dtype, shape, bytes) list.
fn rewrite(
    path: &Path,
    edit: impl Fn(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>),
) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    edit(&mut v);
    let views: Vec<(String, safetensors::tensor::TensorView)> = v
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let out = safetensors::tensor::serialize(views, None).unwrap();
    std::fs::write(path, out).unwrap();
}

fn edit_index(dir: &Path, edit: impl Fn(&mut serde_json::Map<String, serde_json::Value>)) {
    let p = dir.join("model.safetensors.index.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(v["weight_map"].as_object_mut().unwrap());
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn a_renamed_tensor_is_named() {
    let (_t, d) = sharded_copy();
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(d.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let old = "model.layers.1.self_attn.k_norm.weight";
    let new = "model.layers.1.self_attn.key_norm.weight";
    let shard = index["weight_map"][old].as_str().unwrap().to_string();
    rewrite(&d.join(&shard), |v| {
        for t in v.iter_mut() {
            if t.0 == old {
                t.0 = new.into();
            }
        }
    });
    edit_index(&d, |wm| {
        let f = wm.remove(old).unwrap();
        wm.insert(new.into(), f);
    });
    let r = check(&d, None);
    assert!(!r.ok());
    let all = r.problems().join("\n");
    assert!(all.contains(old) && all.contains("missing"), "{all}");
    assert!(all.contains(new) && all.contains("unexpected"), "{all}");
    assert!(
        r.bad_files().contains(&format!("model/{shard}")),
        "{:?}",
        r.bad_files()
    );
}

#[test]
fn a_missing_nvfp4_triplet_member_is_named() {
    for part in ["weight_scale", "weight_global_scale", "weight_packed"] {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("m");
        copy_dir(&fixture("models/nvfp4-experts"), &d);
        let name = format!("model.layers.2.mlp.experts.3.up_proj.{part}");
        rewrite(&d.join("model.safetensors"), |v| v.retain(|t| t.0 != name));
        let r = check(&d, None);
        assert!(!r.ok(), "{part}");
        let all = r.problems().join("\n");
        assert!(
            all.contains("model.layers.2.mlp.experts.3.up_proj"),
            "{part}: {all}"
        );
        if part != "weight_packed" {
            assert!(all.contains(&name), "{part}: {all}");
        }
        assert_eq!(
            r.bad_files(),
            vec!["model/model.safetensors".to_string()],
            "{part}"
        );
    }
}

#[test]
fn leftover_incomplete_blob_fails() {
    let t = tempfile::tempdir().unwrap();
    let snap = cache_copy(&fixture("models/tied-sharded-gatingtrue"), t.path(), true);
    let rc = RepoCache::new(t.path(), "org/tiny");
    std::fs::write(rc.incomplete(&"a".repeat(64)), b"partial").unwrap();
    let r = check(&snap, None);
    assert!(!r.ok());
    assert!(
        r.problems().iter().any(|p| p.contains(".incomplete")),
        "{:?}",
        r.problems()
    );
}

#[test]
fn draft_taps_and_vocab_are_checked_against_the_target() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("draft");
    copy_dir(&fixture("drafts/tied-sharded-gatingtrue-causal-w5"), &d);
    let cfg_path = d.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    let target_layers = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(fixture("models/tied-sharded-gatingtrue").join("config.json"))
            .unwrap(),
    )
    .unwrap()["num_hidden_layers"]
        .as_u64()
        .unwrap();
    let mut ids = cfg["dflash_config"]["target_layer_ids"]
        .as_array()
        .unwrap()
        .clone();
    let n = ids.len();
    ids[n - 1] = serde_json::json!(target_layers);
    cfg["dflash_config"]["target_layer_ids"] = serde_json::Value::Array(ids);
    cfg["draft_vocab_size"] = serde_json::json!(7);
    std::fs::write(&cfg_path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    let r = check(&fixture("models/tied-sharded-gatingtrue"), Some(&d));
    assert!(!r.ok());
    assert_eq!(r.bad_files(), vec!["draft/config.json".to_string()]);
    let all = r.problems().join("\n");
    assert!(
        all.contains("target_layer_ids") && all.contains(&format!("layer {target_layers}")),
        "{all}"
    );
    assert!(all.contains("draft_vocab_size"), "{all}");
}
