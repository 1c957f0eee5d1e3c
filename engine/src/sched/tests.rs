//! Scheduler tests over a tiny deterministic fake model (logits are a hash of the KV prefix), so
//! batching, chunked prefill, cancellation and the spec hook can be checked quickly.
use super::*;
use crate::config::LagunaConfig;
use crate::generate::{generate, GenerateRequest};
use crate::model::{LogitRows, SeqId, StepInput, StepOutput};
use crate::sample::SamplingParams;
use std::collections::HashMap;
use std::time::Duration;

const VOCAB: usize = 64;

struct Toy {
    cfg: LagunaConfig,
    /// Most token rows one forward may carry (the scheduler's max_num_batched_tokens).
    max_rows: usize,
    /// Panic when this token is fed (engine-failure test).
    panic_on: Option<u32>,
    seqs: HashMap<SeqId, Vec<u32>>,
    next: SeqId,
    live: Arc<AtomicUsize>,
    /// Pretend to sample on the device (`decode_step`) for up to this many sequences.
    device_rows: usize,
    /// decode_step calls so far.
    device_steps: Arc<AtomicUsize>,
    /// Pipeline decode steps (`decode_launch` / `decode_collect`).
    pipelined: bool,
    /// Tokens of the last launched step (what `DecodeItem::prev` names) and the launched steps'
    /// tokens not yet collected.
    fed: Option<Vec<u32>>,
    queued: std::collections::VecDeque<Vec<u32>>,
    /// decode_launch calls whose items were fed on the "device" (prev set).
    ahead_steps: Arc<AtomicUsize>,
}

fn toy_cfg() -> LagunaConfig {
    LagunaConfig::from_json_str(&format!(
        r#"{{"model_type":"laguna","num_hidden_layers":1,"vocab_size":{VOCAB},"eos_token_id":[2]}}"#
    ))
    .unwrap()
}

fn toy() -> (Toy, Arc<AtomicUsize>) {
    let live = Arc::new(AtomicUsize::new(0));
    (
        Toy {
            cfg: toy_cfg(),
            max_rows: usize::MAX,
            panic_on: None,
            seqs: HashMap::new(),
            next: 1,
            live: live.clone(),
            device_rows: 0,
            device_steps: Arc::new(AtomicUsize::new(0)),
            pipelined: false,
            fed: None,
            queued: Default::default(),
            ahead_steps: Arc::new(AtomicUsize::new(0)),
        },
        live,
    )
}

fn logits_for(prefix: &[u32]) -> Vec<f32> {
    let mut h: u64 = 1469598103934665603;
    for &t in prefix {
        h = (h ^ t as u64).wrapping_mul(1099511628211);
    }
    (0..VOCAB)
        .map(|v| {
            let x = (h ^ (v as u64 + 1).wrapping_mul(0x9E3779B97F4A7C15))
                .wrapping_mul(0xBF58476D1CE4E5B9);
            let x = x ^ (x >> 31);
            // Token 2 (EOS) is unlikely so sequences run a while.
            (x >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - if v == 2 { 6.0 } else { 0.0 }
        })
        .collect()
}

impl Model for Toy {
    fn config(&self) -> &LagunaConfig {
        &self.cfg
    }
    fn device(&self) -> &str {
        "toy"
    }
    fn new_seq(&mut self) -> Result<SeqId> {
        let id = self.next;
        self.next += 1;
        self.seqs.insert(id, vec![]);
        self.live.fetch_add(1, Ordering::SeqCst);
        Ok(id)
    }
    fn free_seq(&mut self, seq: SeqId) {
        if self.seqs.remove(&seq).is_some() {
            self.live.fetch_sub(1, Ordering::SeqCst);
        }
    }
    fn seq_len(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.len())
    }
    fn truncate(&mut self, seq: SeqId, len: usize) {
        if let Some(s) = self.seqs.get_mut(&seq) {
            s.truncate(len);
        }
    }
    fn set_taps(&mut self, _layers: &[usize]) {}
    fn device_sampling(&self) -> usize {
        self.device_rows
    }
    fn decode_step(&mut self, items: &[crate::model::DecodeItem]) -> Result<Vec<u32>> {
        assert!(items.len() <= self.device_rows);
        self.device_steps.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_micros(300));
        let mut out = vec![];
        for it in items {
            let kv = self.seqs.get_mut(&it.seq).expect("unknown seq");
            kv.push(it.token);
            out.push(crate::sample::sample_u(&logits_for(kv), it.params, it.u));
        }
        Ok(out)
    }
    fn decode_pipelined(&self) -> bool {
        self.pipelined
    }
    fn decode_launch(&mut self, items: &[crate::model::DecodeItem]) -> Result<()> {
        assert!(self.pipelined);
        assert!(self.queued.len() < 2, "at most two steps queued");
        let fed = self.fed.take();
        let mut feed = vec![];
        for it in items {
            feed.push(crate::model::DecodeItem {
                token: match it.prev {
                    Some(j) => fed.as_ref().expect("prev without a launched step")[j],
                    None => it.token,
                },
                prev: None,
                ..it.clone()
            });
        }
        if items.iter().any(|it| it.prev.is_some()) {
            self.ahead_steps.fetch_add(1, Ordering::SeqCst);
        }
        let out = self.decode_step(&feed)?;
        self.fed = Some(out.clone());
        self.queued.push_back(out);
        Ok(())
    }
    fn decode_collect(&mut self) -> Result<Vec<u32>> {
        Ok(self
            .queued
            .pop_front()
            .expect("collect with nothing launched"))
    }
    fn forward(&mut self, batch: &[StepInput]) -> Result<Vec<StepOutput>> {
        assert!(
            self.queued.is_empty(),
            "forward with a decode step in flight"
        );
        self.fed = None;
        // Slow enough that requests overlap in the scheduler.
        std::thread::sleep(Duration::from_micros(300));
        let rows: usize = batch.iter().map(|b| b.tokens.len()).sum();
        if let Some(p) = self.panic_on {
            assert!(
                !batch.iter().any(|b| b.tokens.contains(&p)),
                "fake model failure"
            );
        }
        assert!(
            rows <= self.max_rows,
            "a step carried {rows} rows, over the budget {}",
            self.max_rows
        );
        let mut outs = vec![];
        for b in batch {
            let kv = self.seqs.get_mut(&b.seq).expect("unknown seq");
            assert_eq!(kv.len(), b.start_pos, "start_pos must equal the KV length");
            let mut logits = vec![];
            let n = b.tokens.len();
            for (i, &t) in b.tokens.iter().enumerate() {
                kv.push(t);
                let want = match b.logits {
                    LogitRows::None => false,
                    LogitRows::Last => i + 1 == n,
                    LogitRows::All => true,
                };
                if want {
                    logits.extend(logits_for(kv));
                }
            }
            let rows = logits.len() / VOCAB;
            outs.push(StepOutput {
                logits,
                rows,
                taps: vec![],
            });
        }
        Ok(outs)
    }
}

fn alone(prompt: &[u32], max_tokens: usize, sampling: SamplingParams) -> Vec<u32> {
    let (mut m, _) = toy();
    let req = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        sampling,
        ignore_eos: false,
        stop_token_ids: vec![],
    };
    generate(&mut m, &req, false).unwrap().completion
}

async fn collect(mut s: RequestStream) -> (Vec<u32>, FinishReason, Option<StopReason>, Usage) {
    let mut ids = vec![];
    while let Some(ev) = s.next().await {
        match ev {
            Event::Delta { ids: d, .. } => ids.extend(d),
            Event::Finished {
                reason,
                stop_reason,
                usage,
            } => return (ids, reason, stop_reason, usage),
            Event::Error(e) => panic!("{e}"),
        }
    }
    panic!("stream ended without Finished")
}

fn cfg(seqs: usize, tokens: usize) -> SchedConfig {
    SchedConfig {
        max_num_seqs: seqs,
        max_num_batched_tokens: tokens,
        max_model_len: 256,
        max_waiting: 0,
        ..SchedConfig::default()
    }
}

fn prompts(n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            (0..(3 + i * 5 % 17))
                .map(|j| ((i * 7 + j * 3) % 60 + 3) as u32)
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_outputs_equal_alone_greedy_and_seeded() {
    let (mut m, live) = toy();
    m.max_rows = 7;
    let s = Arc::new(Scheduler::start(cfg(3, 7), Loaded::plain(Box::new(m)), None).unwrap());
    let ps = prompts(10);
    let mut tasks = vec![];
    for (i, p) in ps.iter().enumerate() {
        let sampling = if i % 2 == 0 {
            SamplingParams::greedy()
        } else {
            SamplingParams {
                temperature: 0.9,
                top_k: 20,
                top_p: 0.9,
                seed: Some(i as u64),
            }
        };
        let mut req = GenRequest::greedy(p.clone(), 12);
        req.sampling = sampling.clone();
        let stream = s.submit(req).unwrap();
        tasks.push((p.clone(), sampling, tokio::spawn(collect(stream))));
    }
    for (p, sampling, t) in tasks {
        let (ids, reason, _, usage) = t.await.unwrap();
        let want = alone(&p, 12, sampling);
        assert_eq!(ids, want, "prompt {p:?}");
        assert_eq!(usage.prompt_tokens, p.len());
        assert_eq!(usage.completion_tokens, ids.len());
        assert_eq!(
            reason,
            if ids.len() == 12 && *ids.last().unwrap() != 2 {
                FinishReason::Length
            } else {
                FinishReason::Stop
            }
        );
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let m = s.metrics();
    assert_eq!(m.num_running, 0);
    assert_eq!(m.num_waiting, 0);
    assert!(
        m.max_batch_seqs_seen > 1 && m.max_batch_seqs_seen <= 3,
        "{}",
        m.max_batch_seqs_seen
    );
    assert_eq!(
        m.prompt_tokens_total as usize,
        ps.iter().map(|p| p.len()).sum::<usize>()
    );
    assert_eq!(live.load(Ordering::SeqCst), 0, "all KV freed");
}

/// A backend that samples on the device (`decode_step`, handed the uniform the scheduler drew
/// from the sequence's Rng) gives exactly the host-sampled outputs, batched or alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_sampling_steps_equal_host_sampling() {
    // (decode_step capacity, max running sequences): one call per step, then steps split into
    // calls of 2 + 2 + 1 sequences.
    for (rows, seqs) in [(3, 3), (2, 5)] {
        device_sampling_case(rows, seqs, false).await;
    }
}

/// A backend that pipelines decode steps (the next launched before the last one's tokens are
/// read, fed on the device) gives the same outputs too, with sequences finishing by EOS, stop
/// tokens, length and joining mid-run; every KV freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_decode_steps_equal_host_sampling() {
    for (rows, seqs) in [(3, 3), (8, 8), (1, 1)] {
        device_sampling_case(rows, seqs, true).await;
    }
}

async fn device_sampling_case(rows: usize, seqs: usize, pipelined: bool) {
    let (mut m, live) = toy();
    m.device_rows = rows;
    m.pipelined = pipelined;
    let ahead = m.ahead_steps.clone();
    let steps = m.device_steps.clone();
    let s = Arc::new(Scheduler::start(cfg(seqs, 64), Loaded::plain(Box::new(m)), None).unwrap());
    let ps = prompts(8);
    let mut tasks = vec![];
    for (i, p) in ps.iter().enumerate() {
        let sampling = if i % 3 == 0 {
            SamplingParams::greedy()
        } else {
            SamplingParams {
                temperature: 0.7 + 0.2 * (i % 2) as f32,
                top_k: if i % 2 == 0 { 0 } else { 10 },
                top_p: 0.85,
                seed: Some(100 + i as u64),
            }
        };
        // Lengths 16 and 5..; every fourth request also stops on its 7th greedy token.
        let max_tokens = if i % 2 == 0 { 16 } else { 5 + i };
        let mut req = GenRequest::greedy(p.clone(), max_tokens);
        req.sampling = sampling.clone();
        let mut want = alone(&p, max_tokens, sampling.clone());
        if i % 4 == 3 && want.len() > 7 {
            req.stop_token_ids = vec![want[6]];
            let cut = want.iter().position(|&t| t == want[6]).unwrap();
            want.truncate(cut + 1);
        }
        let stream = s.submit(req).unwrap();
        tasks.push((p.clone(), want, tokio::spawn(collect(stream))));
    }
    for (p, want, t) in tasks {
        let (ids, _, _, _) = t.await.unwrap();
        assert_eq!(ids, want, "prompt {p:?}");
    }
    assert!(steps.load(Ordering::SeqCst) > 0, "decode_step was used");
    if pipelined {
        assert!(
            ahead.load(Ordering::SeqCst) > 0,
            "steps were fed on the device"
        );
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(live.load(Ordering::SeqCst), 0, "all KV freed");
    // generate takes the device path too and matches, up to a stop token and to the length.
    for (max_tokens, stop) in [(16, false), (16, true), (1, false), (2, false)] {
        generate_case(pipelined, &ps[1], max_tokens, stop);
    }
}

fn generate_case(pipelined: bool, prompt: &[u32], max_tokens: usize, stop: bool) {
    let (mut m, live) = toy();
    m.device_rows = 1;
    m.pipelined = pipelined;
    let steps = m.device_steps.clone();
    let sampling = SamplingParams {
        temperature: 1.1,
        top_k: 0,
        top_p: 0.9,
        seed: Some(5),
    };
    let mut want = alone(prompt, max_tokens, sampling.clone());
    let mut req = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        sampling: sampling.clone(),
        ignore_eos: false,
        stop_token_ids: vec![],
    };
    if stop {
        req.stop_token_ids = vec![want[5]];
        let cut = want.iter().position(|&t| t == want[5]).unwrap();
        want.truncate(cut + 1);
    }
    let got = generate(&mut m, &req, false).unwrap();
    assert_eq!(got.completion, want, "max_tokens {max_tokens}, stop {stop}");
    assert_eq!(
        got.finish_reason,
        if stop || want.len() < max_tokens {
            crate::generate::FinishReason::Stop
        } else {
            crate::generate::FinishReason::Length
        }
    );
    assert!(steps.load(Ordering::SeqCst) > 0 || max_tokens == 1);
    assert!(m.queued.is_empty(), "every launched step collected");
    drop(m);
    assert_eq!(live.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_stream_frees_the_sequence() {
    dropping_case(false).await;
    dropping_case(true).await;
}

/// pipelined: the toy samples on the "device" and pipelines its decode steps, so the client goes
/// away while a step for its sequence is in flight.
async fn dropping_case(pipelined: bool) {
    let (mut m, live) = toy();
    if pipelined {
        m.device_rows = 4;
        m.pipelined = true;
    }
    let s = Scheduler::start(cfg(4, 64), Loaded::plain(Box::new(m)), None).unwrap();
    let mut req = GenRequest::greedy(vec![5, 6, 7], 200);
    req.ignore_eos = true;
    let mut st = s.submit(req).unwrap();
    let first = st.next().await.unwrap();
    assert!(matches!(first, Event::Delta { .. }));
    assert_eq!(live.load(Ordering::SeqCst), 1);
    drop(st);
    for _ in 0..200 {
        if live.load(Ordering::SeqCst) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(live.load(Ordering::SeqCst), 0);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let m = s.metrics();
    assert_eq!(m.num_running, 0);
    assert_eq!(m.request_success["abort"], 1);
}

#[tokio::test]
async fn stop_token_ids_and_limits() {
    let p = vec![9, 10, 11];
    let want = alone(&p, 20, SamplingParams::greedy());
    let stop = want[3];
    let cut = want.iter().position(|&t| t == stop).unwrap();
    let (m, _) = toy();
    let s = Scheduler::start(cfg(2, 16), Loaded::plain(Box::new(m)), None).unwrap();
    let mut req = GenRequest::greedy(p.clone(), 20);
    req.stop_token_ids = vec![stop];
    let (ids, reason, sr, _) = collect(s.submit(req).unwrap()).await;
    assert_eq!(ids, want[..=cut].to_vec());
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(sr, Some(StopReason::TokenId(stop)));
    let e = s.submit(GenRequest::greedy(p.clone(), 254)).err().unwrap();
    assert!(
        matches!(e, SubmitError::Invalid(ref m) if m.contains("max_model_len")),
        "{e:?}"
    );
    assert!(matches!(
        s.submit(GenRequest::greedy(vec![], 2)),
        Err(SubmitError::Invalid(_))
    ));
    assert!(matches!(
        s.submit(GenRequest::greedy(vec![1000], 2)),
        Err(SubmitError::Invalid(_))
    ));
}

/// Proposes the true greedy continuation, except every third draft is wrong.
struct Oracle {
    k: usize,
    calls: usize,
}

impl SpecDriver for Oracle {
    fn max_draft(&self) -> usize {
        self.k
    }
    fn propose(&mut self, _seq: SeqId, tokens: &[u32]) -> Vec<u32> {
        let mut ctx = tokens.to_vec();
        let mut out = vec![];
        for j in 0..self.k {
            self.calls += 1;
            let t = crate::sample::argmax(&logits_for(&ctx)) as u32;
            let t = if (self.calls + j).is_multiple_of(3) {
                (t + 1) % VOCAB as u32
            } else {
                t
            };
            out.push(t);
            ctx.push(t);
        }
        out
    }
    fn observe(&mut self, _seq: SeqId, _start: usize, _taps: &[f32], _kept: usize) {}
    fn free_seq(&mut self, _seq: SeqId) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_driver_emits_several_tokens_per_step_with_identical_output() {
    let (m, live) = toy();
    let s = Scheduler::start(
        cfg(4, 64),
        Loaded {
            model: Box::new(m),
            spec: Some(Box::new(Oracle { k: 3, calls: 0 })),
            dflash: None,
        },
        None,
    )
    .unwrap();
    let ps = prompts(4);
    let mut tasks = vec![];
    for p in &ps {
        tasks.push((
            p.clone(),
            tokio::spawn(collect(
                s.submit(GenRequest::greedy(p.clone(), 15)).unwrap(),
            )),
        ));
    }
    for (p, t) in tasks {
        let (ids, _, _, usage) = t.await.unwrap();
        assert_eq!(ids, alone(&p, 15, SamplingParams::greedy()));
        assert_eq!(usage.completion_tokens, ids.len());
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    let m = s.metrics();
    assert!(m.spec_num_drafts > 0);
    assert!(m.spec_num_accepted_tokens > 0 && m.spec_num_accepted_tokens < m.spec_num_draft_tokens);
    assert_eq!(
        m.spec_accepted_per_pos.iter().sum::<u64>(),
        m.spec_num_accepted_tokens
    );
    assert!(
        m.generation_tokens_total > m.num_steps,
        "several tokens per step"
    );
    assert_eq!(live.load(Ordering::SeqCst), 0);
}

/// DFlash through the scheduler (CPU target + CPU draft fixtures): batched, chunk-prefilled
/// speculative decoding gives the plain greedy tokens, several per step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dflash_batched_equals_plain_greedy() {
    dflash_batched(false).await;
}

/// The same with adaptive k (`Dflash::costs`, a step-time table measured on this CPU): plain
/// greedy tokens, and the chosen k on the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dflash_adaptive_k_equals_plain_greedy() {
    dflash_batched(true).await;
}

async fn dflash_batched(adaptive: bool) {
    use crate::cpu::CpuModel;
    use crate::spec::CpuDraft;
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures"));
    let (tdir, ddir) = (
        root.join("models/swa-yarn-perhead"),
        root.join("drafts/swa-yarn-perhead-causal-w8"),
    );
    if !tdir.join("config.json").exists() || !ddir.join("config.json").exists() {
        eprintln!("skipping: DFlash fixtures missing");
        return;
    }
    let mut target = CpuModel::load(&tdir).unwrap();
    let mut draft = CpuDraft::load(&ddir, &target).unwrap();
    let vocab = target.cfg.vocab_size as u32;
    let mut plain = CpuModel::load(&tdir).unwrap();
    let k = 3;
    let costs = adaptive.then(|| {
        std::sync::Arc::new(
            crate::spec::StepCosts::measure(&mut target, &mut draft, k, &[1, 2], 8, 1, 2).unwrap(),
        )
    });
    let cfg = SchedConfig {
        max_num_seqs: 3,
        max_num_batched_tokens: 12,
        max_model_len: 256,
        max_waiting: 0,
        ..SchedConfig::default()
    };
    let loaded = Loaded {
        model: Box::new(target),
        spec: None,
        dflash: Some(Dflash {
            draft: Box::new(draft),
            k,
            costs,
        }),
    };
    let s = Scheduler::start(cfg, loaded, None).unwrap();
    let prompts: Vec<Vec<u32>> = (0..5)
        .map(|i| {
            (0..(6 + 3 * i))
                .map(|j| ((i * 31 + j * 7 + 3) as u32) % vocab)
                .collect()
        })
        .collect();
    let mut tasks = vec![];
    for p in &prompts {
        let mut req = GenRequest::greedy(p.clone(), 20);
        req.ignore_eos = true;
        tasks.push((p.clone(), tokio::spawn(collect(s.submit(req).unwrap()))));
    }
    for (p, t) in tasks {
        let (ids, reason, _, usage) = t.await.unwrap();
        let req = GenerateRequest {
            prompt: p.clone(),
            max_tokens: 20,
            sampling: SamplingParams::greedy(),
            ignore_eos: true,
            stop_token_ids: vec![],
        };
        let want = generate(&mut plain, &req, false).unwrap().completion;
        assert_eq!(ids, want, "prompt {p:?}");
        assert_eq!(
            (reason, usage.completion_tokens),
            (FinishReason::Length, 20)
        );
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    let m = s.metrics();
    assert!(
        m.spec_num_drafts > 0 && m.spec_num_draft_tokens > 0,
        "{m:?}"
    );
    assert_eq!(
        m.spec_accepted_per_pos.iter().sum::<u64>(),
        m.spec_num_accepted_tokens
    );
    assert_eq!(m.num_running, 0);
    assert!(
        m.spec_k_steps.iter().sum::<u64>() > 0 && m.spec_k_steps.len() <= k + 1,
        "{m:?}"
    );
    eprintln!(
        "dflash (adaptive {adaptive}, steps by k {:?}): {} steps for {} tokens, accepted {}/{}",
        m.spec_k_steps,
        m.num_steps,
        m.generation_tokens_total,
        m.spec_num_accepted_tokens,
        m.spec_num_draft_tokens
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_panic_fails_requests_and_health() {
    let (mut m, _) = toy();
    m.panic_on = Some(13);
    let s = Scheduler::start(cfg(2, 16), Loaded::plain(Box::new(m)), None).unwrap();
    let mut st = s.submit(GenRequest::greedy(vec![5, 13], 4)).unwrap();
    assert!(matches!(st.next().await, Some(Event::Error(_))));
    for _ in 0..200 {
        if s.health() != Health::Ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(matches!(s.health(), Health::Failed(_)));
    assert!(matches!(
        s.submit(GenRequest::greedy(vec![5], 2)),
        Err(SubmitError::Dead(_))
    ));
    let _ = s.metrics(); // not poisoned
}

/// Constrained decoding with a DFlash draft (CPU fixtures, the tiny-chat tokenizer over the
/// target's 384 ids): the greedy tokens are those of the same requests without the draft, and
/// they are JSON that satisfies the schema (drafts the grammar forbids are rejected).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dflash_constrained_equals_plain() {
    use crate::cpu::CpuModel;
    use crate::grammar::GrammarEnv;
    use crate::spec::CpuDraft;
    use crate::tokenizer::Tokenizer;
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures"));
    let (tdir, ddir, kdir) = (
        root.join("models/swa-yarn-perhead"),
        root.join("drafts/swa-yarn-perhead-causal-w8"),
        root.join("models/tiny-chat"),
    );
    let Ok(Some(tok)) = Tokenizer::from_dir(&kdir) else {
        eprintln!("skipping: tokenizer fixture missing");
        return;
    };
    if !tdir.join("config.json").exists() || !ddir.join("config.json").exists() {
        eprintln!("skipping: DFlash fixtures missing");
        return;
    }
    let target = CpuModel::load(&tdir).unwrap();
    let c = target.cfg.clone();
    let env = GrammarEnv::new(&tok, c.vocab_size, &c.eos_token_ids).unwrap();
    let draft = CpuDraft::load(&ddir, &target).unwrap();
    let lark = r#"start: %json {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999}, "b": {"type": "array", "items": {"type": "boolean"}, "maxItems": 4}}, "required": ["a", "b"], "additionalProperties": false, "x-guidance": {"whitespace_pattern": "[ ]{1,2}"}}"#;
    let sc = SchedConfig {
        max_num_seqs: 3,
        max_num_batched_tokens: 12,
        max_model_len: 256,
        max_waiting: 0,
        ..SchedConfig::default()
    };
    let with = Scheduler::start(
        sc.clone(),
        Loaded {
            model: Box::new(target),
            spec: None,
            dflash: Some(Dflash {
                draft: Box::new(draft),
                k: 3,
                costs: None,
            }),
        },
        None,
    )
    .unwrap();
    let without = Scheduler::start(
        sc,
        Loaded::plain(Box::new(CpuModel::load(&tdir).unwrap())),
        None,
    )
    .unwrap();
    let vocab = c.vocab_size as u32;
    for i in 0..4u32 {
        let p: Vec<u32> = (0..(5 + 3 * i))
            .map(|j| (i * 31 + j * 7 + 3) % vocab)
            .collect();
        let mut outs = vec![];
        for s in [&with, &without] {
            let mut req = GenRequest::greedy(p.clone(), 120);
            req.constraint = Some(env.compile(lark).unwrap());
            outs.push(collect(s.submit(req).unwrap()).await);
        }
        assert_eq!(outs[0].0, outs[1].0, "prompt {p:?}");
        let (ids, reason, _, _) = &outs[0];
        assert_eq!(*reason, FinishReason::Stop, "{ids:?}");
        let text = tok.decode(ids, true).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!((0..=999).contains(&v["a"].as_i64().unwrap()), "{text}");
        let b = v["b"].as_array().unwrap();
        assert!(b.len() <= 4 && b.iter().all(|x| x.is_boolean()), "{text}");
        assert_eq!(v.as_object().unwrap().len(), 2, "{text}");
    }
    let m = with.metrics();
    assert!(m.spec_num_drafts > 0, "{m:?}");
    eprintln!(
        "constrained dflash: accepted {}/{} drafts",
        m.spec_num_accepted_tokens, m.spec_num_draft_tokens
    );
}
