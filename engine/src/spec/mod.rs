//! DFlash speculative decoding (vLLM 0.25.1 `laguna_dflash` semantics), split like mistral.rs
//! `speculative/`:
//! * [`config`]: the draft's `config.json` (`DFlashLagunaForCausalLM`) and its pairing checks;
//! * [`draft`]: the [`draft::DraftModel`] backend seam (context K/V write + block propose);
//! * [`cpu_draft`]: the CPU reference draft;
//! * [`verify`]: greedy and one-hot rejection-sampling verification;
//! * [`stats`]: counters that map onto vLLM's `spec_decode_*` metrics;
//! * [`controller`]: adaptive k from recent acceptance and measured step times;
//! * [`oracle`]: the bench's acceptance oracle (chosen accepted lengths, real draft and verify);
//! * [`driver`]: per-sequence [`driver::SpecState`] and the batched [`driver::step`].
//!
//! Scheduler use: `enable_taps(target, draft)` once; per request `SpecState::new(...)`; each
//! engine iteration `step(target, draft, &mut [&mut s1, &mut s2, ...])` returns, per sequence, the
//! newly committed tokens and the step's counters; apply stop/max_tokens to the tokens, merge
//! `StepStats` into the engine-wide [`stats::SpecStats`] (`observe`), and `SpecState::free` when a
//! request ends.
pub mod config;
pub mod controller;
pub mod cpu_draft;
pub mod draft;
pub mod driver;
pub mod oracle;
pub mod stats;
pub mod verify;

pub use config::DraftConfig;
pub use controller::{CostsFit, SpecController, StepCosts};
pub use cpu_draft::CpuDraft;
pub use draft::{BlockInput, ContextInput, DraftModel};
pub use driver::{enable_taps, generate_spec, step, SpecState, StepResult};
pub use oracle::{Acceptance, Oracle};
pub use stats::{SpecStats, StepStats};
pub use verify::{verify, Verdict};
