//! The default model of `laguna serve` with no arguments: the committed tiny-chat fixture
//! (random weights, the Laguna tokenizer layout and chat template), compiled into the binary and
//! unpacked to a cache folder on first use. It is a test model: its answers are noise.
use std::path::PathBuf;

pub const NAME: &str = "laguna-tiny-chat";

macro_rules! fixture {
    ($f:literal) => {
        (
            $f,
            include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../tests/fixtures/models/tiny-chat/",
                $f
            )) as &[u8],
        )
    };
}

pub const FILES: &[(&str, &[u8])] = &[
    fixture!("chat_template.jinja"),
    fixture!("config.json"),
    fixture!("generation_config.json"),
    fixture!("model.safetensors"),
    fixture!("tokenizer.json"),
    fixture!("tokenizer_config.json"),
];

pub fn total_bytes() -> usize {
    FILES.iter().map(|(_, b)| b.len()).sum()
}

/// FNV-1a over names and contents: names the cache folder, so a new build never reuses stale files.
fn digest() -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for (name, bytes) in FILES {
        for &b in name.as_bytes().iter().chain(bytes.iter()) {
            h = (h ^ b as u64).wrapping_mul(0x100000001b3);
        }
    }
    h
}

fn cache_root() -> PathBuf {
    if let Some(d) = &laguna_kernels::env::knobs().cache_dir {
        return d.clone();
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("laguna");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(h).join(".cache").join("laguna");
    }
    std::env::temp_dir().join("laguna")
}

/// Unpack (once) and return the folder.
pub fn extract() -> std::io::Result<PathBuf> {
    let dir = cache_root()
        .join("embedded")
        .join(format!("tiny-chat-{:016x}", digest()));
    if FILES.iter().all(|(n, b)| {
        std::fs::metadata(dir.join(n))
            .map(|m| m.len() == b.len() as u64)
            .unwrap_or(false)
    }) {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)?;
    for (name, bytes) in FILES {
        // Write then rename, so a concurrent server never reads a half-written file.
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, dir.join(name))?;
    }
    Ok(dir)
}
