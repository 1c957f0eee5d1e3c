pub mod bench;
pub mod bench_agent;
pub mod bench_draft;
pub mod bench_gb10;
pub mod bench_grammar;
pub mod bench_oracle;
pub mod fetch;
pub mod generate;
pub mod plan;
pub mod serve;
pub mod verify;
pub mod warmup;

/// A model or draft folder a user named: it must exist and hold a config.json.
pub fn check_model_dir(dir: &std::path::Path, what: &str) -> anyhow::Result<()> {
    if !dir.is_dir() {
        anyhow::bail!(
            "{what} folder {} does not exist (expected a folder with config.json and *.safetensors)",
            dir.display()
        );
    }
    if !dir.join("config.json").is_file() {
        anyhow::bail!(
            "{what} folder {} has no config.json (expected a Hugging Face checkpoint folder)",
            dir.display()
        );
    }
    Ok(())
}
