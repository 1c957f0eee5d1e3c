//! Device profiles (docs/design/gb10.md): `--device-profile gb10` or LAGUNA_DEVICE_PROFILE=gb10
//! makes every device-derived choice (kernel selects, grid sizes, co-resident block counts,
//! shared-memory fits, the K/V and workspace plan) as GB10's properties dictate, on whatever GPU
//! runs the engine; `Dev::new` runs it in a CUDA green context of GB10's SM count where the
//! driver allows, else caps grids at that many SMs' worth (what `DevProps::sms` sizes).
use super::select::DevProps;
use laguna_kernels::audit::SmLimits;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// DGX Spark's GB10 (sm_121a): 48 SMs, 99 KB of shared memory a block, 100 KB an SM.
    Gb10,
}

/// GB10's properties as the selects read them.
pub const GB10: DevProps = DevProps {
    sms: laguna_kernels::audit::GB10.sms,
    smem_per_sm: laguna_kernels::audit::GB10.smem_per_sm,
    smem_per_block: laguna_kernels::audit::GB10.smem_per_block,
};

/// The environment variable that picks a profile when no flag does.
pub const ENV: &str = laguna_kernels::env::DEVICE_PROFILE;

impl Profile {
    /// A profile name: `gb10`; empty or `none` for the real device.
    pub fn parse(s: &str) -> Result<Option<Profile>, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "none" => Ok(None),
            "gb10" => Ok(Some(Profile::Gb10)),
            other => Err(format!(
                "unknown device profile `{other}` (known: gb10, none)"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Profile::Gb10 => "gb10",
        }
    }

    pub fn props(self) -> DevProps {
        match self {
            Profile::Gb10 => GB10,
        }
    }

    /// The SM limits occupancy is counted with under the profile.
    pub fn limits(self) -> SmLimits {
        match self {
            Profile::Gb10 => laguna_kernels::audit::GB10,
        }
    }
}

/// The device's properties under `p`: the profile's, none above the real device's (a profile
/// cannot give an SM or shared memory the device lacks).
pub fn apply(real: DevProps, p: Option<Profile>) -> DevProps {
    match p {
        None => real,
        Some(p) => {
            let q = p.props();
            DevProps {
                sms: q.sms.min(real.sms),
                smem_per_sm: q.smem_per_sm.min(real.smem_per_sm),
                smem_per_block: q.smem_per_block.min(real.smem_per_block),
            }
        }
    }
}

static CHOSEN: std::sync::OnceLock<Option<Profile>> = std::sync::OnceLock::new();

/// The profile of this process, set by a command-line flag before the first device opens
/// (`None`: the flag was not given, LAGUNA_DEVICE_PROFILE decides). Later calls are ignored.
pub fn set(p: Option<Profile>) {
    if let Some(p) = p {
        let _ = CHOSEN.set(Some(p));
    }
}

/// The active profile: the flag's, else LAGUNA_DEVICE_PROFILE's (parsed here only), else none.
pub fn active() -> Result<Option<Profile>, String> {
    if let Some(p) = CHOSEN.get() {
        return Ok(*p);
    }
    let env = laguna_kernels::env::knobs().device_profile.clone();
    let p = Profile::parse(&env).map_err(|e| format!("{ENV}: {e}"))?;
    let _ = CHOSEN.set(p);
    Ok(*CHOSEN.get().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names() {
        assert_eq!(Profile::parse("GB10"), Ok(Some(Profile::Gb10)));
        assert_eq!(Profile::parse(" none"), Ok(None));
        assert_eq!(Profile::parse(""), Ok(None));
        assert!(Profile::parse("gb100").unwrap_err().contains("gb10"));
    }

    #[test]
    fn gb10_props_override_hopper() {
        let h200 = DevProps {
            sms: 132,
            smem_per_sm: 233_472,
            smem_per_block: 232_448,
        };
        // GB10's published limits: 48 SMs, 100 KB an SM, 99 KB a block.
        let g = apply(h200, Some(Profile::Gb10));
        assert_eq!(
            (g.sms, g.smem_per_sm, g.smem_per_block),
            (48, 102_400, 101_376)
        );
        assert_eq!(apply(h200, None), h200);
        // Never above the real device's.
        let small = DevProps {
            sms: 20,
            smem_per_sm: 65_536,
            smem_per_block: 49_152,
        };
        assert_eq!(apply(small, Some(Profile::Gb10)), small);
    }
}
