//! `laguna-dev`: the developer tools, kept out of the product binary. Argument definitions only;
//! each subcommand's work is in `cmd/`. Run on device machines (device checks, kernel benches) and
//! anywhere (`synth`).
use clap::{Parser, Subcommand};

mod cmd;

#[derive(Parser)]
#[command(
    name = "laguna-dev",
    version,
    about = "Developer tools for laguna: device checks, kernel micro-benchmarks, random-weight checkpoints"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Run the engine as this device would (device-test): `gb10` takes DGX Spark's 48 SMs, 100 KB
    /// of shared memory an SM and 99 KB a block for every kernel choice, grid and fit, in a CUDA
    /// green context of 48 SMs where the driver allows (else grids sized for 48 SMs). Default:
    /// LAGUNA_DEVICE_PROFILE, else the real device.
    #[arg(long, global = true, value_name = "PROFILE")]
    device_profile: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Write a random-weight checkpoint of any Laguna config in the exact on-disk format.
    Synth(cmd::synth::Args),
    /// Check the CUDA backend against the CPU reference on the fixture models (device machines).
    DeviceTest(cmd::device_test::Args),
    /// Kernel micro-benchmarks at the XS-2.1 decode shapes (device machines).
    Kbench(cmd::kbench::Args),
}

fn main() -> std::process::ExitCode {
    laguna_stages::exit_code(run(Cli::parse()))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(p) = &cli.device_profile {
        laguna_engine::backend::set_device_profile(p)?;
    }
    match cli.command {
        Command::Synth(a) => cmd::synth::run(a),
        Command::DeviceTest(a) => cmd::device_test::run(a),
        Command::Kbench(a) => cmd::kbench::run(a),
    }
}
