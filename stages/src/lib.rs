//! laguna-stages: what the user runs — recipe, fetch, verify, plan (warmup and serve live here too).
pub mod fetch;
pub mod hub;
pub mod plan;
pub mod recipe;
pub mod serve;
pub mod verify;

/// How a command line ends (`laguna` and `laguna-dev`): a user error prints one line (the error
/// and its causes), no backtrace; `RUST_LOG=debug` (or trace) prints the full report with its
/// backtrace when `RUST_BACKTRACE=1`.
pub fn exit_code(result: anyhow::Result<()>) -> std::process::ExitCode {
    let Err(e) = result else {
        return std::process::ExitCode::SUCCESS;
    };
    let verbose =
        std::env::var("RUST_LOG").is_ok_and(|v| v.contains("debug") || v.contains("trace"));
    if verbose {
        eprintln!("error: {e:?}");
    } else {
        eprintln!("error: {e:#}");
    }
    std::process::ExitCode::FAILURE
}
