//! The acceptance oracle (`spec::oracle`, `laguna bench --acceptance`): on every fixture pair with
//! its real draft, a fixed A makes every step accept exactly min(A, k) drafts (until the end of
//! the reference) through the real greedy verify, and the output equals plain greedy decoding;
//! sampled runs emit the seeded plain sampled continuation with the planned acceptance.
mod dflash_support;
use dflash_support::*;
use laguna_engine::generate::{generate, GenerateRequest};
use laguna_engine::sample::SamplingParams;
use laguna_engine::spec::{step, Acceptance, DraftModel, Oracle, SpecState};

fn request(prompt: &[u32], max_tokens: usize, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        sampling,
        ignore_eos: true,
        stop_token_ids: vec![],
    }
}

/// Runs `gen` tokens with the oracle; returns (completion, accepted length of every step).
fn run_oracle(
    t: &mut dyn laguna_engine::model::Model,
    d: &mut dyn DraftModel,
    prompt: &[u32],
    reference: &[u32],
    acceptance: Acceptance,
    k: usize,
    gen: usize,
    sampling: SamplingParams,
) -> (Vec<u32>, Vec<usize>) {
    let vocab = t.config().vocab_size;
    let mut s = SpecState::new(t, d, prompt, k, sampling).unwrap();
    s.oracle = Some(Oracle::new(reference.to_vec(), acceptance, 3, vocab));
    let mut acc = vec![];
    while s.completion().len() < gen {
        let r = step(t, d, &mut [&mut s]).unwrap().pop().unwrap();
        if !r.proposals.is_empty() {
            acc.push(r.stats.num_accepted_tokens);
        }
    }
    let out = s.completion()[..gen].to_vec();
    s.free(t, d);
    (out, acc)
}

#[test]
fn fixed_acceptance_is_exact_and_greedy_output_unchanged() {
    for (draft_dir, target_dir) in pairs() {
        let (mut t, mut d) = load_pair(&draft_dir, &target_dir);
        let prompt = prompt_for(&target_dir, t.cfg.vocab_size);
        let gen = 20;
        let k_max = 6;
        let plain = generate(
            &mut t,
            &request(&prompt, gen + k_max + 1, SamplingParams::greedy()),
            false,
        )
        .unwrap()
        .completion;
        let reference: Vec<u32> = prompt.iter().chain(&plain).copied().collect();
        for (a, k) in [(0, 3), (1, 3), (2, 6), (4, 6), (6, 6), (5, 2)] {
            let (out, acc) = run_oracle(
                &mut t,
                &mut d,
                &prompt,
                &reference,
                Acceptance::Fixed(a),
                k,
                gen,
                SamplingParams::greedy(),
            );
            assert_eq!(out, &plain[..gen], "{draft_dir:?} A={a} k={k}");
            assert!(!acc.is_empty());
            assert!(
                acc.iter().all(|&x| x == a.min(k)),
                "{draft_dir:?} A={a} k={k}: accepted {acc:?}"
            );
        }
        // The mean mode through the real verify: greedy output unchanged, lengths within 0..=k.
        let (out, acc) = run_oracle(
            &mut t,
            &mut d,
            &prompt,
            &reference,
            Acceptance::Mean(2.0),
            4,
            gen,
            SamplingParams::greedy(),
        );
        assert_eq!(out, &plain[..gen]);
        assert!(acc.iter().all(|&x| x <= 4) && acc.iter().any(|&x| x != acc[0]));
    }
}

#[test]
fn sampled_oracle_emits_the_plain_sampled_continuation() {
    let (draft_dir, target_dir) = pairs().remove(0);
    let (mut t, mut d) = load_pair(&draft_dir, &target_dir);
    let prompt = prompt_for(&target_dir, t.cfg.vocab_size);
    let sampling = SamplingParams {
        temperature: 0.8,
        top_k: 0,
        top_p: 1.0,
        seed: Some(11),
    };
    let gen = 16;
    let plain = generate(&mut t, &request(&prompt, gen + 7, sampling.clone()), false)
        .unwrap()
        .completion;
    let reference: Vec<u32> = prompt.iter().chain(&plain).copied().collect();
    let (out, acc) = run_oracle(
        &mut t,
        &mut d,
        &prompt,
        &reference,
        Acceptance::Fixed(3),
        5,
        gen,
        sampling,
    );
    assert_eq!(out, &plain[..gen]);
    assert!(acc.iter().all(|&x| x == 3), "{acc:?}");
}

#[test]
fn oracle_off_its_reference_is_an_error() {
    let (draft_dir, target_dir) = pairs().remove(0);
    let (mut t, mut d) = load_pair(&draft_dir, &target_dir);
    let prompt = prompt_for(&target_dir, t.cfg.vocab_size);
    let vocab = t.cfg.vocab_size;
    // A reference that is not the greedy continuation: the greedy verify disagrees with it.
    let reference: Vec<u32> = prompt
        .iter()
        .copied()
        .chain((0..30).map(|i| (i * 13 + 5) as u32 % vocab as u32))
        .collect();
    let mut s = SpecState::new(&mut t, &mut d, &prompt, 4, SamplingParams::greedy()).unwrap();
    s.oracle = Some(Oracle::new(reference, Acceptance::Fixed(2), 3, vocab));
    let mut err = None;
    for _ in 0..4 {
        if let Err(e) = step(&mut t, &mut d, &mut [&mut s]) {
            err = Some(e.to_string());
            break;
        }
    }
    assert!(err.is_some_and(|e| e.contains("acceptance oracle")));
}
