//! The device-fit audit (`laguna warmup --arch sm_121a --audit`, docs/design/gb10.md): every
//! module compiled with ptxas' resource report (`-Xptxas=-v`, not cached: the cached cubins keep
//! their options and bits), the report parsed per entry point, the blocks an SM holds under a
//! device's limits, the launches the engine asks of each kernel (`Ask`, built by the engine from
//! the functions its launchers use) judged against them, and the PTX scanned for instructions
//! the device lacks.
use crate::{nvrtc_compile, KernelError, KernelModule, MODULES};

/// An SM's and a block's limits, as the CUDA occupancy rules count them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmLimits {
    pub name: &'static str,
    pub sms: u32,
    pub regs_per_sm: u32,
    pub max_regs_per_thread: u32,
    /// Registers are given a warp in units of this many.
    pub reg_unit: u32,
    pub threads_per_sm: u32,
    pub max_threads_per_block: u32,
    pub max_blocks_per_sm: u32,
    /// Shared memory an SM holds (bytes).
    pub smem_per_sm: u32,
    /// Shared memory a block may opt in to (static + dynamic).
    pub smem_per_block: u32,
    /// Shared memory the system takes a block (counted against the SM's).
    pub smem_reserved_per_block: u32,
    /// Thread block clusters / distributed shared memory, wgmma, TMA multicast.
    pub sm90_features: bool,
}

/// DGX Spark's GB10 (sm_121a).
pub const GB10: SmLimits = SmLimits {
    name: "GB10",
    sms: 48,
    regs_per_sm: 65536,
    max_regs_per_thread: 255,
    reg_unit: 256,
    threads_per_sm: 1536,
    max_threads_per_block: 1024,
    max_blocks_per_sm: 24,
    smem_per_sm: 102_400,
    smem_per_block: 101_376,
    smem_reserved_per_block: 1024,
    sm90_features: false,
};

/// The limits the audit knows for an architecture.
pub fn limits_for_arch(arch: &str) -> Option<SmLimits> {
    match arch {
        "sm_121a" | "sm_121" => Some(GB10),
        _ => None,
    }
}

/// ptxas' report of one entry point.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub regs: u32,
    pub barriers: u32,
    /// Static shared memory (bytes).
    pub smem: u32,
    pub stack: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
}

/// The number just before `key` in `line` ("Used 10 registers" with key " registers").
fn count(line: &str, key: &str) -> Option<u32> {
    let i = line.find(key)?;
    line[..i].split_whitespace().last()?.parse().ok()
}

/// Entry points and their resources from an NVRTC program log compiled with `-Xptxas=-v`:
/// "Compiling entry function 'k' for 'sm_121a'", "Function properties for k", "N bytes stack
/// frame, N bytes spill stores, N bytes spill loads", "Used N registers, used N barriers, N bytes
/// smem" (the smem part absent when there is none). Properties of other functions are skipped.
pub fn parse_ptxas(log: &str) -> Vec<(String, Resources)> {
    let mut out: Vec<(String, Resources)> = vec![];
    let mut props_of_entry = false;
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or("").to_string();
            out.push((name, Resources::default()));
            props_of_entry = false;
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            props_of_entry = out.last().is_some_and(|(n, _)| n == rest.trim());
        } else if line.contains("bytes stack frame") {
            if let (true, Some((_, r))) = (props_of_entry, out.last_mut()) {
                r.stack = count(line, " bytes stack frame").unwrap_or(0);
                r.spill_stores = count(line, " bytes spill stores").unwrap_or(0);
                r.spill_loads = count(line, " bytes spill loads").unwrap_or(0);
            }
        } else if line.contains("Used ") && line.contains(" registers") {
            if let Some((_, r)) = out.last_mut() {
                r.regs = count(line, " registers").unwrap_or(0);
                r.barriers = count(line, " barriers").unwrap_or(0);
                r.smem = count(line, " bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

/// Blocks of `threads` threads and `dyn_smem` bytes of dynamic shared memory an SM holds at
/// once, and the limit that sets it (0 blocks: the launch fails, the limit says why).
pub fn blocks_per_sm(
    l: &SmLimits,
    r: &Resources,
    threads: u32,
    dyn_smem: u32,
) -> (u32, &'static str) {
    if threads == 0 || threads > l.max_threads_per_block {
        return (0, "threads per block");
    }
    if r.regs > l.max_regs_per_thread {
        return (0, "registers per thread");
    }
    let smem = r.smem + dyn_smem;
    if smem > l.smem_per_block {
        return (0, "shared memory per block");
    }
    let warps = threads.div_ceil(32);
    let mut best = (l.max_blocks_per_sm, "blocks per SM");
    let mut cap = |n: u32, why: &'static str| {
        if n < best.0 {
            best = (n, why);
        }
    };
    cap(l.threads_per_sm / 32 / warps, "threads per SM");
    if r.regs > 0 {
        let per_warp = (r.regs * 32).div_ceil(l.reg_unit) * l.reg_unit;
        cap(l.regs_per_sm / per_warp / warps, "registers per SM");
    }
    cap(
        l.smem_per_sm / (smem + l.smem_reserved_per_block),
        "shared memory per SM",
    );
    best
}

/// One launch the engine makes of a kernel on the audited device for a model's shapes: threads
/// a block, dynamic shared memory, the grid's blocks and whether all of them must be resident
/// at once (grid barriers, blocks that wait on each other).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub kernel: &'static str,
    pub block: u32,
    pub dyn_smem: u32,
    pub grid: u64,
    pub coresident: bool,
    /// The job it serves (for the report).
    pub job: String,
}

/// The audit's verdict on one entry point.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub module: &'static str,
    pub kernel: String,
    pub res: Resources,
    /// The most demanding ask (largest dynamic smem, then block): its block, dyn smem, blocks/SM.
    pub worst: Option<(u32, u32, u32)>,
    /// Blocks that must be co-resident (the largest such grid) and how many can be.
    pub coresident: Option<(u64, u64)>,
    /// The limits broken, one line each (empty: OK).
    pub fails: Vec<String>,
    /// Not failures: spills (slow, not wrong).
    pub notes: Vec<String>,
}

/// Judge one entry point's resources against every ask of it.
pub fn judge(
    l: &SmLimits,
    module: &'static str,
    kernel: &str,
    r: &Resources,
    asks: &[&Ask],
) -> Verdict {
    let mut v = Verdict {
        module,
        kernel: kernel.to_string(),
        res: r.clone(),
        worst: None,
        coresident: None,
        fails: vec![],
        notes: vec![],
    };
    if r.spill_stores + r.spill_loads > 0 {
        v.notes.push(format!(
            "spills {} B stores / {} B loads",
            r.spill_stores, r.spill_loads
        ));
    }
    for a in asks {
        let (bps, why) = blocks_per_sm(l, r, a.block, a.dyn_smem);
        let key = (a.dyn_smem, a.block);
        if v.worst.is_none_or(|(b, s, _)| (s, b) < key) {
            v.worst = Some((a.block, a.dyn_smem, bps));
        }
        if bps == 0 {
            v.fails.push(format!(
                "{}: {} threads, {} + {} B smem: {why} ({})",
                a.job, a.block, r.smem, a.dyn_smem, l.name
            ));
            continue;
        }
        if a.coresident {
            let room = bps as u64 * l.sms as u64;
            if v.coresident.is_none_or(|(g, _)| a.grid > g) {
                v.coresident = Some((a.grid, room));
            }
            if a.grid > room {
                v.fails.push(format!(
                    "{}: {} blocks must be resident, {} an SM x {} SMs = {room} ({why})",
                    a.job, a.grid, bps, l.sms
                ));
            }
        }
    }
    v
}

/// Instructions (PTX text) a device without thread block clusters, wgmma or TMA multicast
/// cannot run, with what they are.
pub const SM90_ONLY: &[(&str, &str)] = &[
    ("wgmma.", "wgmma"),
    (".multicast::cluster", "TMA multicast"),
    ("barrier.cluster", "cluster barrier"),
    ("mapa.", "distributed shared memory (mapa)"),
    ("ld.shared::cluster", "distributed shared memory load"),
    ("st.shared::cluster", "distributed shared memory store"),
    ("atom.shared::cluster", "distributed shared memory atomic"),
    ("%cluster_", "cluster special register"),
    ("setmaxnreg", "setmaxnreg"),
];

/// (function, instruction kind) for every SM90_ONLY hit in `ptx`, by the `.entry` / `.func`
/// that holds it.
pub fn sm90_only(ptx: &str) -> Vec<(String, &'static str)> {
    let mut out = vec![];
    let mut func = String::from("?");
    for line in ptx.lines() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        if let Some(i) = t.find(".entry ").or_else(|| t.find(".func ")) {
            let rest = &t[i..].split_once(' ').map(|x| x.1).unwrap_or("");
            // `.func (.reg .b32 r) name(`: the name is the first token past any return list.
            let rest = rest.rsplit_once(") ").map(|x| x.1).unwrap_or(rest);
            func = rest
                .split(|c: char| c == '(' || c.is_whitespace())
                .next()
                .unwrap_or("?")
                .to_string();
        }
        for (pat, what) in SM90_ONLY {
            if t.contains(pat) && !out.iter().any(|(f, w)| f == &func && w == what) {
                out.push((func.clone(), *what));
            }
        }
    }
    out
}

/// One module's audit compile: its entries' resources and its PTX's SM90_ONLY hits.
#[derive(Debug)]
pub struct ModuleReport {
    pub module: &'static str,
    pub entries: Vec<(String, Resources)>,
    pub sm90: Vec<(String, &'static str)>,
}

/// Compile one module for `arch` with ptxas' report (not cached) and parse it.
pub fn report_module(m: &KernelModule, arch: &str) -> Result<ModuleReport, KernelError> {
    let c = nvrtc_compile(m, arch, &["-Xptxas=-v"])?;
    let entries = parse_ptxas(&c.log);
    if entries.is_empty() {
        return Err(KernelError::Compile {
            module: m.name.into(),
            arch: arch.into(),
            log: format!("no ptxas resource report in the program log:\n{}", c.log),
        });
    }
    Ok(ModuleReport {
        module: m.name,
        entries,
        sm90: sm90_only(&c.ptx),
    })
}

/// `report_module` for every module, `jobs` compiles at a time.
pub fn report_all(arch: &str, jobs: usize) -> Result<Vec<ModuleReport>, KernelError> {
    let mut out = vec![];
    for chunk in MODULES.chunks(jobs.max(1)) {
        let r: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = chunk
                .iter()
                .map(|m| s.spawn(move || report_module(m, arch)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for x in r {
            out.push(x?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from NVRTC 13.0 compiling the norm and moe modules for sm_121a (an excerpt).
    const LOG: &str = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'copy_rows' for 'sm_121a'
ptxas info    : Function properties for copy_rows
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers
ptxas info    : Compile time = 16.042 ms
ptxas info    : Compiling entry function 'rmsnorm_taps' for 'sm_121a'
ptxas info    : Function properties for rmsnorm_taps
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 26 registers, used 1 barriers, 128 bytes smem
ptxas info    : Compile time = 130.540 ms
ptxas info    : Compiling entry function 'moe_decode_fused' for 'sm_121a'
ptxas info    : Function properties for moe_decode_fused
ptxas         .     8 bytes stack frame, 8 bytes spill stores, 20 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers, 8 bytes cumulative stack size, 13712 bytes smem
ptxas info    : Compile time = 2556.876 ms
";

    #[test]
    fn parses_ptxas_report() {
        let e = parse_ptxas(LOG);
        let names: Vec<&str> = e.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["copy_rows", "rmsnorm_taps", "moe_decode_fused"]);
        assert_eq!(
            e[0].1,
            Resources {
                regs: 12,
                ..Default::default()
            }
        );
        assert_eq!((e[1].1.regs, e[1].1.barriers, e[1].1.smem), (26, 1, 128));
        assert_eq!(
            e[2].1,
            Resources {
                regs: 96,
                barriers: 1,
                smem: 13712,
                stack: 8,
                spill_stores: 8,
                spill_loads: 20,
            }
        );
    }

    fn res(regs: u32, smem: u32) -> Resources {
        Resources {
            regs,
            smem,
            ..Default::default()
        }
    }

    /// Occupancy by the CUDA rules, worked by hand for GB10.
    #[test]
    fn gb10_occupancy() {
        // 640 threads at 96 registers: 20 warps x 3072 = 61440 of 65536 registers: one block.
        assert_eq!(
            blocks_per_sm(&GB10, &res(96, 13712), 640, 26624),
            (1, "registers per SM")
        );
        // 104 registers: 20 x 3328 = 66560 > 65536: none.
        assert_eq!(blocks_per_sm(&GB10, &res(104, 0), 640, 0).0, 0);
        // 128 threads, 32 registers: 48 warps an SM / 4 = 12 blocks.
        assert_eq!(
            blocks_per_sm(&GB10, &res(32, 0), 128, 0),
            (12, "threads per SM")
        );
        // 48 KB + 1 KB reserved a block: two in 100 KB.
        assert_eq!(
            blocks_per_sm(&GB10, &res(32, 0), 128, 48 * 1024),
            (2, "shared memory per SM")
        );
        // Past 99 KB a block: does not launch.
        assert_eq!(
            blocks_per_sm(&GB10, &res(32, 1024), 128, 100 * 1024).1,
            "shared memory per block"
        );
        assert_eq!(
            blocks_per_sm(&GB10, &res(32, 0), 2048, 0).1,
            "threads per block"
        );
        // Tiny blocks: the resident-block cap.
        assert_eq!(
            blocks_per_sm(&GB10, &res(16, 0), 32, 0),
            (24, "blocks per SM")
        );
    }

    #[test]
    fn judges_coresident_grids() {
        let ask = |grid, coresident| Ask {
            kernel: "k",
            block: 640,
            dyn_smem: 26624,
            grid,
            coresident,
            job: "decode".into(),
        };
        let (a, b, c) = (ask(48, true), ask(49, true), ask(132, false));
        let v = judge(&GB10, "moe", "k", &res(95, 13712), &[&a, &c]);
        assert!(v.fails.is_empty(), "{:?}", v.fails);
        assert_eq!(v.coresident, Some((48, 48)));
        let v = judge(&GB10, "moe", "k", &res(95, 13712), &[&b]);
        assert_eq!(v.fails.len(), 1, "{:?}", v.fails);
        assert!(v.fails[0].contains("49 blocks must be resident"));
    }

    #[test]
    fn finds_sm90_only_ptx() {
        let ptx = "
.visible .entry ok_kernel(
\t.param .u64 p
)
{
\tld.global.f32 %f1, [%rd1];
}
.func  (.param .b32 func_retval0) helper(
)
{
\tmapa.shared::cluster.u32 %r2, %r1, %r3;
\tbarrier.cluster.arrive.release.aligned;
}
.visible .entry bad_kernel()
{
\t// wgmma.mma_async in a comment is no instruction
\twgmma.fence.sync.aligned;
}
";
        assert_eq!(
            sm90_only(ptx),
            vec![
                ("helper".to_string(), "distributed shared memory (mapa)"),
                ("helper".to_string(), "cluster barrier"),
                ("bad_kernel".to_string(), "wgmma"),
            ]
        );
    }
}
