//! The prefix cache's recipe key and flag: `enable_prefix_caching` defaults on, the file turns it
//! off, `--no-prefix-cache` beats the file, a non-bool is refused.
use laguna_stages::recipe::overrides::Overrides;
use laguna_stages::recipe::{Recipe, RecipeArgs};

fn no_env(_: &str) -> Option<String> {
    None
}

fn resolve(text: &str, flags: &Overrides) -> Result<Recipe, String> {
    let dir = std::env::temp_dir().join(format!("laguna-prefix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("r{}.toml", text.len()));
    std::fs::write(&p, format!("{text}[model]\nrepo = \"org/name\"\n")).unwrap();
    let r = Recipe::resolve(Some(&p), &no_env, flags).map_err(|e| e.to_string());
    let _ = std::fs::remove_file(&p);
    r
}

#[test]
fn prefix_caching_key_and_flag() {
    let none = Overrides::default();
    assert!(resolve("", &none).unwrap().enable_prefix_caching);
    assert!(
        !resolve("enable_prefix_caching = false\n", &none)
            .unwrap()
            .enable_prefix_caching
    );
    let flag = RecipeArgs {
        server: laguna_stages::recipe::ServerArgs {
            no_prefix_cache: true,
            ..Default::default()
        },
        ..Default::default()
    }
    .overrides()
    .unwrap();
    let r = resolve("enable_prefix_caching = true\n", &flag).unwrap();
    assert!(!r.enable_prefix_caching);
    let e = resolve("enable_prefix_caching = \"yes\"\n", &none).unwrap_err();
    assert!(e.contains("enable_prefix_caching"), "{e}");
}
