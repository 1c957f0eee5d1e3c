//! Engine errors. Every message says what is wrong and, where it can, what to do.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("config {path}: {msg}")]
    Config { path: String, msg: String },
    #[error("config key `{key}`: {msg}")]
    ConfigKey { key: String, msg: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a valid safetensors file: {msg}")]
    Safetensors { path: PathBuf, msg: String },
    #[error("tensor `{name}` is missing from the checkpoint{hint}")]
    MissingTensor { name: String, hint: String },
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor `{name}` has dtype {found}, expected {expected}")]
    Dtype {
        name: String,
        expected: String,
        found: String,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("invalid request: {0}")]
    Request(String),
    #[error("{0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, EngineError>;

impl EngineError {
    pub fn key(key: impl Into<String>, msg: impl Into<String>) -> Self {
        EngineError::ConfigKey {
            key: key.into(),
            msg: msg.into(),
        }
    }
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        EngineError::Io {
            path: path.into(),
            source,
        }
    }
}
