//! The CPU reference backend.
pub mod model;
pub mod ops;

pub use model::CpuModel;
