//! (c) The draft's incrementally maintained context K/V (written step by step, with rejected rows
//! never written) equals recomputing it from scratch from the target taps of the committed tokens;
//! the proposals from both caches agree; the target KV equals a fresh prefill of the same tokens.
mod dflash_support;
use dflash_support::*;
use laguna_engine::model::{LogitRows, Model, StepInput};
use laguna_engine::sample::{Rng, SamplingParams};
use laguna_engine::spec::{step, BlockInput, ContextInput, DraftModel, SpecState};

#[test]
fn incremental_context_equals_recompute() {
    for (draft_dir, target_dir) in pairs() {
        let (mut t, mut d) = load_pair(&draft_dir, &target_dir);
        let prompt = prompt_for(&target_dir, t.cfg.vocab_size);
        let k = 4;
        let mut s = SpecState::new(&mut t, &mut d, &prompt, k, SamplingParams::greedy()).unwrap();
        step(&mut t, &mut d, &mut [&mut s]).unwrap();
        // Mix natural drafts (mostly rejected) and forced, partially right ones.
        let plain = laguna_engine::generate::generate(
            &mut t,
            &laguna_engine::generate::GenerateRequest {
                prompt: prompt.clone(),
                max_tokens: 60,
                sampling: SamplingParams::greedy(),
                ignore_eos: true,
                stop_token_ids: vec![],
            },
            false,
        )
        .unwrap()
        .completion;
        let mut rng = Rng::new(3);
        let mut rejections = 0;
        let mut partial = 0;
        for i in 0..8 {
            if i % 2 == 1 {
                let done = s.completion().len();
                let mut f = plain[done..done + k].to_vec();
                let bad = 1 + (rng.next_u64() % (k as u64 - 1)) as usize;
                f[bad] = (f[bad] + 1) % t.cfg.vocab_size as u32;
                s.force_next_drafts(f);
            }
            let r = step(&mut t, &mut d, &mut [&mut s]).unwrap().pop().unwrap();
            if r.stats.num_accepted_tokens < r.stats.num_draft_tokens {
                rejections += 1;
            }
            if r.stats.num_accepted_tokens > 0 && r.stats.num_accepted_tokens < k {
                partial += 1;
            }
        }
        assert!(
            rejections >= 4 && partial >= 3,
            "rejections {rejections}, partial {partial}"
        );
        let committed = s.tokens.len() - 1;
        assert_eq!(d.context_len(s.draft_seq), committed);
        assert_eq!(t.seq_len(s.target_seq), committed);

        // From scratch: one target prefill over the committed tokens, one context write.
        let fresh_t = t.new_seq().unwrap();
        let out = t
            .forward(&[StepInput {
                seq: fresh_t,
                tokens: &s.tokens[..committed],
                start_pos: 0,
                logits: LogitRows::None,
            }])
            .unwrap();
        let fresh_d = d.new_seq().unwrap();
        d.write_context(&[ContextInput {
            seq: fresh_d,
            start_pos: 0,
            taps: &out[0].taps,
        }])
        .unwrap();
        let inc = d.context_kv(s.draft_seq).unwrap().clone();
        let rec = d.context_kv(fresh_d).unwrap().clone();
        assert_eq!(inc.len, rec.len);
        for l in 0..inc.k.len() {
            let scale = rec.k[l]
                .iter()
                .chain(&rec.v[l])
                .fold(0f32, |m, v| m.max(v.abs()));
            let dk = max_abs_diff(&inc.k[l], &rec.k[l]);
            let dv = max_abs_diff(&inc.v[l], &rec.v[l]);
            assert!(
                dk <= 1e-5 * scale && dv <= 1e-5 * scale,
                "{}: layer {l} ΔK {dk} ΔV {dv}",
                draft_dir.display()
            );
        }
        // Same proposals (and near-identical logits) from both caches.
        let mut block = vec![*s.tokens.last().unwrap()];
        block.extend(std::iter::repeat_n(d.cfg.mask_token_id, k));
        let a = d
            .propose(&[BlockInput {
                seq: s.draft_seq,
                tokens: &block,
                start_pos: committed,
            }])
            .unwrap();
        let b = d
            .propose(&[BlockInput {
                seq: fresh_d,
                tokens: &block,
                start_pos: committed,
            }])
            .unwrap();
        let scale = b[0].logits.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(max_abs_diff(&a[0].logits, &b[0].logits) <= 1e-5 * scale);
        // Target K/V after rollbacks equals a fresh prefill: the next-token logits agree.
        let last = *s.tokens.last().unwrap();
        let la = t
            .forward(&[StepInput {
                seq: s.target_seq,
                tokens: &[last],
                start_pos: committed,
                logits: LogitRows::Last,
            }])
            .unwrap();
        let lb = t
            .forward(&[StepInput {
                seq: fresh_t,
                tokens: &[last],
                start_pos: committed,
                logits: LogitRows::Last,
            }])
            .unwrap();
        let scale = lb[0].logits.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(max_abs_diff(&la[0].logits, &lb[0].logits) <= 1e-5 * scale);
        s.free(&mut t, &mut d);
        t.free_seq(fresh_t);
        d.free_seq(fresh_d);
    }
}

/// Two sequences stepped together in one batch give the same tokens as each alone.
#[test]
fn batched_step_equals_solo() {
    let ps = pairs();
    let (draft_dir, target_dir) = &ps[0];
    let (mut t, mut d) = load_pair(draft_dir, target_dir);
    let prompt = prompt_for(target_dir, t.cfg.vocab_size);
    let p2: Vec<u32> = prompt[..prompt.len() / 2].to_vec();
    let solo = |t: &mut laguna_engine::cpu::CpuModel,
                d: &mut laguna_engine::spec::CpuDraft,
                p: &[u32],
                k: usize| {
        let mut s = SpecState::new(t, d, p, k, SamplingParams::greedy()).unwrap();
        for _ in 0..6 {
            step(t, d, &mut [&mut s]).unwrap();
        }
        s.free(t, d);
        s.tokens.clone()
    };
    let a = solo(&mut t, &mut d, &prompt, 3);
    let b = solo(&mut t, &mut d, &p2, 5);
    let mut s1 = SpecState::new(&mut t, &mut d, &prompt, 3, SamplingParams::greedy()).unwrap();
    let mut s2 = SpecState::new(&mut t, &mut d, &p2, 5, SamplingParams::greedy()).unwrap();
    step(&mut t, &mut d, &mut [&mut s1]).unwrap();
    for _ in 0..5 {
        step(&mut t, &mut d, &mut [&mut s1, &mut s2]).unwrap();
    }
    step(&mut t, &mut d, &mut [&mut s2]).unwrap();
    assert_eq!(s1.tokens, a);
    assert_eq!(s2.tokens, b);
}

/// Chunked prefill (each chunk writes its draft context, only the last samples) gives the same
/// tokens and the same draft context as a one-shot prefill.
#[test]
fn chunked_prefill_equals_one_shot() {
    for (draft_dir, target_dir) in pairs() {
        let (mut t, mut d) = load_pair(&draft_dir, &target_dir);
        let prompt = prompt_for(&target_dir, t.cfg.vocab_size);
        let run = |t: &mut laguna_engine::cpu::CpuModel,
                   d: &mut laguna_engine::spec::CpuDraft,
                   chunk: usize| {
            let mut s = SpecState::new(t, d, &prompt, 3, SamplingParams::greedy()).unwrap();
            s.prefill_chunk = chunk;
            let mut empty_steps = 0;
            while s.completion().len() < 12 {
                let r = step(t, d, &mut [&mut s]).unwrap().pop().unwrap();
                if r.tokens.is_empty() {
                    empty_steps += 1;
                    assert_eq!(d.context_len(s.draft_seq), t.seq_len(s.target_seq));
                }
            }
            let kv = d.context_kv(s.draft_seq).unwrap().clone();
            s.free(t, d);
            (s.tokens.clone(), kv, empty_steps)
        };
        let (a, kva, e0) = run(&mut t, &mut d, 0);
        let (b, kvb, e5) = run(&mut t, &mut d, 5);
        assert_eq!(e0, 0);
        assert_eq!(e5, prompt.len().div_ceil(5) - 1);
        assert_eq!(a, b);
        for l in 0..kva.k.len() {
            assert!(
                max_abs_diff(&kva.k[l], &kvb.k[l]) < 1e-5
                    && max_abs_diff(&kva.v[l], &kvb.v[l]) < 1e-5
            );
        }
    }
}
