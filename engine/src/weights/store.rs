//! Memory-mapped safetensors checkpoints: one file, or shards listed by `model.safetensors.index.json`.
use crate::error::{EngineError, Result};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Where one tensor lives.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub file: usize,
    /// Absolute byte range inside the file.
    pub start: usize,
    pub end: usize,
}

/// A borrowed tensor: dtype, shape and its raw little-endian bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

pub struct WeightStore {
    pub dir: PathBuf,
    pub files: Vec<PathBuf>,
    maps: Vec<Mmap>,
    handles: Vec<File>,
    tensors: HashMap<String, TensorInfo>,
    /// (file, start, end) of tensors read since the last `drop_read_pages`.
    read: std::sync::Mutex<Vec<(usize, usize, usize)>>,
}

pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The safetensors files of a model folder: the shards named by the index, else every `*.safetensors`.
pub fn checkpoint_files(dir: &Path) -> Result<(Vec<PathBuf>, Option<BTreeMap<String, String>>)> {
    if !dir.is_dir() {
        return Err(EngineError::Other(format!(
            "model folder {} does not exist or is not a folder; pass --model DIR with config.json and *.safetensors (run `laguna fetch` first)",
            dir.display()
        )));
    }
    let index = dir.join(INDEX_FILE);
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| EngineError::io(&index, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| EngineError::Safetensors {
                path: index.clone(),
                msg: format!("index is not valid JSON: {e}"),
            })?;
        let wm = v
            .get("weight_map")
            .and_then(|w| w.as_object())
            .ok_or_else(|| EngineError::Safetensors {
                path: index.clone(),
                msg: "index has no `weight_map` object".into(),
            })?;
        let mut map = BTreeMap::new();
        let mut files: Vec<PathBuf> = vec![];
        for (name, f) in wm {
            let f = f.as_str().ok_or_else(|| EngineError::Safetensors {
                path: index.clone(),
                msg: format!("weight_map[{name}] is not a file name"),
            })?;
            map.insert(name.clone(), f.to_string());
            let p = dir.join(f);
            if !files.contains(&p) {
                files.push(p);
            }
        }
        files.sort();
        return Ok((files, Some(map)));
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| EngineError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(EngineError::Other(format!(
            "{}: no *.safetensors files and no {INDEX_FILE}",
            dir.display()
        )));
    }
    Ok((files, None))
}

impl WeightStore {
    pub fn open(dir: &Path) -> Result<Self> {
        let (files, index) = checkpoint_files(dir)?;
        let mut maps = Vec::with_capacity(files.len());
        let mut handles = Vec::with_capacity(files.len());
        let mut tensors = HashMap::new();
        for (fi, path) in files.iter().enumerate() {
            let file = File::open(path).map_err(|e| {
                EngineError::Other(format!(
                    "{}: cannot open shard ({e}); re-run `laguna fetch` or check the index",
                    path.display()
                ))
            })?;
            // SAFETY: the file is opened read-only; callers must not modify checkpoints while serving.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| EngineError::io(path, e))?;
            let (header_len, meta) =
                SafeTensors::read_metadata(&map).map_err(|e| EngineError::Safetensors {
                    path: path.clone(),
                    msg: format!("{e:?}"),
                })?;
            let base = 8 + header_len;
            for (name, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                if base + e > map.len() {
                    return Err(EngineError::Safetensors {
                        path: path.clone(),
                        msg: format!(
                            "tensor `{name}` ends at byte {} but the file has {} (truncated?)",
                            base + e,
                            map.len()
                        ),
                    });
                }
                if let Some(idx) = &index {
                    match idx.get(&name) {
                        Some(f) if dir.join(f) == *path => {}
                        Some(f) => {
                            return Err(EngineError::Safetensors {
                                path: path.clone(),
                                msg: format!("tensor `{name}` is listed in the index under {f}"),
                            })
                        }
                        None => {
                            return Err(EngineError::Safetensors {
                                path: path.clone(),
                                msg: format!("tensor `{name}` is not listed in {INDEX_FILE}"),
                            })
                        }
                    }
                }
                tensors.insert(
                    name.clone(),
                    TensorInfo {
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        file: fi,
                        start: base + s,
                        end: base + e,
                    },
                );
            }
            maps.push(map);
            handles.push(file);
        }
        if let Some(idx) = &index {
            for (name, f) in idx {
                if !tensors.contains_key(name) {
                    return Err(EngineError::MissingTensor {
                        name: name.clone(),
                        hint: format!(" (the index lists it in {f}, which does not contain it)"),
                    });
                }
            }
        }
        Ok(WeightStore {
            dir: dir.to_path_buf(),
            files,
            maps,
            handles,
            tensors,
            read: Default::default(),
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.tensors.keys()
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    pub fn get(&self, name: &str) -> Result<TensorView<'_>> {
        let (key, info) =
            self.tensors
                .get_key_value(name)
                .ok_or_else(|| EngineError::MissingTensor {
                    name: name.to_string(),
                    hint: String::new(),
                })?;
        if let Ok(mut r) = self.read.lock() {
            r.push((info.file, info.start, info.end));
        }
        Ok(TensorView {
            name: key,
            dtype: info.dtype,
            shape: &info.shape,
            data: &self.maps[info.file][info.start..info.end],
        })
    }

    /// A tensor that must have `shape`.
    pub fn expect(&self, name: &str, shape: &[usize]) -> Result<TensorView<'_>> {
        let t = self.get(name)?;
        if t.shape != shape {
            return Err(EngineError::Shape {
                name: name.into(),
                expected: shape.to_vec(),
                found: t.shape.to_vec(),
            });
        }
        Ok(t)
    }

    /// Drop the file pages of every tensor read since the last call (`weights::pages`): a loader
    /// on a unified-memory device calls this once the device holds what it read.
    pub fn drop_read_pages(&self) -> std::io::Result<()> {
        let read = std::mem::take(&mut *self.read.lock().unwrap_or_else(|e| e.into_inner()));
        for (f, s, e) in read {
            super::pages::drop_pages(&self.handles[f], &self.maps[f], s, e)?;
        }
        Ok(())
    }

    /// Drop every file page of the checkpoint (the end of a load on a unified-memory device).
    pub fn drop_all_pages(&self) -> std::io::Result<()> {
        self.read.lock().unwrap_or_else(|e| e.into_inner()).clear();
        for (f, m) in self.handles.iter().zip(&self.maps) {
            super::pages::drop_pages(f, m, 0, m.len())?;
        }
        Ok(())
    }

    /// Bytes of the checkpoint's files in the page cache right now.
    pub fn cached_bytes(&self) -> u64 {
        self.maps
            .iter()
            .map(|m| super::pages::resident_bytes(m).unwrap_or(0))
            .sum()
    }

    /// Total bytes of tensor data.
    pub fn data_bytes(&self) -> u64 {
        self.tensors
            .values()
            .map(|t| (t.end - t.start) as u64)
            .sum()
    }
}
