//! The prefix cache on the CPU reference (tiny fixtures in tests/fixtures): every scenario runs
//! on a scheduler with the cache and on one without, and must give the same tokens (and logprobs
//! within 1e-5), greedy and seeded, with and without a DFlash draft. The cached-token counts are
//! checked against what the snapshot policy (prompt end, output end, every N prompt tokens)
//! allows.
use super::*;
use crate::cpu::CpuModel;
use crate::model::{LogitRows, Model, StepInput};
use crate::sample::SamplingParams;
use crate::spec::CpuDraft;
use std::path::Path;

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");
/// Target window 8 (2 of 4 layers), causal draft with window 8: snapshots carry both rings.
const SWA: (&str, &str) = (
    "models/swa-yarn-perhead",
    "drafts/swa-yarn-perhead-causal-w8",
);
/// Target window 6, non-causal draft with full attention: the draft's context goes in blocks.
const DENSE: (&str, &str) = (
    "models/perelement-softcap-dense1",
    "drafts/perelement-softcap-dense1-noncausal",
);

#[derive(Clone, Copy)]
struct Setup {
    pair: (&'static str, &'static str),
    draft: bool,
    cache: bool,
    block: usize,
    /// Blocks the exports may hold (per store).
    budget: usize,
    every: usize,
}

impl Setup {
    fn new(pair: (&'static str, &'static str), draft: bool) -> Setup {
        Setup {
            pair,
            draft,
            cache: true,
            block: 4,
            budget: 1 << 20,
            every: 4,
        }
    }
    fn off(self) -> Setup {
        Setup {
            cache: false,
            ..self
        }
    }
}

fn present(pair: (&str, &str)) -> bool {
    let ok = Path::new(FIX).join(pair.0).join("config.json").exists()
        && Path::new(FIX).join(pair.1).join("config.json").exists();
    if !ok {
        eprintln!("skipping: fixtures {pair:?} missing");
    }
    ok
}

fn start(s: Setup) -> Scheduler {
    let root = Path::new(FIX);
    let mut t = CpuModel::load(&root.join(s.pair.0)).unwrap();
    t.set_prefix_cache(s.block, s.budget);
    let max_len = t.cfg.max_position_embeddings;
    let dflash = s.draft.then(|| {
        let mut d = CpuDraft::load(&root.join(s.pair.1), &t).unwrap();
        d.set_prefix_cache(s.block, s.budget);
        Dflash {
            draft: Box::new(d),
            k: 3,
            costs: None,
        }
    });
    let cfg = SchedConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 16,
        max_model_len: max_len,
        max_waiting: 0,
        prefix_cache: s.cache,
        prefix_snapshot_every: s.every,
    };
    let loaded = Loaded {
        model: Box::new(t),
        spec: None,
        dflash,
    };
    Scheduler::start(cfg, loaded, None).unwrap()
}

#[derive(Debug, Clone)]
struct Out {
    prompt: Vec<u32>,
    ids: Vec<u32>,
    lps: Vec<TokenLogprob>,
    cached: usize,
}

fn sampling(seeded: bool, i: u64) -> SamplingParams {
    if seeded {
        SamplingParams {
            temperature: 0.9,
            top_k: 0,
            top_p: 1.0,
            seed: Some(1000 + i),
        }
    } else {
        SamplingParams::greedy()
    }
}

fn request(prompt: &[u32], max: usize, sp: SamplingParams) -> GenRequest {
    let mut req = GenRequest::greedy(prompt.to_vec(), max);
    req.sampling = sp;
    req.ignore_eos = true;
    req.logprobs = Some(4);
    req
}

async fn drain(prompt: Vec<u32>, mut st: RequestStream) -> Out {
    let mut ids = vec![];
    let mut lps = vec![];
    while let Some(ev) = st.next().await {
        match ev {
            Event::Delta {
                ids: d,
                logprobs: l,
                ..
            } => {
                ids.extend(d);
                lps.extend(l);
            }
            Event::Finished { usage, .. } => {
                return Out {
                    prompt,
                    ids,
                    lps,
                    cached: usage.cached_tokens,
                }
            }
            Event::Error(e) => panic!("{e}"),
        }
    }
    panic!("stream ended without Finished")
}

async fn ask(s: &Scheduler, prompt: Vec<u32>, max: usize, sp: SamplingParams) -> Out {
    let st = s.submit(request(&prompt, max, sp)).unwrap();
    drain(prompt, st).await
}

/// Submit all at once; outputs in the prompts' order.
async fn ask_all(s: &Scheduler, prompts: Vec<Vec<u32>>, max: usize, seeded: bool) -> Vec<Out> {
    let streams: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            s.submit(request(p, max, sampling(seeded, i as u64)))
                .unwrap()
        })
        .collect();
    let mut outs = vec![];
    for (p, st) in prompts.into_iter().zip(streams) {
        outs.push(drain(p, st).await);
    }
    outs
}

/// Token ids in the fixtures' vocabularies (>= 320), away from the mask id 12 and EOS.
fn toks(seed: usize, n: usize) -> Vec<u32> {
    (0..n)
        .map(|j| ((seed * 37 + j * 11) % 290 + 20) as u32)
        .collect()
}

fn assert_same(cached: &[Out], cold: &[Out], what: &str) {
    assert_eq!(cached.len(), cold.len());
    for (i, (a, b)) in cached.iter().zip(cold).enumerate() {
        assert_eq!(a.prompt, b.prompt, "{what}: request {i} prompt");
        assert_eq!(a.ids, b.ids, "{what}: request {i} tokens");
        assert_eq!(a.lps.len(), b.lps.len(), "{what}: request {i} logprobs");
        for (x, y) in a.lps.iter().zip(&b.lps) {
            assert_eq!(x.id, y.id);
            assert!(
                (x.logprob - y.logprob).abs() <= 1e-5,
                "{what}: {x:?} vs {y:?}"
            );
            assert_eq!(x.top.len(), y.top.len());
            for (p, q) in x.top.iter().zip(&y.top) {
                assert_eq!(p.0, q.0, "{what}: top ids");
                assert!((p.1 - q.1).abs() <= 1e-5, "{what}: {p:?} vs {q:?}");
            }
        }
        assert_eq!(b.cached, 0, "{what}: the cold run reports no cached tokens");
    }
}

/// Three agent turns: each prompt is the previous prompt, its output (the last turn's with its
/// last two tokens re-rendered differently, as a client may send it back) and a new message.
async fn multi_turn(s: &Scheduler, seeded: bool) -> Vec<Out> {
    let mut prompt = toks(1, 14);
    let mut outs = vec![];
    for turn in 0..3u64 {
        let o = ask(s, prompt.clone(), 7, sampling(seeded, turn)).await;
        prompt.extend_from_slice(&o.ids);
        if turn == 1 {
            let n = prompt.len();
            prompt[n - 2..].copy_from_slice(&[31, 32]);
        }
        prompt.extend(toks(10 + turn as usize, 5 + turn as usize));
        outs.push(o);
    }
    outs
}

/// Sessions sharing a 13-token system prompt, three at once, then three more.
async fn shared_system(s: &Scheduler, seeded: bool) -> Vec<Out> {
    let sys = toks(2, 13);
    let mut outs = vec![];
    for wave in 0..2 {
        let prompts = (0..3)
            .map(|i| [sys.clone(), toks(20 + wave * 3 + i, 2 + 3 * i)].concat())
            .collect();
        outs.extend(ask_all(s, prompts, 6, seeded).await);
    }
    outs
}

/// Two continuations of one conversation at once: after the full output, and after part of it.
async fn branching(s: &Scheduler, seeded: bool) -> Vec<Out> {
    let base = toks(3, 11);
    let first = ask(s, base.clone(), 8, sampling(seeded, 7)).await;
    let a = [base.clone(), first.ids.clone(), toks(30, 4)].concat();
    let b = [base.clone(), first.ids[..3].to_vec(), toks(31, 6)].concat();
    let mut outs = vec![first];
    outs.extend(ask_all(s, vec![a, b], 6, seeded).await);
    outs
}

async fn compare(setup: Setup, scenario: &str, seeded: bool) -> Vec<Out> {
    let run = |s: Scheduler| async move {
        let outs = match scenario {
            "multi_turn" => multi_turn(&s, seeded).await,
            "shared_system" => shared_system(&s, seeded).await,
            "branching" => branching(&s, seeded).await,
            _ => unreachable!(),
        };
        (outs, s.metrics())
    };
    let (warm, m) = run(start(setup)).await;
    let (cold, _) = run(start(setup.off())).await;
    let what = format!(
        "{scenario} ({}, draft {}, seeded {seeded}, budget {})",
        setup.pair.0, setup.draft, setup.budget
    );
    assert_same(&warm, &cold, &what);
    let hits: usize = warm.iter().map(|o| o.cached).sum();
    let asked: usize = warm.iter().map(|o| o.prompt.len()).sum();
    assert_eq!(m.prefix_cache_hits, hits as u64, "{what}");
    assert_eq!(m.prefix_cache_queries, asked as u64, "{what}");
    warm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_equals_cold_and_reuses_each_turn() {
    for pair in [SWA, DENSE] {
        if !present(pair) {
            return;
        }
        for draft in [false, true] {
            for seeded in [false, true] {
                let warm = compare(Setup::new(pair, draft), "multi_turn", seeded).await;
                // Turn 2 resumes at turn 1's output end (its whole prompt), turn 3 at turn 2's
                // prompt end (the re-rendered tokens come after it).
                let t1 = warm[0].prompt.len() + warm[0].ids.len() - 1;
                assert_eq!(warm[1].cached, t1, "{pair:?} draft {draft}");
                assert_eq!(
                    warm[2].cached,
                    warm[1].prompt.len(),
                    "{pair:?} draft {draft}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sessions_share_a_system_prompt() {
    for pair in [SWA, DENSE] {
        if !present(pair) {
            return;
        }
        for draft in [false, true] {
            for seeded in [false, true] {
                let warm = compare(Setup::new(pair, draft), "shared_system", seeded).await;
                // The second wave finds at least the system prompt's snapshots (every 4: 12).
                for o in &warm[3..] {
                    assert!(o.cached >= 12, "{pair:?} draft {draft}: {}", o.cached);
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branches_of_one_prefix_equal_cold() {
    for pair in [SWA, DENSE] {
        if !present(pair) {
            return;
        }
        for draft in [false, true] {
            for seeded in [false, true] {
                let warm = compare(Setup::new(pair, draft), "branching", seeded).await;
                let end = warm[0].prompt.len() + warm[0].ids.len() - 1;
                assert_eq!(warm[1].cached, end, "branch after the whole output");
                // The other branch leaves the first output after 3 tokens: the prompt's end.
                assert_eq!(
                    warm[2].cached,
                    warm[0].prompt.len(),
                    "branch inside the output"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_under_a_small_pool_stays_exact() {
    for pair in [SWA, DENSE] {
        if !present(pair) {
            return;
        }
        for draft in [false, true] {
            let setup = Setup {
                budget: 6,
                ..Setup::new(pair, draft)
            };
            for scenario in ["multi_turn", "shared_system", "branching"] {
                compare(setup, scenario, false).await;
            }
            // No room at all: nothing is cached, nothing breaks.
            let none = Setup { budget: 0, ..setup };
            let warm = compare(none, "multi_turn", true).await;
            assert!(warm.iter().all(|o| o.cached == 0));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_ending_inside_a_block_and_a_window() {
    for pair in [SWA, DENSE] {
        if !present(pair) {
            return;
        }
        for draft in [false, true] {
            let setup = Setup::new(pair, draft);
            let run = |s: Scheduler| async move {
                let a = toks(5, 14);
                let mut outs = vec![ask(&s, a.clone(), 5, sampling(false, 0)).await];
                // Past a's prompt end (14: inside block 3 and inside the last window).
                let b = [a.clone(), toks(40, 5)].concat();
                // Diverging at 11: the last snapshot before it is the prefill mark at 8.
                let c = [a[..11].to_vec(), toks(41, 6)].concat();
                // Diverging at 13, one before a's prompt end: the mark at 12.
                let d = [a[..13].to_vec(), toks(42, 3)].concat();
                for p in [b, c, d] {
                    outs.push(ask(&s, p, 5, sampling(false, 1)).await);
                }
                outs
            };
            let warm = run(start(setup)).await;
            let cold = run(start(setup.off())).await;
            assert_same(&warm, &cold, &format!("{pair:?} draft {draft}"));
            let cached: Vec<usize> = warm.iter().map(|o| o.cached).collect();
            assert_eq!(cached, vec![0, 14, 8, 12], "{pair:?} draft {draft}");
        }
    }
}

/// The store seam directly: a sequence restored at `pos` from blocks and a snapshot computes the
/// same logits for the rest of the prompt as one that prefilled it all (the CPU: bit for bit).
#[test]
fn restored_sequence_computes_the_same_logits() {
    let pair = SWA;
    if !present(pair) {
        return;
    }
    let prompt = toks(9, 30);
    for block in [4usize, 5] {
        let mut m = CpuModel::load(&Path::new(FIX).join(pair.0)).unwrap();
        m.set_prefix_cache(block, 1 << 20);
        let cold = m.new_seq().unwrap();
        let all = m
            .forward(&[StepInput {
                seq: cold,
                tokens: &prompt,
                start_pos: 0,
                logits: LogitRows::All,
            }])
            .unwrap()
            .remove(0);
        for pos in [1usize, 7, 8, 13, 20, 29] {
            let a = m.new_seq().unwrap();
            m.forward(&[StepInput {
                seq: a,
                tokens: &prompt[..pos],
                start_pos: 0,
                logits: LogitRows::None,
            }])
            .unwrap();
            let st = m.prefix_store().unwrap();
            let blocks: Vec<u64> = (0..pos / block)
                .map(|i| st.export_block(a, i).unwrap())
                .collect();
            let snap = st.export_snapshot(a).unwrap();
            m.free_seq(a);
            let b = m.new_seq().unwrap();
            m.prefix_store()
                .unwrap()
                .restore(b, &blocks, Some(snap), pos)
                .unwrap();
            assert_eq!(m.seq_len(b), pos);
            let rest = m
                .forward(&[StepInput {
                    seq: b,
                    tokens: &prompt[pos..],
                    start_pos: pos,
                    logits: LogitRows::All,
                }])
                .unwrap()
                .remove(0);
            for r in 0..prompt.len() - pos {
                let (x, y) = (rest.row(r), all.row(pos + r));
                let d = x
                    .iter()
                    .zip(y)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(d <= 1e-5, "block {block} pos {pos} row {r}: {d}");
                assert!(x.iter().all(|v| v.is_finite()));
            }
            m.free_seq(b);
            let st = m.prefix_store().unwrap();
            for h in blocks.into_iter().chain([snap]) {
                st.release(h);
            }
            assert_eq!(st.free_blocks(), 1 << 20);
        }
    }
}
