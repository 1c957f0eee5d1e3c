//! laguna-engine: what computes. Config, weights, the Laguna forward pass (CPU reference backend),
//! KV cache, sampling, tokenizer, scheduler and DFlash speculative decoding. Nothing here knows HTTP.
pub mod backend;
pub mod config;
pub mod cpu;
pub mod cuda;
pub mod error;
pub mod generate;
pub mod grammar;
pub mod memory;
pub mod model;
pub mod sample;
pub mod sample_check;
pub mod sched;
pub mod spec;
pub mod step_bytes;
pub mod tokenizer;
pub mod weights;

pub use config::LagunaConfig;
pub use error::{EngineError, Result};
