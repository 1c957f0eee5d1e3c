//! The kernel timeline of a LAGUNA_STAMP build (diagnostic, `laguna bench`): every block of a
//! kernel with `PDL_ENTRY` records when its wait returned and when it left (kernels/cu/common.cuh,
//! `StampGuard`); this groups the records by launch and says, for one decode step replayed from
//! its graph, when each launch's work began, how long it ran, and the gap before it.
use std::collections::BTreeMap;
use std::fmt::Write;

/// Records each module holds (common.cuh's STAMP_CAP).
pub const STAMP_CAP: usize = 1 << 17;

/// One block's record.
#[derive(Debug, Clone)]
pub struct Stamp {
    /// The launch (%gridid).
    pub grid: u64,
    /// Global timer (ns) when the block's PDL wait returned (its start without PDL).
    pub wait: u64,
    /// When thread 0 left.
    pub end: u64,
    pub sm: u32,
    pub block: u32,
    /// The function PDL_ENTRY is in (first 32 bytes).
    pub name: String,
}

impl Stamp {
    pub fn from_bytes(b: &[u8]) -> Stamp {
        let w = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap());
        let name: Vec<u8> = b[32..64].iter().copied().take_while(|&c| c != 0).collect();
        Stamp {
            grid: w(0),
            wait: w(1),
            end: w(2),
            sm: (w(3) >> 32) as u32,
            block: w(3) as u32,
            name: String::from_utf8_lossy(&name).into_owned(),
        }
    }
}

/// Every record as CSV (grid, wait ns, end ns, SM, block, function).
pub fn csv(recs: &[Stamp]) -> String {
    let mut s = String::from("grid,wait,end,sm,block,name\n");
    for r in recs {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{}",
            r.grid, r.wait, r.end, r.sm, r.block, r.name
        );
    }
    s
}

/// One launch's blocks summarized.
#[derive(Debug, Clone)]
pub struct Launch {
    pub name: String,
    pub blocks: usize,
    pub sms: usize,
    pub first_wait: u64,
    pub last_wait: u64,
    pub first_end: u64,
    pub last_end: u64,
}

/// Blocks of one launch whose waits are further apart than this belong to two replays of it (a
/// graph's kernel node keeps its %gridid from one replay to the next; a step takes ~2.6 ms).
const REPLAY_SPLIT_NS: u64 = 300_000;

/// Launches in the order their work began.
pub fn launches(recs: &[Stamp]) -> Vec<Launch> {
    let mut by: BTreeMap<u64, Vec<&Stamp>> = BTreeMap::new();
    for r in recs {
        by.entry(r.grid).or_default().push(r);
    }
    let mut runs: Vec<Vec<&Stamp>> = vec![];
    for mut rs in by.into_values() {
        rs.sort_by_key(|r| r.wait);
        let mut cur: Vec<&Stamp> = vec![];
        for r in rs {
            if cur
                .last()
                .is_some_and(|p| r.wait > p.wait + REPLAY_SPLIT_NS)
            {
                runs.push(std::mem::take(&mut cur));
            }
            cur.push(r);
        }
        runs.push(cur);
    }
    let mut v: Vec<Launch> = runs
        .into_iter()
        .map(|rs| {
            let mut blocks: Vec<u32> = rs.iter().map(|r| r.block).collect();
            blocks.sort_unstable();
            blocks.dedup();
            let mut sms: Vec<u32> = rs.iter().map(|r| r.sm).collect();
            sms.sort_unstable();
            sms.dedup();
            Launch {
                name: rs[0].name.clone(),
                blocks: blocks.len(),
                sms: sms.len(),
                first_wait: rs.iter().map(|r| r.wait).min().unwrap(),
                last_wait: rs.iter().map(|r| r.wait).max().unwrap(),
                first_end: rs.iter().map(|r| r.end).min().unwrap(),
                last_end: rs.iter().map(|r| r.end).max().unwrap(),
            }
        })
        .collect();
    v.sort_by_key(|l| (l.first_wait, l.last_end));
    v
}

/// The launches of step `which` (steps start at each launch named `first`, e.g. "embed").
pub fn step(ls: &[Launch], first: &str, which: usize) -> Vec<Launch> {
    let starts: Vec<usize> = ls
        .iter()
        .enumerate()
        .filter(|(_, l)| l.name == first)
        .map(|(i, _)| i)
        .collect();
    let Some(&a) = starts.get(which) else {
        return vec![];
    };
    let b = starts.get(which + 1).copied().unwrap_or(ls.len());
    ls[a..b].to_vec()
}

/// A table of one step's launches (us from the step's first wait: start, gap after the previous
/// launch's last block, duration first wait -> last end, spread of the blocks' ends) and a summary
/// by function.
pub fn report(st: &[Launch]) -> String {
    let mut s = String::new();
    let Some(t0) = st.first().map(|l| l.first_wait) else {
        return "no stamps (LAGUNA_STAMP build?)\n".into();
    };
    let us = |a: u64, b: u64| (b as f64 - a as f64) / 1e3;
    let _ = writeln!(
        s,
        "| # | function | blocks | SMs | start us | gap us | run us | wait spread us | end spread us |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    let mut agg: BTreeMap<String, (usize, f64, f64)> = BTreeMap::new();
    let mut prev_end = t0;
    for (i, l) in st.iter().enumerate() {
        let gap = if i == 0 {
            0.0
        } else {
            us(prev_end, l.first_wait)
        };
        let run = us(l.first_wait, l.last_end);
        let _ = writeln!(
            s,
            "| {i} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            l.name,
            l.blocks,
            l.sms,
            us(t0, l.first_wait),
            gap,
            run,
            us(l.first_wait, l.last_wait),
            us(l.first_end, l.last_end)
        );
        let e = agg.entry(l.name.clone()).or_default();
        e.0 += 1;
        e.1 += run;
        e.2 += gap;
        prev_end = prev_end.max(l.last_end);
    }
    let span = us(t0, st.iter().map(|l| l.last_end).max().unwrap());
    let _ = writeln!(s, "\nstep span {span:.1} us, {} launches\n", st.len());
    let _ = writeln!(
        s,
        "| function | launches | run us (sum) | run us (mean) | gap before us (sum) |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|");
    let mut rows: Vec<_> = agg.into_iter().collect();
    rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
    for (n, (c, r, g)) in rows {
        let _ = writeln!(s, "| {n} | {c} | {r:.1} | {:.2} | {g:.1} |", r / c as f64);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(grid: u64, wait: u64, end: u64, block: u32, name: &str) -> Stamp {
        Stamp {
            grid,
            wait,
            end,
            sm: block % 3,
            block,
            name: name.into(),
        }
    }

    #[test]
    fn groups_launches_and_splits_steps() {
        let mut b = [0u8; 64];
        b[0] = 7;
        b[8] = 1;
        b[16] = 2;
        b[24] = 5;
        b[28] = 9;
        b[32..37].copy_from_slice(b"embed");
        let s = Stamp::from_bytes(&b);
        assert_eq!((s.grid, s.wait, s.end, s.block, s.sm), (7, 1, 2, 5, 9));
        assert_eq!(s.name, "embed");
        assert_eq!(csv(&[s]), "grid,wait,end,sm,block,name\n7,1,2,9,5,embed\n");
        let recs = vec![
            rec(1, 0, 1000, 0, "embed"),
            rec(2, 1500, 4000, 0, "gemv"),
            rec(2, 1600, 5000, 1, "gemv"),
            rec(3, 6000, 7000, 0, "embed"),
            rec(4, 7500, 9000, 0, "gemv"),
            // grid 1 and 2 replayed (a graph node keeps its %gridid).
            rec(1, 1_000_000, 1_001_000, 0, "embed"),
            rec(2, 1_001_500, 1_004_000, 0, "gemv"),
        ];
        let ls = launches(&recs);
        assert_eq!(ls.len(), 6);
        let st = step(&ls, "embed", 0);
        assert_eq!(st.len(), 2);
        assert_eq!(st[1].blocks, 2);
        assert_eq!((st[1].first_wait, st[1].last_end), (1500, 5000));
        let r = report(&st);
        // gemv: gap 0.5 us after embed, run 3.5 us.
        assert!(
            r.contains("| 1 | gemv | 2 | 2 | 1.50 | 0.50 | 3.50 | 0.10 | 1.00 |"),
            "{r}"
        );
        assert_eq!(step(&ls, "embed", 1).len(), 2);
        assert_eq!(step(&ls, "embed", 2).len(), 2);
        assert_eq!(step(&ls, "embed", 2)[1].first_wait, 1_001_500);
        assert!(step(&ls, "embed", 3).is_empty());
    }
}
