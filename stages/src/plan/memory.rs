//! How much memory the device has. CPU: `/proc/meminfo`. CUDA: whatever probe the CUDA backend
//! registers with [`set_cuda_probe`] (cudarc is not a dependency of stages); until one is
//! registered, CUDA devices fall back to host RAM and the plan says so.
use crate::recipe::Device;
use std::sync::OnceLock;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMemory {
    pub total: u64,
    /// Free right now (CUDA: `cuMemGetInfo` free; host: MemAvailable).
    pub free: u64,
    /// Where the numbers came from, for the plan's output.
    pub source: String,
}

/// `(total, free)` bytes of CUDA device `ordinal`, or `None` when there is no such device/driver.
pub type CudaProbe = fn(ordinal: usize) -> Option<(u64, u64)>;

static CUDA_PROBE: OnceLock<CudaProbe> = OnceLock::new();

/// The hook for the CUDA backend: register `cuMemGetInfo` here once at start-up
/// (e.g. `plan::memory::set_cuda_probe(|i| cudarc_mem_info(i))`). Later calls are ignored.
pub fn set_cuda_probe(p: CudaProbe) {
    let _ = CUDA_PROBE.set(p);
}

/// Parse `MemTotal` and `MemAvailable` (kB) from /proc/meminfo text.
pub fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

pub fn host_memory() -> Option<DeviceMemory> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let (total, free) = parse_meminfo(&text)?;
    Some(DeviceMemory {
        total,
        free,
        source: "host RAM (/proc/meminfo MemTotal/MemAvailable)".into(),
    })
}

pub fn probe(device: Device) -> Result<DeviceMemory, String> {
    match device {
        Device::Cpu => host_memory()
            .ok_or_else(|| "cannot read /proc/meminfo; pass --device-memory BYTES".to_string()),
        Device::Cuda(i) => {
            if let Some(p) = CUDA_PROBE.get() {
                if let Some((total, free)) = p(i) {
                    return Ok(DeviceMemory {
                        total,
                        free,
                        source: format!("CUDA device {i} (driver cuMemGetInfo)"),
                    });
                }
            }
            host_memory()
                .map(|m| DeviceMemory {
                    source: format!(
                        "{}; no CUDA memory probe in this build, so host RAM stands in for cuda:{i} (right for unified-memory machines like DGX Spark; pass --device-memory BYTES otherwise)",
                        m.source
                    ),
                    ..m
                })
                .ok_or_else(|| format!("no CUDA memory probe and no /proc/meminfo; pass --device-memory BYTES for cuda:{i}"))
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn meminfo() {
        let t =
            "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   23000000 kB\n";
        assert_eq!(
            super::parse_meminfo(t),
            Some((24000000 * 1024, 23000000 * 1024))
        );
    }
}
