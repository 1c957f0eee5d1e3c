//! `laguna bench --device-profile gb10`: the GB10 projection (docs/design/gb10.md). For a decode
//! step and each DFlash step timed, the bytes the step reads (`engine::step_bytes`, from the
//! configs), their time at GB10's read bandwidth, the step's latency that moves no bytes as
//! measured under the profile, and the sum as the projected GB10 step.
//!
//! The latency that moves no bytes is the measured step (under the profile: 48 SMs, GB10's
//! kernel choices and grids) minus the step's bytes at the copy rate the same 48 SMs reach on
//! this device (`copy_bandwidth`, measured in the same run), floored at 0. What remains is what
//! does not shrink with faster memory: launch boundaries, grid barriers, dependent chains, the
//! host's share, and whatever part of the step streams below the copy kernel's rate.
use anyhow::{Context, Result};
use laguna_engine::config::LagunaConfig;
use laguna_engine::cuda::{profile, CudaModel};
use laguna_engine::model::Model;
use laguna_engine::spec::config::DraftConfig;
use laguna_engine::step_bytes::{Reads, StepBytes};

/// GB10's read bandwidth (bytes/s): a saturating read kernel's measured rate on a DGX Spark
/// (273 GB/s nominal LPDDR5x).
pub const GB10_READ_BW: f64 = 234e9;

/// What the bench measured under the profile.
pub struct Measured {
    /// The decode step (ms) and where it came from.
    pub decode_ms: f64,
    pub decode_source: &'static str,
    /// Copy rate of the profile's SMs on this device (bytes/s, read + write).
    pub copy_bw: f64,
    /// (k, DFlash step ms).
    pub dflash: Vec<(usize, f64)>,
    pub kv_elt: u64,
    /// Context before the timed steps (mean over the timed decode).
    pub ctx: usize,
}

pub struct Row {
    pub label: String,
    pub bytes: StepBytes,
    pub measured_ms: f64,
}

impl Row {
    fn gb(&self) -> f64 {
        self.bytes.total() / 1e9
    }
    /// The bytes at GB10's read bandwidth.
    pub fn bytes_ms(&self) -> f64 {
        1e3 * self.bytes.total() / GB10_READ_BW
    }
    /// The measured latency that moves no bytes (see the module docs).
    pub fn fixed_ms(&self, copy_bw: f64) -> f64 {
        (self.measured_ms - 1e3 * self.bytes.total() / copy_bw).max(0.0)
    }
    pub fn projected_ms(&self, copy_bw: f64) -> f64 {
        self.bytes_ms() + self.fixed_ms(copy_bw)
    }
}

/// The decode row and one row per timed DFlash k.
pub fn rows(cfg: &LagunaConfig, draft: Option<&DraftConfig>, m: &Measured) -> Vec<Row> {
    let mut rows = vec![Row {
        label: "decode (1 row)".into(),
        bytes: StepBytes::decode(cfg, m.ctx, m.kv_elt),
        measured_ms: m.decode_ms,
    }];
    if let Some(d) = draft {
        for &(k, ms) in &m.dflash {
            rows.push(Row {
                label: format!("DFlash k={k} ({} rows)", k + 1),
                bytes: StepBytes::dflash(cfg, d, k, m.ctx, m.kv_elt),
                measured_ms: ms,
            });
            rows.push(Row {
                label: format!("DFlash k={k}, as launched"),
                bytes: StepBytes::dflash_reads(cfg, d, k, m.ctx, m.kv_elt, Reads::Launched),
                measured_ms: ms,
            });
        }
    }
    rows
}

/// The assumptions printed next to the table.
pub fn assumptions(m: &Measured, engine_decode_weights: usize, rows: &[Row]) -> Vec<String> {
    let d = &rows[0].bytes;
    let ours = d.dense_weights() as f64 + d.routed_experts;
    vec![
        format!("A PROJECTION for DGX Spark's GB10, not a measurement: bytes at {:.0} GB/s (a saturating read kernel's rate on GB10) + the latency that moves no bytes measured here under --device-profile gb10.", GB10_READ_BW / 1e9),
        format!("Latency that moves no bytes = measured step - step bytes at the profile's own copy rate on this device ({:.2} TB/s read+write by 48 SMs), floored at 0; it assumes the step's kernels stream at the copy kernel's efficiency on GB10 as well.", m.copy_bw / 1e12),
        format!("Bound if every ms scaled with bandwidth: measured x {:.2} TB/s / {:.0} GB/s (the 'all bandwidth' column).", m.copy_bw / 1e12, GB10_READ_BW / 1e9),
        format!("Bytes from the configs (engine/src/step_bytes.rs): weights read once a pass, K/V ({} B elements) at a context of {} positions, routed experts = expected union under uniform routing E(1-(1-K/E)^r) of r rows (real routing is correlated, so at most this on average).", m.kv_elt, m.ctx),
        format!("Decode weights: {:.4} GB by the config accounting, {:.4} GB as the loader counted them ({}).", ours / 1e9, engine_decode_weights as f64 / 1e9,
            if (ours - engine_decode_weights as f64).abs() < 1.0 { "agree" } else { "DIFFER: check the checkpoint against the config" }),
        format!("Measured decode step: {}. DFlash steps: batch 1, greedy, device-resident (wall per step).", m.decode_source),
        "DFlash 'as launched': the bytes the CUDA step's kernels request before any reuse in L2 (docs/design/dflash.md, where the verify's bytes go): K/V once per verified row instead of once per sequence, BF16 weights once per 8 rows; what GB10's DRAM reads lies between it and the ideal row above it.".into(),
    ]
}

/// The projection of one bench run, with what it was computed from.
pub struct Projection {
    pub rows: Vec<Row>,
    pub measured: Measured,
    pub notes: Vec<String>,
}

impl Projection {
    pub fn print(&self) {
        print(&self.rows, &self.measured, &self.notes)
    }
    pub fn to_json(&self) -> serde_json::Value {
        to_json(&self.rows, &self.measured, &self.notes)
    }
}

/// The projection of a `laguna bench` run under `--device-profile gb10` (None under no profile).
/// The decode step is the serving path's (`decode_step` greedy, one sequence, pipelined), else
/// the graph replayed back to back, else the timed decode.
pub fn from_bench(
    m: &CudaModel,
    a: &super::bench::Args,
    copy_bw: f64,
    step_rows: &[(String, f64, f64)],
    replay_ms: Option<f64>,
    tok_s: f64,
    spec: Option<&[super::bench_draft::KRow]>,
) -> Result<Option<Projection>> {
    if profile::active().map_err(anyhow::Error::msg)? != Some(profile::Profile::Gb10) {
        return Ok(None);
    }
    let serving = step_rows
        .iter()
        .find(|r| r.0 == "greedy, 1 sequence, pipelined")
        .map(|r| r.2);
    let (decode_ms, decode_source) = match (serving, replay_ms) {
        (Some(ms), _) => (
            ms,
            "decode_step greedy, 1 sequence, pipelined (the serving path)",
        ),
        (None, Some(ms)) => (ms, "the decode graph replayed back to back"),
        (None, None) => (1e3 / tok_s, "the timed greedy decode"),
    };
    let draft = match &a.draft {
        Some(dir) => Some(
            DraftConfig::from_file(&dir.join("config.json"))
                .with_context(|| format!("reading {}/config.json", dir.display()))?,
        ),
        None => None,
    };
    let measured = Measured {
        decode_ms,
        decode_source,
        copy_bw,
        dflash: spec
            .unwrap_or(&[])
            .iter()
            .map(|r| (r.k, r.step_ms))
            .collect(),
        kv_elt: if m.kv_fp8() { 1 } else { 2 },
        ctx: a.prompt_len + a.gen / 2,
    };
    let rows = rows(m.config(), draft.as_ref(), &measured);
    let notes = assumptions(&measured, m.decode_weight_bytes, &rows);
    Ok(Some(Projection {
        rows,
        measured,
        notes,
    }))
}

pub fn print(rows: &[Row], m: &Measured, notes: &[String]) {
    println!("\nGB10 projection (batch 1; a projection, see the assumptions below):");
    println!("| step | GB read | ms at {:.0} GB/s | measured ms (profile) | no-byte ms | projected GB10 ms | x own bytes | projected tok/s | all bandwidth ms |", GB10_READ_BW / 1e9);
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let p = r.projected_ms(m.copy_bw);
        let tok = if r.label.starts_with("decode") {
            format!("{:.1}", 1e3 / p)
        } else {
            "-".into()
        };
        println!(
            "| {} | {:.3} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} | {tok} | {:.2} |",
            r.label,
            r.gb(),
            r.bytes_ms(),
            r.measured_ms,
            r.fixed_ms(m.copy_bw),
            p,
            p / r.bytes_ms(),
            r.measured_ms * m.copy_bw / GB10_READ_BW
        );
    }
    for n in notes {
        println!("- {n}");
    }
}

pub fn to_json(rows: &[Row], m: &Measured, notes: &[String]) -> serde_json::Value {
    serde_json::json!({
        "projection": true,
        "read_bw_bytes_s": GB10_READ_BW,
        "copy_bw_bytes_s": m.copy_bw,
        "context": m.ctx,
        "assumptions": notes,
        "rows": rows.iter().map(|r| {
            let b = &r.bytes;
            serde_json::json!({"step": r.label, "bytes": b.total(), "attention": b.attention, "dense_mlp": b.dense_mlp,
                "shared_experts": b.shared_experts, "router": b.router, "lm_head": b.lm_head, "embed_rows": b.embed_rows,
                "experts_read": b.experts_read, "routed_experts": b.routed_experts, "kv": b.kv, "draft_weights": b.draft_weights,
                "draft_kv": b.draft_kv, "draft_context": b.draft_context, "bytes_ms": r.bytes_ms(), "measured_ms": r.measured_ms,
                "fixed_ms": r.fixed_ms(m.copy_bw), "projected_ms": r.projected_ms(m.copy_bw)})
        }).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xs() -> LagunaConfig {
        LagunaConfig::from_file(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/reference/laguna-xs-2.1-nvfp4.config.json"
        )))
        .unwrap()
    }

    #[test]
    fn projection_adds_no_byte_latency_to_bytes_at_gb10() {
        let cfg = xs();
        let m = Measured {
            decode_ms: 3.0,
            decode_source: "test",
            copy_bw: 2.0e12,
            dflash: vec![],
            kv_elt: 2,
            ctx: 2048,
        };
        let r = rows(&cfg, None, &m);
        let b = StepBytes::decode(&cfg, 2048, 2).total();
        // 4.18 GB: 17.9 ms at 234 GB/s; 2.09 ms at 2 TB/s, so 0.91 ms moves no bytes.
        assert!((r[0].bytes_ms() - 1e3 * b / 234e9).abs() < 1e-9);
        assert!((r[0].fixed_ms(m.copy_bw) - (3.0 - 1e3 * b / 2e12)).abs() < 1e-9);
        assert!(
            (r[0].projected_ms(m.copy_bw) - (1e3 * b / 234e9 + 3.0 - 1e3 * b / 2e12)).abs() < 1e-9
        );
        // A step faster than its bytes at the copy rate has no fixed part.
        let fast = Row {
            measured_ms: 1.0,
            ..rows(&cfg, None, &m).remove(0)
        };
        assert_eq!(fast.fixed_ms(m.copy_bw), 0.0);
        let notes = assumptions(&m, 0, &r);
        assert!(notes[0].contains("PROJECTION"));
        assert!(notes[4].contains("DIFFER"));
    }

    /// With a draft, each timed k gives the ideal row and the as-launched one: the same weights
    /// at k = 6 (one 8-row GEMV pass), the K/V of 7 rows read one row at a time.
    #[test]
    fn dflash_rows_ideal_and_as_launched() {
        let cfg = xs();
        let d = DraftConfig::from_file(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/reference/laguna-xs-2.1-dflash.config.json"
        )))
        .unwrap();
        let m = Measured {
            decode_ms: 2.0,
            decode_source: "test",
            copy_bw: 2.0e12,
            dflash: vec![(6, 6.0)],
            kv_elt: 2,
            ctx: 2048,
        };
        let r = rows(&cfg, Some(&d), &m);
        assert_eq!(r.len(), 3);
        assert_eq!(r[1].label, "DFlash k=6 (7 rows)");
        assert_eq!(r[2].label, "DFlash k=6, as launched");
        let (ideal, launched) = (&r[1].bytes, &r[2].bytes);
        assert_eq!(launched.dense_weights(), ideal.dense_weights());
        assert_eq!(ideal.kv, (10 * 2055 + 30 * 518) * 4096);
        assert_eq!(launched.kv, (10 * (7 * 2049 + 21) + 30 * 7 * 512) * 4096);
        assert!(launched.total() > ideal.total());
        assert_eq!((r[1].measured_ms, r[2].measured_ms), (6.0, 6.0));
    }
}
