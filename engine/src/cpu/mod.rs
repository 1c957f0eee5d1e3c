//! The CPU reference backend.
pub mod model;
pub mod ops;
pub mod prefix;

pub use model::CpuModel;
