//! cuBLAS for the dense BF16 Linears of long passes (prefill): Y[m, n] (+)= sum_k W[n, k] X[m, k]
//! with W BF16 [n, k] as stored, X BF16 [m, k] (the hi and optionally the lo half of the f32
//! activations' split), Y f32, f32 accumulation on the tensor cores. libcublas is loaded at run
//! time (cudarc `dynamic-loading`); without it the model keeps its own GEMM kernels.
//!
//! Unlike our kernels, cuBLAS picks its algorithm by shape, so a row's result may depend on how
//! many rows share the pass (vLLM has the same property); decode steps and DFlash verification
//! never come here (passes below `gemm_min_rows` use the batch-invariant weight-streaming kernels).
//!
//! This module is the bare binding (no `Dev`): `Dev::blas` makes the handle on its stream and
//! `Dev::blas_gemm_bf16` times its GEMMs.
use cudarc::cublas::{result as cb, sys as cbsys, CudaBlas};
use cudarc::driver::CudaStream;
use std::ffi::c_void;
use std::sync::Arc;

/// Workspace handed to cuBLAS (so it never allocates during a captured graph).
const WORKSPACE: usize = 32 << 20;

pub struct Blas {
    blas: CudaBlas,
}

impl Blas {
    /// A handle on `stream` with its workspace from `alloc` (device bytes), or the reason when
    /// libcublas is missing or does not start. `LAGUNA_NO_CUBLAS` turns it off.
    pub fn new(
        stream: Arc<CudaStream>,
        alloc: impl FnOnce(usize) -> Result<u64, String>,
    ) -> Result<Blas, String> {
        if laguna_kernels::env::knobs().no_cublas {
            return Err("LAGUNA_NO_CUBLAS is set".into());
        }
        if !unsafe { cbsys::is_culib_present() } {
            return Err("libcublas is not on the library path".into());
        }
        let blas = CudaBlas::new(stream).map_err(|e| format!("cublasCreate: {e:?}"))?;
        let ws = alloc(WORKSPACE)?;
        unsafe { cbsys::cublasSetWorkspace_v2(*blas.handle(), ws as *mut c_void, WORKSPACE) }
            .result()
            .map_err(|e| format!("cublasSetWorkspace: {e:?}"))?;
        Ok(Blas { blas })
    }

    /// Y[m, n] = beta * Y + W X^T for W BF16 [n, k] (row stride k), X BF16 [m, k] (row stride k),
    /// Y f32 (row stride ldy). `name` tags the error.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16(
        &self,
        name: &str,
        w: u64,
        x: u64,
        y: u64,
        m: usize,
        n: usize,
        k: usize,
        ldy: usize,
        beta: f32,
    ) -> Result<(), String> {
        let alpha = 1.0f32;
        // Column-major view: Y^T [n, m] = (W as [k, n])^T . (X as [k, m]).
        unsafe {
            cb::gemm_ex(
                *self.blas.handle(),
                cbsys::cublasOperation_t::CUBLAS_OP_T,
                cbsys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                cbsys::cudaDataType::CUDA_R_16BF,
                k as i32,
                x as *const c_void,
                cbsys::cudaDataType::CUDA_R_16BF,
                k as i32,
                &beta as *const f32 as *const c_void,
                y as *mut c_void,
                cbsys::cudaDataType::CUDA_R_32F,
                ldy as i32,
                cbsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cbsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| format!("cublasGemmEx {name} ({m} x {n} x {k}): {e:?}"))
    }
}
