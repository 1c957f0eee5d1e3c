//! The CPU engine against float64 transformers references computed once by
//! tests/fixtures/make_fixtures.py (never by this code).
mod common;
use common::*;
use laguna_engine::cpu::CpuModel;
use laguna_engine::generate::{generate, GenerateRequest};
use laguna_engine::model::{LogitRows, Model, StepInput};
use laguna_engine::sample::SamplingParams;

const TOL: f64 = 1e-3;

#[test]
fn prompt_logits_match_float64_reference() {
    for dir in reference_fixtures() {
        let r = load_reference(&dir);
        let mut m = CpuModel::load(&dir).unwrap();
        let seq = m.new_seq().unwrap();
        let out = m
            .forward(&[StepInput {
                seq,
                tokens: &r.prompt_ids,
                start_pos: 0,
                logits: LogitRows::All,
            }])
            .unwrap();
        for (i, want) in r.prompt_logits.iter().enumerate() {
            let e = rel_err(out[0].row(i), want);
            assert!(
                e <= TOL,
                "{}: prompt row {i}: rel err {e:.2e}",
                dir.display()
            );
        }
        println!("{}: prompt logits ok", dir.display());
    }
}

#[test]
fn greedy_continuation_matches_float64_reference() {
    for dir in reference_fixtures() {
        let r = load_reference(&dir);
        let mut m = CpuModel::load(&dir).unwrap();
        let req = GenerateRequest {
            prompt: r.prompt_ids.clone(),
            max_tokens: r.greedy_ids.len(),
            sampling: SamplingParams::greedy(),
            ignore_eos: true,
            stop_token_ids: vec![],
        };
        let res = generate(&mut m, &req, true).unwrap();
        assert_eq!(
            res.completion,
            r.greedy_ids,
            "{}: greedy tokens differ",
            dir.display()
        );
        for (i, (got, want)) in res.step_logits.iter().zip(&r.greedy_logits).enumerate() {
            let e = rel_err(got, want);
            assert!(
                e <= TOL,
                "{}: decode step {i}: rel err {e:.2e}",
                dir.display()
            );
        }
    }
}

/// Incremental decode (KV cache, one token a step) equals a full recompute of the whole sequence,
/// and a prefill split into chunks equals one prefill.
#[test]
fn incremental_decode_equals_full_recompute() {
    for dir in reference_fixtures() {
        let r = load_reference(&dir);
        let mut all = r.prompt_ids.clone();
        all.extend(&r.greedy_ids);
        let mut m = CpuModel::load(&dir).unwrap();
        let full_seq = m.new_seq().unwrap();
        let full = m
            .forward(&[StepInput {
                seq: full_seq,
                tokens: &all,
                start_pos: 0,
                logits: LogitRows::All,
            }])
            .unwrap()
            .remove(0);
        let inc = m.new_seq().unwrap();
        let mut pos = 0;
        for chunk in all.chunks(5) {
            let out = m
                .forward(&[StepInput {
                    seq: inc,
                    tokens: chunk,
                    start_pos: pos,
                    logits: LogitRows::All,
                }])
                .unwrap()
                .remove(0);
            for j in 0..chunk.len() {
                let e = rel_err32(out.row(j), full.row(pos + j));
                assert!(
                    e < 1e-5,
                    "{}: position {}: rel err {e:.2e}",
                    dir.display(),
                    pos + j
                );
            }
            pos += chunk.len();
        }
        // Rollback: drop the last 7 positions and recompute them one by one.
        m.truncate(inc, pos - 7);
        for p in pos - 7..pos {
            let out = m
                .forward(&[StepInput {
                    seq: inc,
                    tokens: &all[p..p + 1],
                    start_pos: p,
                    logits: LogitRows::Last,
                }])
                .unwrap()
                .remove(0);
            let e = rel_err32(out.row(0), full.row(p));
            assert!(
                e < 1e-5,
                "{}: after truncate, position {p}: rel err {e:.2e}",
                dir.display()
            );
        }
    }
}

/// Fixtures must be a fair test: the reference's top-2 gap is well above the tolerance.
#[test]
fn fixtures_have_decisive_greedy_steps() {
    for dir in reference_fixtures() {
        let r = load_reference(&dir);
        for (i, row) in r.greedy_logits.iter().enumerate() {
            let mut s = row.clone();
            s.sort_by(|a, b| b.partial_cmp(a).unwrap());
            let scale = row.iter().fold(0f64, |m, v| m.max(v.abs()));
            assert!(
                s[0] - s[1] > 2.0 * TOL * scale,
                "{}: step {i} top-2 gap {} too small",
                dir.display(),
                s[0] - s[1]
            );
        }
    }
}
