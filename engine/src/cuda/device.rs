//! Thin device layer over cudarc: one context, one non-blocking stream, raw device pointers
//! (`u64`), kernels loaded from cached cubins, per-launch event timing, stream-captured graphs.
use super::blas::Blas;
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaStream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone)]
pub struct DevError(pub String);
impl std::fmt::Display for DevError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for DevError {}
impl From<result::DriverError> for DevError {
    fn from(e: result::DriverError) -> Self {
        DevError(format!("{e:?}"))
    }
}
impl From<String> for DevError {
    fn from(e: String) -> Self {
        DevError(e)
    }
}

type R<T> = std::result::Result<T, DevError>;

/// Ok when a CUDA driver and a GPU are present; Err(reason) otherwise. Never panics.
pub fn probe() -> std::result::Result<(), String> {
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so.1) on this machine".into());
    }
    result::init().map_err(|e| format!("cuInit failed: {e:?}"))?;
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => Err("the CUDA driver sees no GPU".into()),
        Err(e) => Err(format!("cannot count GPUs: {e:?}")),
    }
}

/// What the driver reports for one GPU's memory.
pub struct MemProbe {
    pub total: u64,
    pub free: u64,
    /// An integrated GPU sharing the host's memory (CU_DEVICE_ATTRIBUTE_INTEGRATED).
    pub integrated: bool,
}

/// `cuMemGetInfo` of GPU `ordinal` (through its primary context) and whether it is integrated.
pub fn mem_probe(ordinal: usize) -> std::result::Result<MemProbe, String> {
    probe()?;
    let ctx = CudaContext::new(ordinal).map_err(|e| format!("cuda:{ordinal}: {e:?}"))?;
    ctx.bind_to_thread()
        .map_err(|e| format!("cuda:{ordinal}: {e:?}"))?;
    let (free, total) = result::mem_get_info().map_err(|e| format!("cuMemGetInfo: {e:?}"))?;
    let integrated = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED)
        .unwrap_or(0)
        != 0;
    Ok(MemProbe {
        total: total as u64,
        free: free as u64,
        integrated,
    })
}

/// Kernel argument list built by a launch closure.
pub struct Args(Vec<Arg>);
enum Arg {
    U64(u64),
    I32(i32),
    F32(f32),
}
impl Args {
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.push(Arg::U64(v));
        self
    }
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.0.push(Arg::I32(v));
        self
    }
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.0.push(Arg::F32(v));
        self
    }
}

/// Event pairs around launches, summed per kernel name after a sync.
#[derive(Default)]
pub struct Prof {
    events: Vec<(&'static str, sys::CUevent, sys::CUevent)>,
}
// Events are plain handles used from the thread that owns the model.
unsafe impl Send for Prof {}

impl Prof {
    /// (kernel, total ms, launches), largest first.
    pub fn summary(&mut self) -> Vec<(String, f64, usize)> {
        let mut m: HashMap<&str, (f64, usize)> = HashMap::new();
        for (n, a, b) in self.events.drain(..) {
            unsafe {
                let _ = result::event::synchronize(b);
                let ms = result::event::elapsed(a, b).unwrap_or(0.0) as f64;
                let e = m.entry(n).or_default();
                e.0 += ms;
                e.1 += 1;
                let _ = result::event::destroy(a);
                let _ = result::event::destroy(b);
            }
        }
        let mut v: Vec<(String, f64, usize)> = m
            .into_iter()
            .map(|(k, (t, c))| (k.to_string(), t, c))
            .collect();
        v.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
        v
    }
}

/// A CUDA event recorded on the model's stream (timing between graph launches).
pub struct Event {
    e: sys::CUevent,
}
unsafe impl Send for Event {}
impl Event {
    /// Wait for the event.
    pub fn sync(&self) -> R<()> {
        unsafe { Ok(result::event::synchronize(self.e)?) }
    }
    /// Milliseconds from this event to `later` (both must have completed).
    pub fn ms_to(&self, later: &Event) -> f64 {
        unsafe { result::event::elapsed(self.e, later.e).unwrap_or(0.0) as f64 }
    }
}
impl Drop for Event {
    fn drop(&mut self) {
        unsafe {
            let _ = result::event::destroy(self.e);
        }
    }
}

pub struct Graph {
    g: cudarc::driver::CudaGraph,
}
// The graph is only launched from the thread that owns the model (the model is moved, not shared).
unsafe impl Send for Graph {}
impl Graph {
    pub fn launch(&self) -> R<()> {
        Ok(self.g.launch()?)
    }
}

pub struct Dev {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// Kernels by entry name, each with whether it is launched with programmatic dependent launch
    /// (sm_90+, but for the kernels in `NO_PDL`: the split-KV decode attention, which ran slower
    /// with PDL at 131K context, except `attention_decode_tc_qk` and `attention_decode_gqa_qk`,
    /// which load the cache before their wait).
    funcs: HashMap<&'static str, (CudaFunction, bool)>,
    /// SPREAD kernels: the dynamic shared memory that makes an SM hold one of their blocks.
    pads: HashMap<&'static str, u32>,
    pub arch: String,
    pub name: String,
    /// Streaming multiprocessors (sizes persistent grids).
    pub sms: u32,
    /// Shared memory an SM holds (bytes): kernels sized for 3 blocks of ~70 KB stay off below it.
    pub smem_per_sm: u32,
    /// Shared memory a block may opt in to (bytes).
    pub smem_per_block: u32,
    /// The device profile the engine runs under (`profile.rs`): `sms`, `smem_per_sm`,
    /// `smem_per_block` and `occupancy` are the profile's.
    pub profile: Option<super::profile::Profile>,
    /// Peak DRAM bandwidth (bytes/s) from the memory clock and bus width the driver reports; 0
    /// when it reports neither (sizes `moe_decode_fused`'s issue stagger).
    pub mem_bw: f64,
    allocs: Mutex<Vec<u64>>,
    /// cuBLAS handle, made on first use (None when libcublas is missing or turned off).
    blas: std::sync::OnceLock<Option<Blas>>,
    /// Pinned host staging for `htod_staged` (null when cuMemHostAlloc failed): a bump area
    /// whose offset goes back to 0 whenever the stream has been synchronized.
    stage: Stage,
    /// Next free byte of `stage` (held while a copy is staged and queued).
    stage_off: Mutex<usize>,
    /// What `htod_cached` last wrote to each destination (dropped by any other write to it).
    uploaded: Mutex<HashMap<u64, Vec<u8>>>,
    /// Mapped pinned host memory (READBACK_SLOTS slots of READBACK_BYTES) that kernels write
    /// decode steps' tokens into (`decode_advance`), read by `readback_take` after the step's
    /// event without a copy in the stream; null when cuMemHostAlloc / mapping failed. `rb_dev` is
    /// its device address.
    rb: Stage,
    rb_dev: u64,
    /// The loaded modules when they were built with LAGUNA_STAMP (their `laguna_stamps`), else
    /// empty.
    stamp_mods: Vec<Arc<cudarc::driver::CudaModule>>,
}

/// Pinned host memory owned by `Dev` (freed in its Drop); every access goes through the
/// `stage_off` lock.
struct Stage(*mut u8);
unsafe impl Send for Stage {}
unsafe impl Sync for Stage {}

/// Kernels launched without PDL on devices that have it: the split-KV decode attention, slower
/// with it at 131K context and no faster at 2K (perf-log 2026-11-30: runs 43, 83, 96).
const NO_PDL: &[&str] = &[
    "attention_decode_head",
    "attention_decode_head_fp8",
    "attention_decode_gqa",
    "attention_decode_gqa_fp8",
    "attention_decode_tc",
    "attention_decode_tc_fp8",
];

/// Bytes of pinned host memory behind `Dev::htod_staged` (a step's metadata: tokens, positions,
/// block tables of up to DECODE_ROWS sequences, sampling parameters).
const STAGE_BYTES: usize = 1 << 20;

/// `Dev::readback_ring` slots: how many steps' tokens may be outstanding, and the bytes each holds.
pub const READBACK_SLOTS: usize = 4;
pub const READBACK_BYTES: usize = 4096;

unsafe impl Send for Dev {}

impl Dev {
    pub fn new(ordinal: usize) -> R<Dev> {
        probe()?;
        let profile = super::profile::active().map_err(DevError)?;
        let ctx = match profile {
            None => CudaContext::new(ordinal)?,
            Some(p) => match unsafe { green_context(ordinal, p.props().sms) } {
                Ok((ctx, sms)) => {
                    tracing::info!(
                        "device profile {}: a CUDA green context of {sms} SMs",
                        p.name()
                    );
                    ctx
                }
                Err(why) => {
                    tracing::warn!(
                        "device profile {}: no green context ({why}); every grid sized for {} SMs instead, on all of the device's",
                        p.name(),
                        p.props().sms
                    );
                    CudaContext::new(ordinal)?
                }
            },
        };
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let (maj, min) = ctx.compute_capability()?;
        let arch = laguna_kernels::arch_for_capability(maj, min);
        let name = ctx.name().unwrap_or_else(|_| "?".into());
        let root = laguna_kernels::cache_root();
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(132)
            .max(1) as u32;
        let smem_per_sm = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            )
            .unwrap_or(0)
            .max(0) as u32;
        let smem_per_block = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .unwrap_or(0)
            .max(0) as u32;
        let real = super::select::DevProps {
            sms,
            smem_per_sm,
            smem_per_block,
        };
        let super::select::DevProps {
            sms,
            smem_per_sm,
            smem_per_block,
        } = super::profile::apply(real, profile);
        // Memory clock (kHz, double data rate) x bus width (bits).
        let mem_bw = {
            let a = |x| ctx.attribute(x).unwrap_or(0).max(0) as f64;
            let khz = a(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
            let bits = a(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
            khz * 1e3 * 2.0 * bits / 8.0
        };
        let pdl = maj >= 9;
        let mut pads = HashMap::new();
        let mut funcs = HashMap::new();
        let mut stamp_mods = vec![];
        for m in laguna_kernels::MODULES {
            let (bin, _) =
                laguna_kernels::get_cubin(&root, m, &arch).map_err(|e| DevError(e.to_string()))?;
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(bin))
                .map_err(|e| {
                    DevError(format!(
                        "loading kernel module {} for {arch}: {e:?}",
                        m.name
                    ))
                })?;
            if laguna_kernels::stamp_build() {
                stamp_mods.push(module.clone());
            }
            for &e in m.entries {
                let f = module.load_function(e)?;
                let mut bytes = super::big_smem(e);
                if super::select::attention::SPREAD.contains(&e) {
                    // Unused dynamic shared memory that leaves room for one block an SM.
                    let st = f
                        .get_attribute(
                            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                        )
                        .unwrap_or(0)
                        .max(0) as u32;
                    let pad = super::select::attention::spread_pad(e, smem_per_sm, st);
                    if pad > 0 {
                        bytes = bytes.max(pad);
                        pads.insert(e, pad);
                    }
                }
                if bytes > 0 {
                    // A device that cannot opt in never selects the kernel (`select::attention`
                    // needs 3 such blocks an SM), so a refusal here is not fatal.
                    if let Err(why) = f.set_attribute(
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        bytes as i32,
                    ) {
                        tracing::warn!(
                            "{e}: {bytes} bytes of dynamic shared memory refused ({why:?})"
                        );
                        pads.remove(e);
                    }
                }
                funcs.insert(e, (f, pdl && !NO_PDL.contains(&e)));
            }
        }
        // The readback ring: pinned, mapped into the device's address space, zeroed.
        let rb = {
            let bytes = READBACK_SLOTS * READBACK_BYTES;
            match unsafe { result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_DEVICEMAP) } {
                Ok(p) => {
                    let mut d: sys::CUdeviceptr = 0;
                    let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0) };
                    if r == sys::CUresult::CUDA_SUCCESS && d != 0 {
                        unsafe { std::ptr::write_bytes(p as *mut u8, 0, bytes) };
                        (p as *mut u8, d)
                    } else {
                        unsafe {
                            let _ = result::free_host(p);
                        }
                        (std::ptr::null_mut(), 0)
                    }
                }
                Err(_) => (std::ptr::null_mut(), 0),
            }
        };
        Ok(Dev {
            ctx,
            stream,
            funcs,
            pads,
            arch,
            name,
            sms,
            smem_per_sm,
            smem_per_block,
            profile,
            mem_bw,
            allocs: Mutex::new(vec![]),
            blas: std::sync::OnceLock::new(),
            stage: Stage(
                unsafe { result::malloc_host(STAGE_BYTES, 0) }
                    .map_or(std::ptr::null_mut(), |p| p as *mut u8),
            ),
            uploaded: Mutex::new(HashMap::new()),
            stage_off: Mutex::new(0),
            rb: Stage(rb.0),
            rb_dev: rb.1,
            stamp_mods,
        })
    }

    /// Whether the kernels record a timeline (LAGUNA_STAMP builds).
    pub fn stamping(&self) -> bool {
        !self.stamp_mods.is_empty()
    }

    /// Forget the timeline records (synchronizes the stream).
    pub fn stamps_reset(&self) -> R<()> {
        for m in &self.stamp_mods {
            let mut n = m.get_global("laguna_stamp_n", &self.stream)?;
            self.stream.memset_zeros(&mut n)?;
        }
        Ok(self.stream.synchronize()?)
    }

    /// The timeline records since `stamps_reset`, every module's (synchronizes the stream).
    pub fn stamps_take(&self) -> R<Vec<super::stamp::Stamp>> {
        let mut out = vec![];
        for m in &self.stamp_mods {
            let n = m.get_global("laguna_stamp_n", &self.stream)?;
            let mut c = [0u8; 4];
            self.stream.memcpy_dtoh(&n, &mut c)?;
            self.stream.synchronize()?;
            let cap = super::stamp::STAMP_CAP;
            let n = (u32::from_le_bytes(c) as usize).min(cap);
            if n == 0 {
                continue;
            }
            let g = m.get_global("laguna_stamps", &self.stream)?;
            let mut raw = vec![0u8; n * 64];
            self.stream.memcpy_dtoh(&g.slice(0..n * 64), &mut raw)?;
            self.stream.synchronize()?;
            out.extend(raw.chunks_exact(64).map(super::stamp::Stamp::from_bytes));
        }
        Ok(out)
    }

    /// Dynamic shared memory to launch SPREAD kernel `name` with so that an SM holds one of its
    /// blocks (0 for other kernels, or when the device refused it).
    pub fn spread_pad(&self, name: &str) -> u32 {
        self.pads.get(name).copied().unwrap_or(0)
    }

    /// Blocks of kernel `name` with `block` threads and `smem` bytes of dynamic shared memory
    /// that one SM holds at once (0 when the kernel is not loaded or the driver cannot say).
    /// Under a device profile, no more than the profile's SM limits allow (the kernel's
    /// registers and static shared memory as the driver reports them).
    pub fn occupancy(&self, name: &str, block: u32, smem: usize) -> u32 {
        let Some((f, _)) = self.funcs.get(name) else {
            return 0;
        };
        let real = f
            .occupancy_max_active_blocks_per_multiprocessor(block, smem, None)
            .unwrap_or(0);
        let Some(p) = self.profile else {
            return real;
        };
        let attr = |a| f.get_attribute(a).unwrap_or(0).max(0) as u32;
        let res = laguna_kernels::audit::Resources {
            regs: attr(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS),
            smem: attr(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
            ..Default::default()
        };
        let (n, _) = laguna_kernels::audit::blocks_per_sm(&p.limits(), &res, block, smem as u32);
        real.min(n)
    }

    /// The cuBLAS handle (created on the first call), or None when libcublas is not available.
    pub fn blas(&self) -> Option<&Blas> {
        self.blas
            .get_or_init(|| {
                match Blas::new(self.stream.clone(), |n| self.alloc(n).map_err(|e| e.0)) {
                    Ok(b) => Some(b),
                    Err(why) => {
                        tracing::warn!(
                            "cuBLAS not used ({why}); prefill GEMMs run on laguna's own kernels"
                        );
                        None
                    }
                }
            })
            .as_ref()
    }

    /// `Blas::gemm_bf16` on this device's stream, timed under `name` when profiling.
    #[allow(clippy::too_many_arguments)]
    pub fn blas_gemm_bf16(
        &self,
        blas: &Blas,
        prof: &mut Option<Prof>,
        name: &'static str,
        w: u64,
        x: u64,
        y: u64,
        m: usize,
        n: usize,
        k: usize,
        ldy: usize,
        beta: f32,
    ) -> R<()> {
        let ev = self.prof_begin(prof)?;
        blas.gemm_bf16(name, w, x, y, m, n, k, ldy, beta)
            .map_err(DevError)?;
        self.prof_end(prof, name, ev)
    }

    pub fn alloc(&self, bytes: usize) -> R<u64> {
        self.ctx.bind_to_thread()?;
        let p = unsafe { result::malloc_sync(bytes) }
            .map_err(|e| DevError(format!("cuMemAlloc of {bytes} bytes: {e:?}")))?;
        self.allocs.lock().unwrap().push(p);
        Ok(p)
    }

    /// Fill `n` 32-bit words at `dst` with `v` (on the stream).
    pub fn memset_d32(&self, dst: u64, v: u32, n: usize) -> R<()> {
        self.uploaded.lock().unwrap().remove(&dst);
        self.ctx.bind_to_thread()?;
        unsafe { sys::cuMemsetD32Async(dst, v, n, self.stream.cu_stream()) }.result()?;
        Ok(())
    }

    /// An integrated GPU sharing the host's memory (GB10): its device memory is the host's.
    pub fn integrated(&self) -> bool {
        self.ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED)
            .unwrap_or(0)
            != 0
    }

    /// (free, total) bytes; on an integrated GPU free is capped by the host's MemAvailable
    /// (see `crate::memory`).
    pub fn mem_info(&self) -> R<(usize, usize)> {
        self.ctx.bind_to_thread()?;
        let (free, total) = result::mem_get_info()?;
        let integrated = self
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED)
            .unwrap_or(0)
            != 0;
        let free = match crate::memory::host() {
            Some(h) if integrated => free.min(h.free as usize),
            _ => free,
        };
        Ok((free, total))
    }

    /// Host → device on the stream; the host buffer may be dropped on return.
    pub fn htod(&self, dst: u64, src: &[u8]) -> R<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.uploaded.lock().unwrap().remove(&dst);
        self.htod_sync(dst, src)
    }

    /// The copy of `htod`, leaving `uploaded` alone (`htod_cached` holds its lock around it).
    fn htod_sync(&self, dst: u64, src: &[u8]) -> R<()> {
        self.ctx.bind_to_thread()?;
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }?;
        // Pageable sources are staged before the call returns; sync keeps short-lived buffers safe.
        self.sync()
    }

    /// Host → device without waiting: `src` is copied into pinned staging memory and the copy
    /// is queued on the stream (ordered before the kernels launched after it), so a step's
    /// metadata uploads cost no host round trips. The staging bytes are reused only after the
    /// stream has been synchronized (`dtoh`, `sync`, `htod`); when the area is full this waits for
    /// the stream first. Not for use while a graph is being captured.
    pub fn htod_staged(&self, dst: u64, src: &[u8]) -> R<()> {
        self.uploaded.lock().unwrap().remove(&dst);
        self.stage_copy(dst, src)
    }

    /// `htod_staged` for metadata that only host uploads write (block tables, row maps): skipped
    /// when `dst` already holds exactly `src` from the previous `htod_cached` to it.
    pub fn htod_cached(&self, dst: u64, src: &[u8]) -> R<()> {
        if self.stage.0.is_null() {
            return self.htod(dst, src);
        }
        let mut up = self.uploaded.lock().unwrap();
        if up.get(&dst).is_some_and(|v| v.as_slice() == src) {
            return Ok(());
        }
        self.stage_copy(dst, src)?;
        up.insert(dst, src.to_vec());
        Ok(())
    }

    fn stage_copy(&self, dst: u64, src: &[u8]) -> R<()> {
        let n = src.len();
        if n == 0 {
            return Ok(());
        }
        if self.stage.0.is_null() || n > STAGE_BYTES {
            return self.htod_sync(dst, src);
        }
        self.ctx.bind_to_thread()?;
        let mut next = self.stage_off.lock().unwrap();
        let mut off = (*next + 15) & !15;
        if off + n > STAGE_BYTES {
            self.stream.synchronize()?;
            off = 0;
        }
        unsafe {
            let p = self.stage.0.add(off);
            std::ptr::copy_nonoverlapping(src.as_ptr(), p, n);
            result::memcpy_htod_async(
                dst,
                std::slice::from_raw_parts(p, n),
                self.stream.cu_stream(),
            )?;
        }
        *next = off + n;
        Ok(())
    }

    /// Device → device on the stream.
    pub fn dtod(&self, dst: u64, src: u64, bytes: usize) -> R<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.uploaded.lock().unwrap().remove(&dst);
        self.ctx.bind_to_thread()?;
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }?;
        Ok(())
    }

    /// Device → host, synchronous.
    pub fn dtoh(&self, dst: &mut [u8], src: u64) -> R<()> {
        self.ctx.bind_to_thread()?;
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }?;
        self.sync()
    }

    /// Wait for the stream (the staging area is free again afterwards).
    pub fn sync(&self) -> R<()> {
        let mut next = self.stage_off.lock().unwrap();
        self.stream.synchronize()?;
        *next = 0;
        Ok(())
    }

    /// Device address of the readback ring (mapped pinned host memory: READBACK_SLOTS slots of
    /// READBACK_BYTES), None when it could not be set up.
    pub fn readback_ring(&self) -> Option<u64> {
        (!self.rb.0.is_null()).then_some(self.rb_dev)
    }

    /// An event recorded on the stream now, without timing (the point `readback_take` waits for).
    pub fn marker(&self) -> R<Event> {
        self.ctx.bind_to_thread()?;
        unsafe {
            let e = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
            result::event::record(e, self.stream.cu_stream())?;
            Ok(Event { e })
        }
    }

    /// Wait for `ev` (recorded after the kernel that wrote ring slot `slot`) and copy the slot's
    /// first `dst.len()` bytes out.
    pub fn readback_take(&self, slot: usize, ev: &Event, dst: &mut [u8]) -> R<()> {
        if self.rb.0.is_null() || slot >= READBACK_SLOTS || dst.len() > READBACK_BYTES {
            return Err(DevError(format!("readback_take: no ring slot {slot}")));
        }
        self.ctx.bind_to_thread()?;
        ev.sync()?;
        unsafe {
            let src = self.rb.0.add(slot * READBACK_BYTES);
            for (i, d) in dst.iter_mut().enumerate() {
                *d = std::ptr::read_volatile(src.add(i));
            }
        }
        Ok(())
    }

    /// Record an event on the stream now.
    pub fn event(&self) -> R<Event> {
        self.ctx.bind_to_thread()?;
        let e = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)?;
        unsafe { result::event::record(e, self.stream.cu_stream()) }?;
        Ok(Event { e })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn launch_p(
        &self,
        prof: &mut Option<Prof>,
        name: &'static str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shmem: u32,
        f: impl FnOnce(&mut Args),
    ) -> R<()> {
        let (func, pdl) = self
            .funcs
            .get(name)
            .ok_or_else(|| DevError(format!("kernel {name} is not loaded")))?;
        let mut a = Args(Vec::with_capacity(24));
        f(&mut a);
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let ev = self.prof_begin(prof)?;
        // cuLaunchKernelEx with programmatic stream serialisation (PDL, when the kernel has it):
        // the kernel may be scheduled while the previous one drains; every kernel begins with
        // PDL_ENTRY (wait for the previous grid, then release the next), so only weight reads run
        // early. Off while profiling (events sit between the launches anyway).
        let mut params: Vec<*mut std::ffi::c_void> =
            a.0.iter()
                .map(|x| match x {
                    Arg::U64(v) => v as *const u64 as *mut std::ffi::c_void,
                    Arg::I32(v) => v as *const i32 as *mut std::ffi::c_void,
                    Arg::F32(v) => v as *const f32 as *mut std::ffi::c_void,
                })
                .collect();
        let mut attrs: [sys::CUlaunchAttribute; 1] = unsafe { std::mem::zeroed() };
        let mut na = 0usize;
        let pdl = *pdl && prof.is_none();
        if pdl {
            attrs[na].id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs[na].value.programmaticStreamSerializationAllowed = 1;
            na += 1;
        }

        let cfg = self.launch_config(grid, block, shmem, &mut attrs[..na]);
        self.ctx.bind_to_thread()?;
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                func.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| {
            DevError(format!(
                "launching {name} grid {grid:?} block {block:?}: {e:?}"
            ))
        })?;
        self.prof_end(prof, name, ev)?;
        if laguna_kernels::env::knobs().cuda_sync {
            self.stream
                .synchronize()
                .map_err(|e| DevError(format!("{name}: {e:?}")))?;
        }
        Ok(())
    }

    /// A launch of `grid` x `block` on the stream with `attrs` (none when empty).
    fn launch_config(
        &self,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shmem: u32,
        attrs: &mut [sys::CUlaunchAttribute],
    ) -> sys::CUlaunchConfig {
        sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: shmem,
            hStream: self.stream.cu_stream(),
            attrs: if attrs.is_empty() {
                std::ptr::null_mut()
            } else {
                attrs.as_mut_ptr()
            },
            numAttrs: attrs.len() as u32,
        }
    }

    /// Start and end event of one timed launch when profiling (`launch_p`, cuBLAS calls).
    pub fn prof_begin(&self, prof: &Option<Prof>) -> R<Option<(sys::CUevent, sys::CUevent)>> {
        if prof.is_none() {
            return Ok(None);
        }
        self.ctx.bind_to_thread()?;
        let a = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)?;
        let b = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)?;
        unsafe { result::event::record(a, self.stream.cu_stream()) }?;
        Ok(Some((a, b)))
    }
    pub fn prof_end(
        &self,
        prof: &mut Option<Prof>,
        name: &'static str,
        ev: Option<(sys::CUevent, sys::CUevent)>,
    ) -> R<()> {
        if let (Some((ea, eb)), Some(p)) = (ev, prof.as_mut()) {
            unsafe { result::event::record(eb, self.stream.cu_stream()) }?;
            p.events.push((name, ea, eb));
        }
        Ok(())
    }

    pub fn begin_capture(&self) -> std::result::Result<(), String> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| format!("{e:?}"))
    }
    pub fn end_capture(&self) -> std::result::Result<Graph, String> {
        match self.stream.end_capture(sys::CUgraphInstantiate_flags(0)) {
            Ok(Some(g)) => Ok(Graph { g }),
            Ok(None) => Err("empty graph".into()),
            Err(e) => Err(format!("{e:?}")),
        }
    }

    /// Bytes moved (read + written) per second by a device copy kernel over `bytes`.
    pub fn copy_bandwidth(&self, bytes: usize) -> R<f64> {
        let bytes = bytes / 16 * 16;
        let a = self.alloc(bytes)?;
        let b = self.alloc(bytes)?;
        unsafe { result::memset_d8_async(a, 1, bytes, self.stream.cu_stream()) }?;
        let n = (bytes / 16) as u64;
        // (Under a device profile, the profile's SMs.)
        let sms = self.sms;
        let run = |p: &mut Option<Prof>| {
            self.launch_p(p, "copy_u4", (sms * 8, 1, 1), (512, 1, 1), 0, |x| {
                x.u64(a).u64(b).u64(n);
            })
        };
        for _ in 0..3 {
            run(&mut None)?;
        }
        let mut times = vec![];
        for _ in 0..10 {
            let mut p = Some(Prof::default());
            run(&mut p)?;
            let s = p.unwrap().summary();
            times.push(s[0].1);
        }
        times.sort_by(|x, y| x.partial_cmp(y).unwrap());
        let ms = times[times.len() / 2];
        self.free(a);
        self.free(b);
        Ok(2.0 * bytes as f64 / (ms / 1e3))
    }

    pub fn free(&self, p: u64) {
        self.uploaded.lock().unwrap().retain(|&d, _| d != p);
        let mut v = self.allocs.lock().unwrap();
        if let Some(i) = v.iter().position(|&x| x == p) {
            v.swap_remove(i);
            let _ = self.stream.synchronize();
            unsafe {
                let _ = result::free_sync(p);
            }
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
        let _ = self.ctx.bind_to_thread();
        for p in [self.stage.0, self.rb.0] {
            if !p.is_null() {
                unsafe {
                    let _ = result::free_host(p as *mut std::ffi::c_void);
                }
            }
        }
        for p in self.allocs.lock().unwrap().drain(..) {
            unsafe {
                let _ = result::free_sync(p);
            }
        }
    }
}

/// A context on `ordinal` confined to `sms` SMs (a green context, CUDA 12.4+ drivers), and the
/// SMs it got. The context lives as long as the process (it is never destroyed: cudarc would
/// destroy it as an ordinary context).
unsafe fn green_context(ordinal: usize, sms: u32) -> Result<(Arc<CudaContext>, u32), String> {
    let ok = |r: sys::CUresult, what: &str| {
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(format!("{what}: {r:?}"))
        }
    };
    result::init().map_err(|e| format!("cuInit: {e:?}"))?;
    let dev = result::device::get(ordinal as i32).map_err(|e| format!("cuDeviceGet: {e:?}"))?;
    let mut all: sys::CUdevResource = std::mem::zeroed();
    ok(
        sys::cuDeviceGetDevResource(
            dev,
            &mut all,
            sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
        ),
        "cuDeviceGetDevResource",
    )?;
    let mut part: sys::CUdevResource = std::mem::zeroed();
    let mut rest: sys::CUdevResource = std::mem::zeroed();
    let mut groups: std::ffi::c_uint = 1;
    ok(
        sys::cuDevSmResourceSplitByCount(&mut part, &mut groups, &all, &mut rest, 0, sms),
        "cuDevSmResourceSplitByCount",
    )?;
    let got = part.__bindgen_anon_1.sm.smCount;
    if groups < 1 || got < sms {
        return Err(format!(
            "the device splits off {groups} group(s) of {got} SMs, not {sms}"
        ));
    }
    let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
    ok(
        sys::cuDevResourceGenerateDesc(&mut desc, &mut part, 1),
        "cuDevResourceGenerateDesc",
    )?;
    let mut g: sys::CUgreenCtx = std::ptr::null_mut();
    let flags = sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as std::ffi::c_uint;
    ok(
        sys::cuGreenCtxCreate(&mut g, desc, dev, flags),
        "cuGreenCtxCreate",
    )?;
    let mut c: sys::CUcontext = std::ptr::null_mut();
    ok(sys::cuCtxFromGreenCtx(&mut c, g), "cuCtxFromGreenCtx")?;
    let ctx = CudaContext::from_raw_context(ordinal, dev, c)
        .map_err(|e| format!("binding the green context: {e:?}"))?;
    // Never dropped: cudarc's Drop would cuCtxDestroy it, which is not how a green context goes.
    std::mem::forget(ctx.clone());
    Ok((ctx, got))
}
