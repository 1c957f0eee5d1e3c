pub mod device_dflash;
pub mod device_prefix;
pub mod device_sample;
pub mod device_sweep;
pub mod device_test;
pub mod kbench;
pub mod sweep;
pub mod synth;
