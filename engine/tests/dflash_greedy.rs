//! Greedy losslessness of DFlash speculative decoding on every fixture pair, constructed 100% / 0%
//! acceptance pairs, partial acceptance through forced (oracle-with-errors) drafts, and counter
//! conservation.
mod dflash_support;
use dflash_support::*;
use laguna_engine::generate::{generate, GenerateRequest};
use laguna_engine::model::Model;
use laguna_engine::sample::{Rng, SamplingParams};
use laguna_engine::spec::{generate_spec, step, DraftModel, SpecState, SpecStats};

fn request(prompt: &[u32], max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        stop_token_ids: vec![],
    }
}

/// (d) counter conservation for one sequence.
fn check_counters(s: &SpecStats, k: usize, completion_len: usize, max_tokens: usize) {
    assert!(s.num_accepted_tokens <= s.num_draft_tokens, "{s:?}");
    assert!(s.num_draft_tokens <= s.num_drafts * k as u64, "{s:?}");
    assert!(s.num_accepted_tokens_per_pos.len() <= k);
    for w in s.num_accepted_tokens_per_pos.windows(2) {
        assert!(w[0] >= w[1], "per-position counts must not increase: {s:?}");
    }
    assert!(s
        .num_accepted_tokens_per_pos
        .first()
        .is_none_or(|&c| c <= s.num_drafts));
    assert_eq!(
        s.num_accepted_tokens_per_pos.iter().sum::<u64>(),
        s.num_accepted_tokens,
        "{s:?}"
    );
    // generated = prefill token + one token per step + accepted drafts (before max_tokens truncation)
    assert_eq!(
        s.num_emitted_tokens,
        1 + s.num_steps + s.num_accepted_tokens,
        "{s:?}"
    );
    assert_eq!(
        completion_len as u64,
        s.num_emitted_tokens.min(max_tokens as u64)
    );
    // history agrees with the counters
    assert_eq!(s.acceptance_lengths.len() as u64, s.num_steps);
    assert_eq!(
        s.acceptance_lengths.iter().sum::<usize>() as u64,
        s.num_accepted_tokens
    );
    assert_eq!(
        s.proposals.iter().map(|p| p.len()).sum::<usize>() as u64,
        s.num_draft_tokens
    );
    for (a, p) in s.acceptance_lengths.iter().zip(&s.proposals) {
        assert!(*a <= p.len());
    }
}

#[test]
fn greedy_with_draft_is_token_identical() {
    for (draft_dir, target_dir) in pairs() {
        let (mut t, mut d) = load_pair(&draft_dir, &target_dir);
        let prompt = prompt_for(&target_dir, t.cfg.vocab_size);
        let max_tokens = 24;
        let req = request(&prompt, max_tokens);
        let plain = generate(&mut t, &req, false).unwrap();
        if target_dir.join("reference.safetensors").exists() {
            let (_, ref_greedy) = target_prompt(&target_dir);
            assert_eq!(
                &plain.completion[..],
                &ref_greedy[..max_tokens.min(ref_greedy.len())],
                "plain greedy vs float64 reference"
            );
        }
        for k in [1, 3, 6, 15] {
            let (res, stats) = generate_spec(&mut t, &mut d, &req, k, true, None).unwrap();
            assert_eq!(
                res.completion,
                plain.completion,
                "{} k={k}",
                draft_dir.display()
            );
            assert_eq!(res.finish_reason, plain.finish_reason);
            check_counters(&stats, k, res.completion.len(), max_tokens);
            eprintln!(
                "{} k={k}: {}",
                draft_dir.file_name().unwrap().to_string_lossy(),
                stats.summary()
            );
        }
        // EOS honoured the same way (stop tokens inside an accepted run end generation there).
        let mut req2 = request(&prompt, 40);
        req2.ignore_eos = false;
        req2.stop_token_ids = plain
            .completion
            .get(5..6)
            .map(|s| s.to_vec())
            .unwrap_or_default();
        let plain2 = generate(&mut t, &req2, false).unwrap();
        let (spec2, _) = generate_spec(&mut t, &mut d, &req2, 4, false, None).unwrap();
        assert_eq!(spec2.completion, plain2.completion);
        assert_eq!(spec2.finish_reason, plain2.finish_reason);
    }
}

/// Drafts forced to the true greedy continuation with one wrong token at a random position:
/// exercises every partial acceptance length and the rollback of both caches.
#[test]
fn partial_acceptance_with_forced_drafts_is_token_identical() {
    for (draft_dir, target_dir) in pairs() {
        let (mut t, mut d) = load_pair(&draft_dir, &target_dir);
        let prompt = prompt_for(&target_dir, t.cfg.vocab_size);
        let n_gen = 40;
        let plain = generate(&mut t, &request(&prompt, n_gen + 20), false)
            .unwrap()
            .completion;
        let vocab = t.cfg.vocab_size as u32;
        for k in [3, 6] {
            let mut rng = Rng::new(k as u64 * 7 + 1);
            let mut s =
                SpecState::new(&mut t, &mut d, &prompt, k, SamplingParams::greedy()).unwrap();
            s.keep_history = true;
            step(&mut t, &mut d, &mut [&mut s]).unwrap();
            let mut expect_acc = vec![];
            while s.completion().len() < n_gen {
                let done = s.completion().len();
                let truth: Vec<u32> = plain[done..done + k].to_vec();
                let mut forced = truth.clone();
                // wrong at position `bad` (k means all correct)
                let bad = (rng.next_u64() % (k as u64 + 1)) as usize;
                if bad < k {
                    forced[bad] =
                        (truth[bad] + 1 + (rng.next_u64() % (vocab as u64 - 1)) as u32) % vocab;
                }
                s.force_next_drafts(forced);
                let r = step(&mut t, &mut d, &mut [&mut s]).unwrap().pop().unwrap();
                assert_eq!(r.stats.num_accepted_tokens, bad, "k={k}");
                expect_acc.push(bad);
                // both caches hold exactly the committed positions except the last token
                assert_eq!(t.seq_len(s.target_seq), s.tokens.len() - 1);
                assert_eq!(d.context_len(s.draft_seq), s.tokens.len() - 1);
            }
            assert_eq!(
                s.completion(),
                &plain[..s.completion().len()],
                "{} k={k}",
                draft_dir.display()
            );
            assert_eq!(s.stats.acceptance_lengths, expect_acc);
            let len = s.completion().len();
            check_counters(&s.stats, k, len, usize::MAX);
            s.free(&mut t, &mut d);
        }
    }
}

/// (b) target final norm zeroed → all-zero logits → argmax 0 everywhere; a draft with norm zeroed
/// proposes 0 → 100% acceptance. Then a target that never predicts 0 → 0% acceptance.
#[test]
fn constructed_agreeing_and_disagreeing_pairs() {
    let (draft_dir, target_dir) = pairs()
        .into_iter()
        .find(|(_, t)| {
            !laguna_engine::LagunaConfig::from_file(&t.join("config.json"))
                .unwrap()
                .tie_word_embeddings
        })
        .expect("a pair with an untied target");
    let prompt = prompt_for(&target_dir, 64);
    let max_tokens = 20;
    for k in [1, 3, 6, 15] {
        // agreeing
        let (mut t, _) = load_pair(&draft_dir, &target_dir);
        t.norm.iter_mut().for_each(|w| *w = 0.0);
        let mut d = laguna_engine::spec::CpuDraft::load(&draft_dir, &t).unwrap();
        d.norm.iter_mut().for_each(|w| *w = 0.0);
        let req = request(&prompt, max_tokens);
        let plain = generate(&mut t, &req, false).unwrap();
        assert!(plain.completion.iter().all(|&x| x == 0));
        let (res, s) = generate_spec(&mut t, &mut d, &req, k, true, None).unwrap();
        assert_eq!(res.completion, plain.completion);
        assert_eq!(s.num_accepted_tokens, s.num_draft_tokens, "k={k}: {s:?}");
        assert!(s.num_drafts > 0);
        assert_eq!(s.num_accepted_tokens_per_pos, vec![s.num_drafts; k]);
        assert!((s.mean_acceptance_length() - (k as f64 + 1.0)).abs() < 1e-12);
        check_counters(&s, k, res.completion.len(), max_tokens);

        // disagreeing: target norm keeps one dimension; lm_head rows 5/6 read it with opposite
        // signs and every other row is zero, so the target's argmax is 5 or 6, never 0, while the
        // zero-norm draft keeps proposing 0.
        let (mut t, _) = load_pair(&draft_dir, &target_dir);
        let h = t.cfg.hidden_size;
        t.norm
            .iter_mut()
            .enumerate()
            .for_each(|(i, w)| *w = if i == 0 { 1.0 } else { 0.0 });
        let head = t.lm_head.as_mut().expect("untied target");
        head.w.iter_mut().for_each(|w| *w = 0.0);
        head.w[5 * h] = 1.0;
        head.w[6 * h] = -1.0;
        let mut d = laguna_engine::spec::CpuDraft::load(&draft_dir, &t).unwrap();
        d.norm.iter_mut().for_each(|w| *w = 0.0);
        let plain = generate(&mut t, &req, false).unwrap();
        assert!(
            plain.completion.iter().all(|&x| x == 5 || x == 6),
            "{:?}",
            plain.completion
        );
        let (res, s) = generate_spec(&mut t, &mut d, &req, k, true, None).unwrap();
        assert_eq!(res.completion, plain.completion);
        assert_eq!(s.num_accepted_tokens, 0, "k={k}");
        assert!(s.num_accepted_tokens_per_pos.iter().all(|&c| c == 0));
        assert_eq!(s.num_drafts as usize, max_tokens - 1);
        assert!(s.proposals.iter().all(|p| p.iter().all(|&x| x == 0)));
        check_counters(&s, k, res.completion.len(), max_tokens);
    }
}

#[test]
fn k_is_validated() {
    let (draft_dir, target_dir) = pairs().remove(0);
    let (mut t, mut d) = load_pair(&draft_dir, &target_dir);
    let bs = d.config().block_size;
    for bad in [0, bs] {
        let e = SpecState::new(&mut t, &mut d, &[1, 2, 3], bad, SamplingParams::greedy())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("num_speculative_tokens"), "{e}");
    }
}

/// Adaptive k (`SpecController`): greedy output identical to plain decoding on every pair, with
/// step-time tables that make it draft a lot, fall back to decode (k = 0) and probe, and the
/// table measured on this CPU; the draft context stays complete across steps without drafts.
#[test]
fn greedy_with_adaptive_k_is_token_identical() {
    use laguna_engine::spec::{SpecController, StepCosts};
    use std::sync::Arc;
    for (draft_dir, target_dir) in pairs() {
        let (mut t, mut d) = load_pair(&draft_dir, &target_dir);
        let prompt = prompt_for(&target_dir, t.cfg.vocab_size);
        let max_tokens = 40;
        let plain = generate(&mut t, &request(&prompt, max_tokens), false).unwrap();
        let k_max = 6.min(d.config().block_size - 1);
        let measured =
            StepCosts::measure(&mut t, &mut d, k_max, &[1, 2], prompt.len(), 1, 2).unwrap();
        assert_eq!(measured.by_batch.len(), 2);
        assert!(measured
            .by_batch
            .iter()
            .all(|(_, c)| c.len() == k_max + 1 && c.iter().all(|&x| x > 0.0)));
        let tables = [
            // Drafting is nearly free: large k.
            (0..=k_max)
                .map(|j| 1.0 + 0.01 * j as f64)
                .collect::<Vec<_>>(),
            // Drafting costs more than the k + 1 tokens a step can emit: k = 0 after the first
            // step has measured the sequence, then probes.
            (0..=k_max)
                .map(|j| {
                    if j == 0 {
                        1.0
                    } else {
                        (k_max + 2) as f64 + 0.01 * j as f64
                    }
                })
                .collect(),
            measured.for_batch(1).to_vec(),
        ];
        for (i, table) in tables.into_iter().enumerate() {
            let costs = Arc::new(StepCosts {
                by_batch: vec![(1, table)],
            });
            let mut s =
                SpecState::new(&mut t, &mut d, &prompt, k_max, SamplingParams::greedy()).unwrap();
            s.controller = Some(SpecController::new(costs));
            let mut ks = vec![];
            while s.completion().len() < max_tokens {
                let r = step(&mut t, &mut d, &mut [&mut s]).unwrap();
                ks.push(r[0].proposals.len());
            }
            assert_eq!(
                &s.completion()[..max_tokens],
                &plain.completion[..],
                "{draft_dir:?} table {i}: ks {ks:?}"
            );
            if i == 1 {
                assert!(
                    ks[1..].contains(&0),
                    "{draft_dir:?}: expected decode steps, ks {ks:?}"
                );
            }
            s.free(&mut t, &mut d);
        }
    }
}

/// A target that refuses rows at or past `limit` positions (what a CUDA target loaded for that
/// context does; the CPU engine computes any position) and records the furthest row.
struct Bounded<'a> {
    inner: &'a mut laguna_engine::cpu::CpuModel,
    limit: usize,
    furthest: usize,
}

impl Model for Bounded<'_> {
    fn config(&self) -> &laguna_engine::LagunaConfig {
        self.inner.config()
    }
    fn device(&self) -> &str {
        self.inner.device()
    }
    fn new_seq(&mut self) -> laguna_engine::Result<laguna_engine::model::SeqId> {
        self.inner.new_seq()
    }
    fn free_seq(&mut self, seq: laguna_engine::model::SeqId) {
        self.inner.free_seq(seq)
    }
    fn seq_len(&self, seq: laguna_engine::model::SeqId) -> usize {
        self.inner.seq_len(seq)
    }
    fn truncate(&mut self, seq: laguna_engine::model::SeqId, len: usize) {
        self.inner.truncate(seq, len)
    }
    fn set_taps(&mut self, layers: &[usize]) {
        self.inner.set_taps(layers)
    }
    fn forward(
        &mut self,
        batch: &[laguna_engine::model::StepInput],
    ) -> laguna_engine::Result<Vec<laguna_engine::model::StepOutput>> {
        for b in batch {
            let end = b.start_pos + b.tokens.len();
            self.furthest = self.furthest.max(end);
            if end > self.limit {
                return Err(laguna_engine::EngineError::Other(format!(
                    "row at position {} past the {}-position context",
                    end - 1,
                    self.limit
                )));
            }
        }
        self.inner.forward(batch)
    }
}

/// Adaptive k's measurement at every pair's real context (`max_position_embeddings`, 128 or 256
/// positions, block size 16) with a target and draft that agree on every token (zeroed final
/// norms: every draft accepted, so every step emits k + 1 tokens, the most positions a
/// measurement can take): `measure_within` stays inside the context with every step at its full
/// k, at the sizes `StepCosts::fit` gives; measuring k = 15 without the fit runs out of context.
#[test]
fn step_costs_fit_the_context() {
    use laguna_engine::spec::StepCosts;
    let (warm, steps) = (2, 6);
    for (draft_dir, target_dir) in pairs() {
        let (mut t, _) = load_pair(&draft_dir, &target_dir);
        t.norm.iter_mut().for_each(|w| *w = 0.0);
        let mut d = laguna_engine::spec::CpuDraft::load(&draft_dir, &t).unwrap();
        d.norm.iter_mut().for_each(|w| *w = 0.0);
        let max_len = t.cfg.max_position_embeddings;
        let k_max = d.config().block_size - 1;
        let mut b = Bounded {
            inner: &mut t,
            limit: max_len,
            furthest: 0,
        };
        let (costs, fit) =
            StepCosts::measure_within(&mut b, &mut d, k_max, &[1, 2], 1024, max_len, warm, steps)
                .unwrap();
        assert_eq!(fit, StepCosts::fit(max_len, 1024, k_max, warm, steps));
        assert!(fit.k_max >= 1);
        assert_eq!(costs.k_max(), fit.k_max);
        assert!(costs
            .by_batch
            .iter()
            .all(|(_, c)| c.iter().all(|&x| x > 0.0)));
        // Full acceptance fills the sizing's worst case: the largest k's last step ends one
        // short of `positions` (its last token is never run), within the context.
        let bound = StepCosts::positions(fit.prompt_len, fit.k_max, warm, steps);
        assert!(bound <= max_len);
        assert_eq!(b.furthest, bound - 1, "{max_len}-position context, {fit:?}");
        if StepCosts::positions(1, k_max, warm, steps) > max_len {
            assert!(fit.k_max < k_max);
            let e = StepCosts::measure(&mut b, &mut d, k_max, &[1], 1, warm, steps);
            assert!(
                e.is_err(),
                "k = {k_max} measured past a {max_len}-position context"
            );
        }
    }
}
