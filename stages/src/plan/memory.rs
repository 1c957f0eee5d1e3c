//! How much memory the device has, for the plan: the engine's probe (CPU: /proc/meminfo; CUDA:
//! the driver's cuMemGetInfo, capped by MemAvailable on unified-memory GPUs).
use crate::recipe::Device;

pub use laguna_engine::memory::DeviceMemory;

pub fn probe(device: Device) -> Result<DeviceMemory, String> {
    match device {
        Device::Cpu => laguna_engine::memory::host()
            .ok_or_else(|| "cannot read /proc/meminfo; pass --device-memory BYTES".to_string()),
        Device::Cuda(i) => laguna_engine::memory::cuda(i).map_err(|why| {
            format!("cannot read the memory of cuda:{i} ({why}); pass --device-memory BYTES")
        }),
    }
}
