//! The driver's fused-step seam (`DraftModel::fused_greedy_step`, taken by the CUDA draft with a
//! CUDA target): `spec::step` offers a step to the draft exactly when every state is decoding
//! greedily with its full k and no forced drafts, never during prefill or for sampled requests,
//! and a draft that declines (None) leaves the generic step unchanged (token-identical output).
mod dflash_support;
use dflash_support::*;
use laguna_engine::generate::{generate, GenerateRequest};
use laguna_engine::model::{Model, SeqId, StepOutput};
use laguna_engine::sample::SamplingParams;
use laguna_engine::spec::draft::{BlockInput, ContextInput};
use laguna_engine::spec::{step, CpuDraft, DraftConfig, DraftModel, SpecState, StepResult};

/// CpuDraft that records every offer of a fused step and declines it.
struct Recording {
    inner: CpuDraft,
    offers: Vec<usize>,
}

impl DraftModel for Recording {
    fn config(&self) -> &DraftConfig {
        self.inner.config()
    }
    fn device(&self) -> &str {
        "cpu"
    }
    fn new_seq(&mut self) -> laguna_engine::error::Result<SeqId> {
        self.inner.new_seq()
    }
    fn free_seq(&mut self, seq: SeqId) {
        self.inner.free_seq(seq)
    }
    fn context_len(&self, seq: SeqId) -> usize {
        self.inner.context_len(seq)
    }
    fn truncate(&mut self, seq: SeqId, len: usize) {
        self.inner.truncate(seq, len)
    }
    fn write_context(&mut self, batch: &[ContextInput]) -> laguna_engine::error::Result<()> {
        self.inner.write_context(batch)
    }
    fn propose(&mut self, batch: &[BlockInput]) -> laguna_engine::error::Result<Vec<StepOutput>> {
        self.inner.propose(batch)
    }
    fn fused_greedy_step(
        &mut self,
        _target: &mut dyn Model,
        states: &mut [&mut SpecState],
    ) -> Option<laguna_engine::error::Result<Vec<StepResult>>> {
        assert!(
            states
                .iter()
                .all(|s| s.is_prefilled() && s.sampling.is_greedy()),
            "offered a step with a prefilling or sampled state"
        );
        self.offers.push(states.len());
        None
    }
}

#[test]
fn fused_steps_are_offered_only_for_greedy_decode_batches() {
    let (draft_dir, target_dir) = pairs().into_iter().next().expect("a draft fixture pair");
    let (mut t, d) = load_pair(&draft_dir, &target_dir);
    let mut d = Recording {
        inner: d,
        offers: vec![],
    };
    let prompt = prompt_for(&target_dir, t.cfg.vocab_size);
    let k = 3;

    // Two greedy sequences, the second one prefilled in chunks: steps that still carry a prefill
    // chunk are not offered, steps where both decode are offered with both states.
    let mut a = SpecState::new(&mut t, &mut d, &prompt, k, SamplingParams::greedy()).unwrap();
    let mut b = SpecState::new(&mut t, &mut d, &prompt, k, SamplingParams::greedy()).unwrap();
    b.prefill_chunk = 4;
    let mut steps_all_decoding = 0;
    let mut toks_a = vec![];
    for _ in 0..12 {
        let both = a.is_prefilled() && b.is_prefilled();
        let before = d.offers.len();
        let r = step(&mut t, &mut d, &mut [&mut a, &mut b]).unwrap();
        toks_a.extend(r[0].tokens.clone());
        if both {
            steps_all_decoding += 1;
            assert_eq!(
                d.offers.len(),
                before + 1,
                "a greedy decode batch must be offered"
            );
            assert_eq!(*d.offers.last().unwrap(), 2);
        } else {
            assert_eq!(
                d.offers.len(),
                before,
                "a step with a prefill chunk must not be offered"
            );
        }
    }
    assert!(steps_all_decoding > 0);

    // Declining changes nothing: sequence a's tokens equal plain greedy decoding.
    let req = GenerateRequest {
        prompt: prompt.clone(),
        max_tokens: toks_a.len(),
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        stop_token_ids: vec![],
    };
    let plain = generate(&mut t, &req, false).unwrap();
    assert_eq!(toks_a, plain.completion);
    a.free(&mut t, &mut d);
    b.free(&mut t, &mut d);

    // Forced drafts and sampled requests are never offered.
    let mut f = SpecState::new(&mut t, &mut d, &prompt, k, SamplingParams::greedy()).unwrap();
    step(&mut t, &mut d, &mut [&mut f]).unwrap();
    let before = d.offers.len();
    f.force_next_drafts(vec![1; k]);
    step(&mut t, &mut d, &mut [&mut f]).unwrap();
    assert_eq!(
        d.offers.len(),
        before,
        "forced drafts must take the generic step"
    );
    step(&mut t, &mut d, &mut [&mut f]).unwrap();
    assert_eq!(d.offers.len(), before + 1);
    f.free(&mut t, &mut d);

    let sampled = SamplingParams {
        temperature: 0.8,
        top_k: 0,
        top_p: 1.0,
        seed: Some(7),
    };
    let mut s = SpecState::new(&mut t, &mut d, &prompt, k, sampled).unwrap();
    let before = d.offers.len();
    for _ in 0..4 {
        step(&mut t, &mut d, &mut [&mut s]).unwrap();
    }
    assert_eq!(
        d.offers.len(),
        before,
        "sampled requests must take the generic step"
    );
    s.free(&mut t, &mut d);
}
