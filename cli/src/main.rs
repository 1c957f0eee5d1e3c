//! `laguna`: the command line. Argument definitions only; each subcommand calls into `stages`/`engine`.
use clap::{Parser, Subcommand};

mod cmd;

#[derive(Parser)]
#[command(name = "laguna", version, about = "Native inference server for poolside Laguna-XS 2.1 with DFlash speculative decoding")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate tokens from a prompt with a local model folder.
    Generate(cmd::generate::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Generate(a) => cmd::generate::run(a),
    }
}
