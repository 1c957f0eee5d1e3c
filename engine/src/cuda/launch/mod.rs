//! Typed launchers: one function per kernel entry point (or per group of entry points that share
//! one parameter list, the name then chosen by the family's `select`), with the arguments as
//! named struct fields in the order of the kernel's parameters. The engine and `laguna-dev kbench`
//! launch only through these, so an argument list is written once (docs/design/kernels.md).
pub mod attention;
pub mod linear;
pub mod moe;
pub mod norm;
pub mod plan;
pub mod sample;

use super::device::DevError;

type R<T> = std::result::Result<T, DevError>;

/// A launch's grid, threads a block and dynamic shared memory (bytes).
#[derive(Debug, Clone, Copy)]
pub struct Geom {
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub smem: u32,
}

impl Geom {
    pub fn new(grid: (u32, u32, u32), block: u32, smem: u32) -> Geom {
        Geom { grid, block, smem }
    }
}
