//! The prefix cache's index (docs/design/prefix-cache.md): which token prefixes have K/V blocks and
//! snapshots in the backends' stores ([`crate::model::prefix::PrefixStore`]), keyed by a hash
//! chain of token blocks, with pins (running sequences that use a block) and LRU eviction.
//!
//! Block `i` of a prompt is its tokens `i*B..(i+1)*B`; its key is `chain(key of block i-1, ids)`
//! (`ROOT` before block 0), so one key names the whole prefix up to the block's end. Each entry
//! keeps its parent key and its ids and a lookup checks both, and an insert whose key is taken by
//! another (parent, ids) is refused: a hash collision can cost a reuse, never give wrong K/V.
//! A snapshot at position `p` hangs on the key of the `p / B` whole blocks before it, with the
//! `p % B` tail ids. Eviction takes the least recently used leaf: a snapshot, or an unpinned block
//! with neither child blocks nor snapshots, so whatever stays cached is reachable from the root.
use crate::model::prefix::CacheHandle;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// Key of the empty prefix.
pub const ROOT: u64 = 0x9E37_79B9_7F4A_7C15;

/// The key of a block: its parent's key and its token ids, hashed (SipHash, fixed keys).
pub fn chain(parent: u64, ids: &[u32]) -> u64 {
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    parent.hash(&mut h);
    ids.hash(&mut h);
    h.finish()
}

/// An item's handles in the target's store and, with a DFlash draft, the draft's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handles {
    pub target: CacheHandle,
    pub draft: Option<CacheHandle>,
}

struct Block {
    parent: u64,
    ids: Vec<u32>,
    h: Handles,
    pins: usize,
    children: usize,
    snaps: usize,
    used: u64,
}

struct Snap {
    parent: u64,
    tail: Vec<u32>,
    h: Handles,
    used: u64,
}

/// Where a prompt resumes: positions `0..pos` come from `blocks` (keys, in order, `pos / B` of
/// them) and the snapshot taken at `pos` (None: a block boundary of a store without windows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub pos: usize,
    pub blocks: Vec<u64>,
    pub block_handles: Vec<Handles>,
    pub snap: Option<Handles>,
}

pub struct PrefixCache {
    block: usize,
    /// Any block boundary is a resume point (no store needs a snapshot).
    boundaries: bool,
    blocks: HashMap<u64, Block>,
    snaps: HashMap<u64, Snap>,
    /// Snapshot ids by the key they hang on.
    by_parent: HashMap<u64, Vec<u64>>,
    next_snap: u64,
    tick: u64,
}

impl PrefixCache {
    pub fn new(block: usize, boundaries: bool) -> PrefixCache {
        PrefixCache {
            block: block.max(1),
            boundaries,
            blocks: HashMap::new(),
            snaps: HashMap::new(),
            by_parent: HashMap::new(),
            next_snap: 1,
            tick: 0,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block
    }

    /// (blocks, snapshots) held.
    pub fn len(&self) -> (usize, usize) {
        (self.blocks.len(), self.snaps.len())
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty() && self.snaps.is_empty()
    }

    fn touch(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Whether `key` names exactly (parent, ids).
    fn is(&self, key: u64, parent: u64, ids: &[u32]) -> bool {
        self.blocks
            .get(&key)
            .is_some_and(|b| b.parent == parent && b.ids == ids)
    }

    /// The longest cached prefix of `prompt` to resume from, leaving at least its last token to
    /// compute (its logits sample the first output token). Marks what it returns as used.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<Hit> {
        let b = self.block;
        let limit = prompt.len().saturating_sub(1);
        // The whole blocks cached along the prompt's chain; keys[j] = key of the first j blocks.
        let mut keys = vec![ROOT];
        while (keys.len()) * b <= limit {
            let j = keys.len() - 1;
            let ids = &prompt[j * b..(j + 1) * b];
            let key = chain(keys[j], ids);
            if !self.is(key, keys[j], ids) {
                break;
            }
            keys.push(key);
        }
        // The deepest snapshot on that chain whose tail matches, and the deepest boundary.
        let mut best: Option<(usize, Option<u64>)> = None;
        if self.boundaries && keys.len() > 1 {
            best = Some(((keys.len() - 1) * b, None));
        }
        for (j, key) in keys.iter().enumerate() {
            for id in self.by_parent.get(key).into_iter().flatten() {
                let s = &self.snaps[id];
                let pos = j * b + s.tail.len();
                let fits = pos <= limit && prompt[j * b..pos] == s.tail[..];
                if fits && best.is_none_or(|(p, _)| pos > p) {
                    best = Some((pos, Some(*id)));
                }
            }
        }
        let (pos, snap) = best?;
        if pos == 0 {
            return None;
        }
        let now = self.touch();
        let blocks: Vec<u64> = keys[1..=pos / b].to_vec();
        let mut block_handles = Vec::with_capacity(blocks.len());
        for k in &blocks {
            let e = self.blocks.get_mut(k).expect("on the chain");
            e.used = now;
            block_handles.push(e.h);
        }
        let snap = snap.map(|id| {
            let s = self.snaps.get_mut(&id).expect("found above");
            s.used = now;
            s.h
        });
        Some(Hit {
            pos,
            blocks,
            block_handles,
            snap,
        })
    }

    /// Whether block (parent, ids) is cached (and mark it used); its key when it is.
    pub fn find_block(&mut self, parent: u64, ids: &[u32]) -> Option<u64> {
        let key = chain(parent, ids);
        if !self.is(key, parent, ids) {
            return None;
        }
        let now = self.touch();
        self.blocks.get_mut(&key).expect("checked").used = now;
        Some(key)
    }

    /// Whether `chain(parent, ids)` is free for this block (not taken by another prefix) and the
    /// parent is cached (or the root).
    pub fn can_insert_block(&self, parent: u64, ids: &[u32]) -> bool {
        (parent == ROOT || self.blocks.contains_key(&parent))
            && !self.blocks.contains_key(&chain(parent, ids))
    }

    /// Add a block (after `can_insert_block`); returns its key.
    pub fn insert_block(&mut self, parent: u64, ids: &[u32], h: Handles) -> u64 {
        let key = chain(parent, ids);
        let used = self.touch();
        if let Some(p) = self.blocks.get_mut(&parent) {
            p.children += 1;
        }
        self.blocks.insert(
            key,
            Block {
                parent,
                ids: ids.to_vec(),
                h,
                pins: 0,
                children: 0,
                snaps: 0,
                used,
            },
        );
        key
    }

    /// Whether a snapshot of (parent, tail) is already cached (and mark it used).
    pub fn has_snapshot(&mut self, parent: u64, tail: &[u32]) -> bool {
        let now = self.touch();
        let ids = self.by_parent.get(&parent).cloned().unwrap_or_default();
        for id in ids {
            let s = self.snaps.get_mut(&id).expect("indexed");
            if s.tail == tail {
                s.used = now;
                return true;
            }
        }
        false
    }

    /// Add a snapshot hanging on `parent` (ROOT or a cached block) with `tail` ids after it.
    pub fn insert_snapshot(&mut self, parent: u64, tail: &[u32], h: Handles) -> bool {
        if parent != ROOT && !self.blocks.contains_key(&parent) {
            return false;
        }
        if let Some(p) = self.blocks.get_mut(&parent) {
            p.snaps += 1;
        }
        let id = self.next_snap;
        self.next_snap += 1;
        let used = self.touch();
        self.snaps.insert(
            id,
            Snap {
                parent,
                tail: tail.to_vec(),
                h,
                used,
            },
        );
        self.by_parent.entry(parent).or_default().push(id);
        true
    }

    /// A running sequence uses these blocks (never evicted while pinned).
    pub fn pin(&mut self, keys: &[u64]) {
        for k in keys {
            if let Some(b) = self.blocks.get_mut(k) {
                b.pins += 1;
            }
        }
    }

    pub fn unpin(&mut self, keys: &[u64]) {
        for k in keys {
            if let Some(b) = self.blocks.get_mut(k) {
                b.pins = b.pins.saturating_sub(1);
            }
        }
    }

    /// Drop the least recently used leaf; its handles, for the stores to release. None when
    /// nothing can go (everything left is pinned or holds pinned blocks).
    pub fn evict_one(&mut self) -> Option<Handles> {
        let snap = self.snaps.iter().map(|(&id, s)| (s.used, id)).min();
        let block = self
            .blocks
            .iter()
            .filter(|(_, b)| b.pins == 0 && b.children == 0 && b.snaps == 0)
            .map(|(&k, b)| (b.used, k))
            .min();
        match (snap, block) {
            (Some((su, id)), b) if b.is_none_or(|(bu, _)| su <= bu) => {
                let s = self.snaps.remove(&id).expect("found");
                if let Some(v) = self.by_parent.get_mut(&s.parent) {
                    v.retain(|&x| x != id);
                    if v.is_empty() {
                        self.by_parent.remove(&s.parent);
                    }
                }
                if let Some(p) = self.blocks.get_mut(&s.parent) {
                    p.snaps -= 1;
                }
                Some(s.h)
            }
            (_, Some((_, key))) => {
                let b = self.blocks.remove(&key).expect("found");
                if let Some(p) = self.blocks.get_mut(&b.parent) {
                    p.children -= 1;
                }
                Some(b.h)
            }
            _ => None,
        }
    }

    /// Every handle held (to release them all).
    pub fn drain(&mut self) -> Vec<Handles> {
        let mut out: Vec<Handles> = self.snaps.drain().map(|(_, s)| s.h).collect();
        out.extend(self.blocks.drain().map(|(_, b)| b.h));
        self.by_parent.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(t: u64) -> Handles {
        Handles {
            target: t,
            draft: None,
        }
    }

    /// Cache the blocks of `toks` and a snapshot at `snap_at`; returns the block keys.
    fn fill(c: &mut PrefixCache, toks: &[u32], snap_at: usize, next: &mut u64) -> Vec<u64> {
        let b = c.block_size();
        let mut keys = vec![];
        let mut parent = ROOT;
        for j in 0..snap_at / b {
            let ids = &toks[j * b..(j + 1) * b];
            parent = match c.find_block(parent, ids) {
                Some(k) => k,
                None => {
                    assert!(c.can_insert_block(parent, ids));
                    *next += 1;
                    c.insert_block(parent, ids, h(*next))
                }
            };
            keys.push(parent);
        }
        let tail = &toks[snap_at / b * b..snap_at];
        if !c.has_snapshot(parent, tail) {
            *next += 1;
            assert!(c.insert_snapshot(parent, tail, h(*next)));
        }
        keys
    }

    #[test]
    fn lookup_takes_the_deepest_matching_snapshot_before_the_last_token() {
        let mut c = PrefixCache::new(4, false);
        let mut n = 0;
        let a: Vec<u32> = (0..20).collect();
        fill(&mut c, &a, 10, &mut n);
        fill(&mut c, &a, 17, &mut n);
        // Same first 12 tokens, then different: the snapshot at 10 (17 diverged).
        let mut p = a[..12].to_vec();
        p.extend([99, 98, 97, 96, 95, 94]);
        let hit = c.lookup(&p).unwrap();
        assert_eq!(hit.pos, 10);
        assert_eq!(hit.blocks.len(), 2);
        assert!(hit.snap.is_some());
        // The whole of a: 17, and never the last token itself.
        assert_eq!(c.lookup(&a).unwrap().pos, 17);
        assert_eq!(c.lookup(&a[..17]).unwrap().pos, 10);
        // Divergence inside the first block: nothing.
        assert!(c.lookup(&[0, 1, 7, 7, 7, 7, 7]).is_none());
    }

    #[test]
    fn boundaries_resume_without_snapshots_and_collisions_are_refused() {
        let mut c = PrefixCache::new(4, true);
        let mut n = 0;
        let a: Vec<u32> = (0..13).collect();
        fill(&mut c, &a, 12, &mut n);
        let hit = c.lookup(&a).unwrap();
        // The snapshot at 12 is a boundary too; a prompt of 12 resumes at 8 (no snapshot).
        assert_eq!(hit.pos, 12);
        let hit = c.lookup(&a[..12]).unwrap();
        assert_eq!((hit.pos, hit.snap), (8, None));
        // A key already taken refuses another (parent, ids).
        let k0 = chain(ROOT, &a[..4]);
        assert!(!c.can_insert_block(ROOT, &a[..4]));
        assert!(c.find_block(ROOT, &a[..4]) == Some(k0));
        // A block whose parent is not cached cannot be added.
        assert!(!c.can_insert_block(12345, &[1, 2, 3, 4]));
    }

    #[test]
    fn eviction_is_lru_over_leaves_and_respects_pins() {
        let mut c = PrefixCache::new(2, false);
        let mut n = 0;
        let a: Vec<u32> = vec![1, 2, 3, 4, 5, 6, 7];
        let b: Vec<u32> = vec![1, 2, 9, 9, 9];
        let ka = fill(&mut c, &a, 6, &mut n);
        fill(&mut c, &b, 4, &mut n);
        c.pin(&ka);
        // Snapshots go first (leaves), then b's own block; a's pinned blocks and the shared first
        // block stay.
        let mut gone = vec![];
        while let Some(x) = c.evict_one() {
            gone.push(x.target);
        }
        assert_eq!(c.len(), (3, 0));
        assert_eq!(gone.len(), 3);
        c.unpin(&ka);
        while c.evict_one().is_some() {}
        assert!(c.is_empty());
        assert!(c.by_parent.is_empty());
    }

    #[test]
    fn a_used_entry_outlives_an_older_one() {
        let mut c = PrefixCache::new(2, false);
        let mut n = 0;
        fill(&mut c, &[1, 2, 3], 3, &mut n);
        fill(&mut c, &[5, 6, 7], 3, &mut n);
        // Touch the first prefix; the second's snapshot is now the oldest leaf.
        assert_eq!(c.lookup(&[1, 2, 3, 4]).unwrap().pos, 3);
        c.evict_one();
        assert!(c.lookup(&[5, 6, 7, 8]).is_none());
        assert_eq!(c.lookup(&[1, 2, 3, 4]).unwrap().pos, 3);
    }
}
