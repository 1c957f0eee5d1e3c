//! How much memory a device offers for weights and K/V, backend-neutral. CPU: `/proc/meminfo`'s
//! MemAvailable. CUDA: the driver's `cuMemGetInfo`; on an integrated GPU whose memory is the host's
//! (DGX Spark's GB10), the smaller of that and MemAvailable, since the driver's figure does not see
//! what the host's page cache and other processes hold.

/// Bytes of one device, with where the numbers came from (for `laguna plan` and the serve log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMemory {
    pub total: u64,
    /// Free right now.
    pub free: u64,
    pub source: String,
    /// An integrated GPU whose memory is the host's (GB10): the page cache of a checkpoint being
    /// loaded and the device's copy of it come out of the same memory.
    pub unified: bool,
}

/// Parse `MemTotal` and `MemAvailable` (bytes) from /proc/meminfo text.
pub fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// Host RAM from /proc/meminfo.
pub fn host() -> Option<DeviceMemory> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let (total, free) = parse_meminfo(&text)?;
    Some(DeviceMemory {
        total,
        free,
        source: "host RAM (/proc/meminfo MemTotal/MemAvailable)".into(),
        unified: false,
    })
}

/// The process's peak resident set (`VmHWM` of /proc/self/status), bytes.
pub fn vm_hwm() -> Option<u64> {
    parse_status_kb(
        &std::fs::read_to_string("/proc/self/status").ok()?,
        "VmHWM:",
    )
}

/// A `kB` field of /proc/self/status text, in bytes.
pub fn parse_status_kb(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// CUDA device `ordinal`: Err says why there is no answer (no driver, no such GPU).
pub fn cuda(ordinal: usize) -> Result<DeviceMemory, String> {
    let d = crate::cuda::device::mem_probe(ordinal)?;
    Ok(unified_min(
        DeviceMemory {
            total: d.total,
            free: d.free,
            source: format!("cuda:{ordinal} (driver cuMemGetInfo)"),
            unified: d.integrated,
        },
        d.integrated,
        host(),
    ))
}

/// On an integrated GPU the usable free memory is the smaller of the driver's and the host's.
pub fn unified_min(
    dev: DeviceMemory,
    integrated: bool,
    host: Option<DeviceMemory>,
) -> DeviceMemory {
    match (integrated, host) {
        (true, Some(h)) if h.free < dev.free => DeviceMemory {
            total: dev.total,
            free: h.free,
            source: format!(
                "{}, capped by host MemAvailable (integrated GPU: unified memory)",
                dev.source
            ),
            unified: true,
        },
        _ => DeviceMemory {
            unified: integrated,
            ..dev
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo() {
        let t =
            "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   23000000 kB\n";
        assert_eq!(parse_meminfo(t), Some((24000000 * 1024, 23000000 * 1024)));
        assert_eq!(parse_meminfo("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn status_fields() {
        let t = "Name:\tlaguna\nVmPeak:\t  200 kB\nVmHWM:\t   1234 kB\n";
        assert_eq!(parse_status_kb(t, "VmHWM:"), Some(1234 * 1024));
        assert_eq!(parse_status_kb(t, "VmRSS:"), None);
        assert!(vm_hwm().is_some_and(|b| b > 0));
    }

    #[test]
    fn integrated_takes_the_smaller_free() {
        let dev = |free| DeviceMemory {
            total: 128 << 30,
            free,
            source: "dev".into(),
            unified: false,
        };
        let host = |free| {
            Some(DeviceMemory {
                total: 128 << 30,
                free,
                source: "host".into(),
                unified: false,
            })
        };
        assert_eq!(
            unified_min(dev(100 << 30), true, host(90 << 30)).free,
            90 << 30
        );
        assert_eq!(
            unified_min(dev(80 << 30), true, host(90 << 30)).free,
            80 << 30
        );
        // A discrete GPU never looks at host RAM.
        assert_eq!(
            unified_min(dev(80 << 30), false, host(10 << 30)).free,
            80 << 30
        );
        assert_eq!(unified_min(dev(80 << 30), true, None).free, 80 << 30);
        assert!(unified_min(dev(80 << 30), true, None).unified);
        assert!(unified_min(dev(100 << 30), true, host(90 << 30)).unified);
        assert!(!unified_min(dev(80 << 30), false, host(10 << 30)).unified);
    }
}
