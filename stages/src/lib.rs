//! laguna-stages: what the user runs — recipe, fetch, verify, plan (warmup and serve live here too).
pub mod fetch;
pub mod hub;
pub mod plan;
pub mod recipe;
pub mod serve;
pub mod verify;
