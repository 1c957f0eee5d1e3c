//! `laguna`: the command line. Argument definitions only; each subcommand calls into `stages`/`engine`.
use clap::{Parser, Subcommand};

mod cmd;

#[derive(Parser)]
#[command(
    name = "laguna",
    version,
    about = "Native inference server for poolside Laguna-XS 2.1 with DFlash speculative decoding"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Run the engine as this device would (generate, serve, bench): `gb10` takes
    /// DGX Spark's 48 SMs, 100 KB of shared memory an SM and 99 KB a block for every kernel
    /// choice, grid and fit, in a CUDA green context of 48 SMs where the driver allows
    /// (else grids sized for 48 SMs). Default: LAGUNA_DEVICE_PROFILE, else the real device.
    #[arg(long, global = true, value_name = "PROFILE")]
    device_profile: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Generate tokens from a prompt with a local model folder.
    Generate(cmd::generate::Args),
    /// Serve an OpenAI-compatible API (no arguments: the embedded tiny test model on CPU).
    Serve(cmd::serve::Args),
    /// Download the recipe's model and draft into the Hugging Face cache (resumable).
    Fetch(cmd::fetch::Args),
    /// Check a fetched checkpoint: sizes, hashes, safetensors headers, tensor inventory.
    Verify(cmd::verify::Args),
    /// Print the memory plan (weights, KV pool, activations) and check that it fits.
    Plan(cmd::plan::Args),
    /// Compile every CUDA kernel to cubins for the GPU found (or --arch) into the kernel cache.
    Warmup(cmd::warmup::Args),
    /// Measure load time, TTFT, decode tok/s and the roofline fraction on a CUDA GPU.
    Bench(cmd::bench::Args),
}

fn main() -> std::process::ExitCode {
    laguna_stages::exit_code(run(Cli::parse()))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(p) = &cli.device_profile {
        laguna_engine::backend::set_device_profile(p)?;
    }
    match cli.command {
        Command::Generate(a) => cmd::generate::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Fetch(a) => cmd::fetch::run(a),
        Command::Verify(a) => cmd::verify::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Warmup(a) => cmd::warmup::run(a),
        Command::Bench(a) => cmd::bench::run(a),
    }
}
