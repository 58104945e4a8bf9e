//! The bounded sharded map under the memory store and the local-first store.
//!
//! Keys are spread over shards by hash, each shard a `hashbrown` table behind a
//! reader-writer lock. Memory is bounded in bytes: every shard gets an equal part of the
//! budget, which covers its table's allocation and the heap bytes its keys own. Before an
//! insert that would not fit, the shard first forgets the keys whose state is back to
//! fresh (nothing is lost: a fresh key is indistinguishable from an unknown one), then, if
//! that is not enough, evicts the keys closest to fresh, counting those as evictions of
//! keys that still carried state.
//!
//! A table at its largest size is kept from growing: when it has no free slot left and
//! more than half of its capacity in use, `hashbrown` would double it on the next insert,
//! so the shard evicts down to half first and the insert then rehashes in place. Only while
//! a table grows towards its largest size does it briefly hold its old and new arrays
//! together.

use std::{
    hash::BuildHasher,
    sync::{
        atomic::{AtomicU64, Ordering},
        PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
    },
};

use hashbrown::HashTable;

use crate::error::ConfigError;

/// A shard is swept for fresh keys once it has grown to twice its size after the last
/// sweep, and never below this many entries.
const MIN_SWEEP: usize = 64;

/// The smallest part of the budget a shard gets; smaller budgets use fewer shards.
const MIN_SHARD_BYTES: usize = 4 << 10;

/// The default number of shards: eight per CPU, from 16 to 256.
pub(crate) fn default_shards() -> usize {
    let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
    (cpus * 8).next_power_of_two().clamp(16, 256)
}

/// Aligned to two cache lines (what adjacent-line prefetch pulls together) so that
/// threads working in different shards never share a line: every reader writes its
/// shard's lock word.
#[repr(align(128))]
pub(crate) struct Shard<E> {
    inner: RwLock<ShardInner<E>>,
}

pub(crate) struct ShardInner<E> {
    pub(crate) table: HashTable<E>,
    /// Heap bytes owned by the keys in `table` (not the table's own allocation).
    heap: usize,
    sweep_at: usize,
}

/// What the map needs to know of an entry to bound it.
pub(crate) trait Entry: Send + Sync {
    /// Heap bytes the entry's key owns (as allocated, allocator overhead included).
    fn heap_bytes(&self) -> usize {
        0
    }
}

/// How far an entry is from fresh (0: fresh, may be forgotten), and what to do with an
/// entry evicted while it still carried state. Closures `FnMut(&mut E) -> u64` are one.
pub(crate) trait Residual<E> {
    /// How far `e` is from fresh; 0 when it may be forgotten without losing anything.
    fn residual(&mut self, e: &mut E) -> u64;

    /// Called for each entry evicted while it still carried state.
    fn evicted(&mut self, e: &E) {
        let _ = e;
    }
}

impl<E, F: FnMut(&mut E) -> u64> Residual<E> for F {
    fn residual(&mut self, e: &mut E) -> u64 {
        self(e)
    }
}

/// The table sizes a shard may take within its part of the budget.
#[derive(Clone, Debug)]
struct Geometry {
    /// `(allocation, capacity)` of each table size that fits, smallest first.
    sizes: Vec<(usize, usize)>,
}

impl Geometry {
    /// Every table size of `E` whose allocation fits in `budget`, found by building them
    /// (once per map).
    fn for_budget<E>(budget: usize) -> Option<Self> {
        let mut sizes = Vec::new();
        let mut cap = 1;
        loop {
            let t: HashTable<E> = HashTable::with_capacity(cap);
            let (alloc, capacity) = (t.allocation_size(), t.capacity());
            drop(t);
            if alloc > budget {
                return (!sizes.is_empty()).then_some(Geometry { sizes });
            }
            sizes.push((alloc, capacity));
            // The next size up: one more than this capacity needs twice the buckets.
            cap = capacity + 1;
        }
    }

    fn max_alloc(&self) -> usize {
        self.sizes.last().map_or(0, |s| s.0)
    }

    fn max_capacity(&self) -> usize {
        self.sizes.last().map_or(0, |s| s.1)
    }

    /// The allocation of the table a table of allocation `alloc` grows into.
    fn grown(&self, alloc: usize) -> usize {
        self.sizes
            .iter()
            .map(|s| s.0)
            .find(|&a| a > alloc)
            .unwrap_or(usize::MAX)
    }
}

/// Counters shared by a map's shards.
#[derive(Debug, Default)]
pub(crate) struct Evictions {
    pub(crate) fresh: AtomicU64,
    pub(crate) with_state: AtomicU64,
}

/// See the [module docs](self).
pub(crate) struct ShardedMap<E> {
    shards: Box<[Shard<E>]>,
    shard_shift: u32,
    shard_budget: usize,
    geometry: Geometry,
    pub(crate) evictions: Evictions,
}

impl<E: Entry> ShardedMap<E> {
    /// A map holding at most `budget` bytes over about `shards` shards (a power of two,
    /// reduced so that each shard has at least 4 KiB).
    pub(crate) fn new(budget: usize, shards: usize) -> Result<Self, ConfigError> {
        let mut n = shards.next_power_of_two().max(1);
        while n > 1 && budget / n < MIN_SHARD_BYTES {
            n /= 2;
        }
        let shard_budget = budget / n;
        let geometry = Geometry::for_budget::<E>(shard_budget).ok_or_else(|| {
            ConfigError::Store(format!(
                "a memory budget of {budget} bytes cannot hold a single key"
            ))
        })?;
        Ok(ShardedMap {
            shards: (0..n)
                .map(|_| Shard {
                    inner: RwLock::new(ShardInner {
                        table: HashTable::new(),
                        heap: 0,
                        sweep_at: MIN_SWEEP,
                    }),
                })
                .collect(),
            shard_shift: n.trailing_zeros(),
            shard_budget,
            geometry,
            evictions: Evictions::default(),
        })
    }
}

impl<E> ShardedMap<E> {
    /// The budget, as divided over the shards.
    pub(crate) fn budget(&self) -> usize {
        self.shard_budget * self.shards.len()
    }

    /// The most keys the map can hold (every shard's table at its largest, full).
    pub(crate) fn max_keys(&self) -> usize {
        self.geometry.max_capacity() * self.shards.len()
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard<E> {
        // Bits 32.. are used neither by hashbrown's bucket index (low bits) nor by its
        // control tag (top 7 bits) at these table sizes.
        let i = if self.shard_shift == 0 {
            0
        } else {
            ((hash >> 32) as usize) & ((1 << self.shard_shift) - 1)
        };
        &self.shards[i]
    }

    /// The shard of `hash` for lookups. A poisoned lock (a panic while it was held) is used
    /// as it is, so that one panic does not fail every later request on the shard.
    #[inline]
    pub(crate) fn read(&self, hash: u64) -> RwLockReadGuard<'_, ShardInner<E>> {
        self.shard(hash)
            .inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The shard of `hash` for inserts and removals (poisoning as in [`ShardedMap::read`]).
    pub(crate) fn write(&self, hash: u64) -> RwLockWriteGuard<'_, ShardInner<E>> {
        self.shard(hash)
            .inner
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write_shard(shard: &Shard<E>) -> RwLockWriteGuard<'_, ShardInner<E>> {
        shard.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keys and bytes held.
    pub(crate) fn usage(&self) -> (usize, usize) {
        self.shards.iter().fold((0, 0), |(keys, bytes), s| {
            let i = s.inner.read().unwrap_or_else(PoisonError::into_inner);
            (
                keys + i.table.len(),
                bytes + i.table.allocation_size() + i.heap,
            )
        })
    }
}

impl<E: Entry> ShardedMap<E> {
    /// Inserts `entry` (whose key is not in the shard) after making room for it within the
    /// shard's budget. `hasher` rehashes entries when the table grows; `residual` says how
    /// far an entry is from fresh at `now` (0: fresh, may be forgotten).
    pub(crate) fn insert(
        &self,
        inner: &mut ShardInner<E>,
        hash: u64,
        entry: E,
        hasher: impl Fn(&E) -> u64,
        mut residual: impl Residual<E>,
    ) {
        let heap = entry.heap_bytes();
        let len = inner.table.len();
        if len >= inner.sweep_at {
            self.forget_fresh(inner, &mut residual);
        }
        if !self.fits(inner, heap) {
            self.forget_fresh(inner, &mut residual);
            if !self.fits(inner, heap) {
                self.evict(inner, heap, &mut residual);
            }
        }
        inner.heap += heap;
        inner.table.insert_unique(hash, entry, hasher);
    }

    /// Whether one more entry owning `heap` bytes fits in the shard's budget, counting a
    /// growth of its table.
    fn fits(&self, inner: &ShardInner<E>, heap: usize) -> bool {
        let t = &inner.table;
        let alloc = t.allocation_size();
        let table_after = if t.len() < t.capacity() {
            alloc
        } else if alloc >= self.geometry.max_alloc() {
            // No free slot in the largest table: the insert rehashes it in place when at
            // most half of it is live, and would double it otherwise.
            if t.len() + 1 > self.geometry.max_capacity() / 2 {
                return false;
            }
            alloc
        } else {
            // No free slot: the insert grows the table (or rehashes it in place; counted
            // as growing all the same).
            self.geometry.grown(alloc)
        };
        table_after.saturating_add(inner.heap + heap) <= self.shard_budget
    }

    /// Forgets every fresh entry of the shard.
    fn forget_fresh(&self, inner: &mut ShardInner<E>, residual: &mut impl Residual<E>) {
        let before = inner.table.len();
        let mut freed = 0;
        inner.table.retain(|e| {
            if residual.residual(e) == 0 {
                freed += e.heap_bytes();
                false
            } else {
                true
            }
        });
        inner.heap -= freed;
        let after = inner.table.len();
        self.evictions
            .fresh
            .fetch_add((before - after) as u64, Ordering::Relaxed);
        inner.sweep_at = (after * 2).max(MIN_SWEEP);
    }

    /// Evicts the entries closest to fresh until one more entry owning `heap` bytes fits:
    /// at least an eighth of the shard, and down to half of a table at its largest so
    /// that the next insert rehashes in place instead of growing.
    fn evict(&self, inner: &mut ShardInner<E>, heap: usize, residual: &mut impl Residual<E>) {
        while !self.fits(inner, heap) && !inner.table.is_empty() {
            let len = inner.table.len();
            let mut target = (len / 8).max(1);
            let t = &inner.table;
            if t.len() == t.capacity() && t.allocation_size() >= self.geometry.max_alloc() {
                // Down to half of the largest table: the next insert rehashes in place.
                let half = self.geometry.max_capacity() / 2;
                target = target.max((len + 1).saturating_sub(half));
            }
            let target = target.min(len);
            let mut residuals: Vec<u64> = inner
                .table
                .iter_mut()
                .map(|e| residual.residual(e))
                .collect();
            let (_, &mut threshold, _) = residuals.select_nth_unstable(target - 1);
            let mut left = target;
            let mut freed = 0;
            inner.table.retain(|e| {
                if left > 0 && residual.residual(e) <= threshold {
                    left -= 1;
                    freed += e.heap_bytes();
                    residual.evicted(e);
                    false
                } else {
                    true
                }
            });
            inner.heap -= freed;
            self.evictions
                .with_state
                .fetch_add((target - left) as u64, Ordering::Relaxed);
        }
    }

    /// Forgets every fresh entry now.
    pub(crate) fn sweep(&self, mut residual: impl Residual<E>) {
        for s in self.shards.iter() {
            let mut inner = Self::write_shard(s);
            self.forget_fresh(&mut inner, &mut residual);
        }
    }

    #[cfg(feature = "redis")]
    /// Visits every entry, shard by shard, under the shard's write lock.
    pub(crate) fn for_each_mut(&self, mut f: impl FnMut(&mut E)) {
        for s in self.shards.iter() {
            let mut inner = Self::write_shard(s);
            inner.table.iter_mut().for_each(&mut f);
        }
    }
}

#[cfg(any(feature = "redis", test))]
/// The heap bytes of an allocation of `len` bytes, as glibc's malloc and most general
/// purpose allocators lay it out: a header word, rounded up to 16 bytes, at least 32.
pub(crate) fn allocation_bytes(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        (len + 8).div_ceil(16).max(2) * 16
    }
}

/// A hasher for keys stored as they are.
pub(crate) type KeyHasher = foldhash::fast::RandomState;

/// The hash of `key` under `hasher`.
#[inline]
pub(crate) fn hash_of<K: std::hash::Hash + ?Sized>(hasher: &KeyHasher, key: &K) -> u64 {
    hasher.hash_one(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct E(u64, u64);
    impl Entry for E {}

    fn fill(map: &ShardedMap<E>, n: u64, residual: u64) {
        let h = KeyHasher::default();
        for k in 0..n {
            let hash = hash_of(&h, &k);
            let mut inner = map.write(hash);
            map.insert(
                &mut inner,
                hash,
                E(k, residual),
                |e| hash_of(&h, &e.0),
                |e: &mut E| e.1,
            );
        }
    }

    #[test]
    fn a_flood_stays_within_the_budget_and_counts_evictions() {
        let map = ShardedMap::<E>::new(64 << 10, 4).unwrap();
        fill(&map, 100_000, 5);
        let (keys, bytes) = map.usage();
        assert!(bytes <= map.budget(), "{bytes} > {}", map.budget());
        assert!(keys > 0 && keys <= map.max_keys());
        let evicted = map.evictions.with_state.load(Ordering::Relaxed);
        assert_eq!(evicted as usize + keys, 100_000);
    }

    #[test]
    fn fresh_keys_go_first_and_are_not_counted_as_losses() {
        let map = ShardedMap::<E>::new(64 << 10, 4).unwrap();
        fill(&map, 100_000, 0);
        assert_eq!(map.evictions.with_state.load(Ordering::Relaxed), 0);
        assert!(map.usage().1 <= map.budget());
    }

    #[test]
    fn a_budget_too_small_for_one_key_is_refused() {
        assert!(ShardedMap::<E>::new(8, 1).is_err());
    }

    #[test]
    fn allocation_sizes() {
        assert_eq!(allocation_bytes(0), 0);
        assert_eq!(allocation_bytes(1), 32);
        assert_eq!(allocation_bytes(24), 32);
        assert_eq!(allocation_bytes(25), 48);
    }
}
