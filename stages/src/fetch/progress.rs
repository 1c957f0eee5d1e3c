//! indicatif bars shared by fetch and verify: one total bar plus one bar per file in flight.
//! Drawn on stderr when it is a terminal; hidden otherwise (CI logs get the per-file lines only).
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Clone)]
pub struct Progress {
    mp: MultiProgress,
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .expect("valid template")
        .progress_chars("=> ")
}

impl Progress {
    /// `enabled = false` hides every bar (e.g. `--quiet` or tests).
    pub fn new(enabled: bool) -> Progress {
        let target = if enabled {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        Progress {
            mp: MultiProgress::with_draw_target(target),
        }
    }

    pub fn total(&self, label: &str, bytes: u64) -> ProgressBar {
        let b = self.mp.add(ProgressBar::new(bytes));
        b.set_style(style("{prefix:>12.bold} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}"));
        b.set_prefix(label.to_string());
        b
    }

    pub fn file(&self, name: &str, bytes: u64) -> ProgressBar {
        let b = self.mp.add(ProgressBar::new(bytes));
        b.set_style(style("{prefix:>12} [{bar:40}] {bytes}/{total_bytes} {msg}"));
        b.set_prefix("file");
        b.set_message(name.to_string());
        b
    }

    pub fn spinner(&self, msg: &str) -> ProgressBar {
        let b = self.mp.add(ProgressBar::new_spinner());
        b.set_style(
            ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"),
        );
        b.set_message(msg.to_string());
        b.enable_steady_tick(std::time::Duration::from_millis(120));
        b
    }

    /// Print a result line to stdout without tearing the bars.
    pub fn line(&self, s: &str) {
        self.mp.suspend(|| println!("{s}"));
    }
}

/// `1234567` → `1,234,567`.
pub fn commas(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Human size, binary units: `21.6 GiB`.
pub fn human(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", units[u])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn numbers() {
        assert_eq!(super::commas(393216), "393,216");
        assert_eq!(super::commas(12), "12");
        assert_eq!(super::commas(1000), "1,000");
        assert_eq!(super::human(12884901888), "12.00 GiB");
    }
}
