//! The bounded sharded map under the memory store and the local-first store.
//!
//! Keys are spread over shards by hash. Each shard holds two `hashbrown` tables behind one
//! reader-writer lock: `one` for the compact entries of the common case, `many` for the
//! others (the memory store keeps a single token bucket's state in `one` and several
//! limits' states in `many`; a key is in one of them at a time). Memory is bounded in
//! bytes: every shard gets an equal part of the budget, which covers both tables'
//! allocations and the heap bytes their entries own. Before an insert that would not fit,
//! the shard first forgets the entries whose state is back to fresh (nothing is lost: a
//! fresh key is indistinguishable from an unknown one), then, if that is not enough,
//! evicts the entries closest to fresh, counting those as evictions of keys that still
//! carried state.
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

use crate::{error::ConfigError, observe::StoreMetrics};

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
pub(crate) struct Shard<A, B> {
    inner: RwLock<ShardInner<A, B>>,
}

pub(crate) struct ShardInner<A, B> {
    pub(crate) one: HashTable<A>,
    pub(crate) many: HashTable<B>,
    /// Heap bytes owned by the entries (not the tables' own allocations).
    heap: usize,
    sweep_at: usize,
}

impl<A, B> ShardInner<A, B> {
    fn len(&self) -> usize {
        self.one.len() + self.many.len()
    }

    fn allocation(&self) -> usize {
        self.one.allocation_size() + self.many.allocation_size()
    }
}

/// What the map needs to know of an entry to bound it.
pub(crate) trait Entry: Send + Sync {
    /// Heap bytes the entry owns (as allocated, allocator overhead included).
    fn heap_bytes(&self) -> usize {
        0
    }
}

/// No entry: the second table of a map that needs only one.
pub(crate) enum Never {}

impl Entry for Never {}

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

impl Residual<Never> for () {
    fn residual(&mut self, e: &mut Never) -> u64 {
        match *e {}
    }
}

/// The residuals of both tables' entries.
pub(crate) struct Both<RA, RB>(pub(crate) RA, pub(crate) RB);

/// Which table an insert goes to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Which {
    One,
    Many,
}

/// The table sizes a shard (or any table bounded in bytes) may take within its budget.
#[derive(Clone, Debug)]
pub(crate) struct Geometry {
    /// `(allocation, capacity)` of each table size that fits, smallest first.
    sizes: Vec<(usize, usize)>,
}

impl Geometry {
    /// Every table size of `E` whose allocation fits in `budget`, found by building them
    /// (once per map).
    pub(crate) fn for_budget<E>(budget: usize) -> Self {
        let mut sizes = Vec::new();
        let mut cap = 1;
        loop {
            let t: HashTable<E> = HashTable::with_capacity(cap);
            let (alloc, capacity) = (t.allocation_size(), t.capacity());
            drop(t);
            if alloc > budget || capacity == 0 {
                return Geometry { sizes };
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

    /// The allocation `t` has after one more insert, or `None` if that would double a
    /// table already at its largest.
    pub(crate) fn after_insert<E>(&self, t: &HashTable<E>) -> Option<usize> {
        let alloc = t.allocation_size();
        if t.len() < t.capacity() {
            Some(alloc)
        } else if alloc >= self.max_alloc() {
            // No free slot in the largest table: the insert rehashes it in place when at
            // most half of it is live, and would double it otherwise.
            (t.len() < self.max_capacity() / 2).then_some(alloc)
        } else {
            // No free slot: the insert grows the table (or rehashes it in place; counted
            // as growing all the same).
            Some(self.grown(alloc))
        }
    }

    /// Entries to evict from a full table at its largest so that the next insert
    /// rehashes in place.
    fn to_half<E>(&self, t: &HashTable<E>) -> usize {
        if t.len() == t.capacity() && t.allocation_size() >= self.max_alloc() {
            (t.len() + 1).saturating_sub(self.max_capacity() / 2)
        } else {
            0
        }
    }
}

/// Counters shared by a map's shards.
#[derive(Debug, Default)]
pub(crate) struct Evictions {
    pub(crate) fresh: AtomicU64,
    pub(crate) with_state: AtomicU64,
}

/// See the [module docs](self).
pub(crate) struct ShardedMap<A, B = Never> {
    shards: Box<[Shard<A, B>]>,
    /// The shard count minus one: a shard's index is `(hash >> 32) & shard_mask`.
    shard_mask: usize,
    shard_budget: usize,
    one: Geometry,
    many: Geometry,
    pub(crate) evictions: Evictions,
    pub(crate) metrics: StoreMetrics,
}

impl<A: Entry, B: Entry> ShardedMap<A, B> {
    /// A map holding at most `budget` bytes over about `shards` shards (a power of two,
    /// reduced so that each shard has at least 4 KiB).
    pub(crate) fn new(
        budget: usize,
        shards: usize,
        metrics: StoreMetrics,
    ) -> Result<Self, ConfigError> {
        let mut n = shards.next_power_of_two().max(1);
        while n > 1 && budget / n < MIN_SHARD_BYTES {
            n /= 2;
        }
        let shard_budget = budget / n;
        let one = Geometry::for_budget::<A>(shard_budget);
        if one.sizes.is_empty() {
            return Err(ConfigError::Store(format!(
                "a memory budget of {budget} bytes cannot hold a single key"
            )));
        }
        Ok(ShardedMap {
            shards: (0..n)
                .map(|_| Shard {
                    inner: RwLock::new(ShardInner {
                        one: HashTable::new(),
                        many: HashTable::new(),
                        heap: 0,
                        sweep_at: MIN_SWEEP,
                    }),
                })
                .collect(),
            shard_mask: n - 1,
            shard_budget,
            one,
            many: Geometry::for_budget::<B>(shard_budget),
            evictions: Evictions::default(),
            metrics,
        })
    }
}

impl<A, B> ShardedMap<A, B> {
    /// The budget, as divided over the shards.
    pub(crate) fn budget(&self) -> usize {
        self.shard_budget * self.shards.len()
    }

    /// The most keys of the first table the map can hold (every shard's table at its
    /// largest, full).
    pub(crate) fn max_keys(&self) -> usize {
        self.one.max_capacity() * self.shards.len()
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard<A, B> {
        // Bits 32.. are used neither by hashbrown's bucket index (low bits) nor by its
        // control tag (top 7 bits) at these table sizes.
        &self.shards[(hash >> 32) as usize & self.shard_mask]
    }

    /// The shard of `hash` for lookups. A poisoned lock (a panic while it was held) is used
    /// as it is, so that one panic does not fail every later request on the shard.
    #[inline]
    pub(crate) fn read(&self, hash: u64) -> RwLockReadGuard<'_, ShardInner<A, B>> {
        self.shard(hash)
            .inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The shard of `hash` for inserts and removals (poisoning as in [`ShardedMap::read`]).
    pub(crate) fn write(&self, hash: u64) -> RwLockWriteGuard<'_, ShardInner<A, B>> {
        self.shard(hash)
            .inner
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write_shard(shard: &Shard<A, B>) -> RwLockWriteGuard<'_, ShardInner<A, B>> {
        shard.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keys and bytes held.
    pub(crate) fn usage(&self) -> (usize, usize) {
        self.shards.iter().fold((0, 0), |(keys, bytes), s| {
            let i = s.inner.read().unwrap_or_else(PoisonError::into_inner);
            (keys + i.len(), bytes + i.allocation() + i.heap)
        })
    }
}

impl<A: Entry, B: Entry> ShardedMap<A, B> {
    /// Inserts `entry` into the first table (its key is in neither) after making room for
    /// it within the shard's budget. `hasher` rehashes entries when the table grows;
    /// `residual` says how far entries are from fresh (0: fresh, may be forgotten).
    pub(crate) fn insert_one<RA, RB>(
        &self,
        inner: &mut ShardInner<A, B>,
        hash: u64,
        entry: A,
        hasher: impl Fn(&A) -> u64,
        mut residual: Both<RA, RB>,
    ) where
        RA: Residual<A>,
        RB: Residual<B>,
    {
        self.make_room(inner, Which::One, entry.heap_bytes(), &mut residual);
        inner.heap += entry.heap_bytes();
        inner.one.insert_unique(hash, entry, hasher);
        self.metrics.keys(1);
    }

    /// [`ShardedMap::insert_one`] into the second table.
    pub(crate) fn insert_many<RA, RB>(
        &self,
        inner: &mut ShardInner<A, B>,
        hash: u64,
        entry: B,
        hasher: impl Fn(&B) -> u64,
        mut residual: Both<RA, RB>,
    ) where
        RA: Residual<A>,
        RB: Residual<B>,
    {
        self.make_room(inner, Which::Many, entry.heap_bytes(), &mut residual);
        inner.heap += entry.heap_bytes();
        inner.many.insert_unique(hash, entry, hasher);
        self.metrics.keys(1);
    }

    /// An entry left its table (to be inserted again): its heap bytes and its count.
    pub(crate) fn removed(&self, inner: &mut ShardInner<A, B>, heap: usize) {
        inner.heap -= heap;
        self.metrics.keys(-1);
    }

    fn make_room<RA: Residual<A>, RB: Residual<B>>(
        &self,
        inner: &mut ShardInner<A, B>,
        which: Which,
        heap: usize,
        residual: &mut Both<RA, RB>,
    ) {
        if inner.len() >= inner.sweep_at {
            self.forget_fresh(inner, residual);
        }
        if !self.fits(inner, which, heap) {
            self.forget_fresh(inner, residual);
            while !self.fits(inner, which, heap) && inner.len() > 0 {
                self.evict(inner, which, residual);
            }
        }
    }

    /// Whether one more entry owning `heap` bytes fits in the shard's budget, counting a
    /// growth of its table.
    fn fits(&self, inner: &ShardInner<A, B>, which: Which, heap: usize) -> bool {
        let (one, many) = match which {
            Which::One => (
                self.one.after_insert(&inner.one),
                Some(inner.many.allocation_size()),
            ),
            Which::Many => (
                Some(inner.one.allocation_size()),
                self.many.after_insert(&inner.many),
            ),
        };
        match (one, many) {
            (Some(a), Some(b)) => {
                a.saturating_add(b).saturating_add(inner.heap + heap) <= self.shard_budget
            }
            _ => false,
        }
    }

    /// Forgets every fresh entry of the shard.
    fn forget_fresh<RA: Residual<A>, RB: Residual<B>>(
        &self,
        inner: &mut ShardInner<A, B>,
        residual: &mut Both<RA, RB>,
    ) {
        let before = inner.len();
        let mut freed = 0;
        inner.one.retain(|e| {
            let fresh = residual.0.residual(e) == 0;
            if fresh {
                freed += e.heap_bytes();
            }
            !fresh
        });
        inner.many.retain(|e| {
            let fresh = residual.1.residual(e) == 0;
            if fresh {
                freed += e.heap_bytes();
            }
            !fresh
        });
        inner.heap -= freed;
        let after = inner.len();
        self.evictions
            .fresh
            .fetch_add((before - after) as u64, Ordering::Relaxed);
        self.metrics.evicted((before - after) as u64, 0);
        inner.sweep_at = (after * 2).max(MIN_SWEEP);
    }

    /// Evicts the entries closest to fresh, over both tables: at least an eighth of the
    /// shard, and, from a table at its largest and full, down to half of it so that the
    /// next insert rehashes it in place.
    fn evict<RA: Residual<A>, RB: Residual<B>>(
        &self,
        inner: &mut ShardInner<A, B>,
        which: Which,
        residual: &mut Both<RA, RB>,
    ) {
        let len = inner.len();
        let target = (len / 8).max(1);
        // The table that must shrink to half is evicted from on its own.
        let (half_one, half_many) = (self.one.to_half(&inner.one), self.many.to_half(&inner.many));
        let (one_only, many_only) = match which {
            Which::One if half_one > 0 => (half_one.max(target).min(inner.one.len()), 0),
            Which::Many if half_many > 0 => (0, half_many.max(target).min(inner.many.len())),
            _ => (0, 0),
        };
        let mut evicted = 0;
        if one_only > 0 {
            evicted += evict_table(&mut inner.one, one_only, &mut residual.0, &mut inner.heap);
        } else if many_only > 0 {
            evicted += evict_table(&mut inner.many, many_only, &mut residual.1, &mut inner.heap);
        } else {
            // The `target` entries closest to fresh in either table.
            let mut residuals: Vec<u64> = inner
                .one
                .iter_mut()
                .map(|e| residual.0.residual(e))
                .chain(inner.many.iter_mut().map(|e| residual.1.residual(e)))
                .collect();
            let target = target.min(residuals.len());
            let (_, &mut threshold, _) = residuals.select_nth_unstable(target - 1);
            let mut left = target;
            let heap = &mut inner.heap;
            inner.one.retain(|e| {
                if left > 0 && residual.0.residual(e) <= threshold {
                    left -= 1;
                    *heap -= e.heap_bytes();
                    residual.0.evicted(e);
                    false
                } else {
                    true
                }
            });
            inner.many.retain(|e| {
                if left > 0 && residual.1.residual(e) <= threshold {
                    left -= 1;
                    *heap -= e.heap_bytes();
                    residual.1.evicted(e);
                    false
                } else {
                    true
                }
            });
            evicted += target - left;
        }
        self.evictions
            .with_state
            .fetch_add(evicted as u64, Ordering::Relaxed);
        self.metrics.evicted(0, evicted as u64);
    }

    /// Forgets every fresh entry now.
    pub(crate) fn sweep<RA: Residual<A>, RB: Residual<B>>(&self, mut residual: Both<RA, RB>) {
        for s in self.shards.iter() {
            let mut inner = Self::write_shard(s);
            self.forget_fresh(&mut inner, &mut residual);
        }
    }

    #[cfg(feature = "redis")]
    /// Visits every entry of the first table, shard by shard, under the shard's write
    /// lock.
    pub(crate) fn for_each_one(&self, mut f: impl FnMut(&mut A)) {
        for s in self.shards.iter() {
            let mut inner = Self::write_shard(s);
            inner.one.iter_mut().for_each(&mut f);
        }
    }
}

/// Evicts the `n` entries of `table` closest to fresh; returns how many went.
fn evict_table<E: Entry, R: Residual<E>>(
    table: &mut HashTable<E>,
    n: usize,
    residual: &mut R,
    heap: &mut usize,
) -> usize {
    let mut residuals: Vec<u64> = table.iter_mut().map(|e| residual.residual(e)).collect();
    let (_, &mut threshold, _) = residuals.select_nth_unstable(n - 1);
    let mut left = n;
    table.retain(|e| {
        if left > 0 && residual.residual(e) <= threshold {
            left -= 1;
            *heap -= e.heap_bytes();
            residual.evicted(e);
            false
        } else {
            true
        }
    });
    n - left
}

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
            map.insert_one(
                &mut inner,
                hash,
                E(k, residual),
                |e| hash_of(&h, &e.0),
                Both(|e: &mut E| e.1, ()),
            );
        }
    }

    #[test]
    fn a_flood_stays_within_the_budget_and_counts_evictions() {
        let map = ShardedMap::<E>::new(64 << 10, 4, StoreMetrics::new("test")).unwrap();
        fill(&map, 100_000, 5);
        let (keys, bytes) = map.usage();
        assert!(bytes <= map.budget(), "{bytes} > {}", map.budget());
        assert!(keys > 0 && keys <= map.max_keys());
        let evicted = map.evictions.with_state.load(Ordering::Relaxed);
        assert_eq!(evicted as usize + keys, 100_000);
    }

    #[test]
    fn fresh_keys_go_first_and_are_not_counted_as_losses() {
        let map = ShardedMap::<E>::new(64 << 10, 4, StoreMetrics::new("test")).unwrap();
        fill(&map, 100_000, 0);
        assert_eq!(map.evictions.with_state.load(Ordering::Relaxed), 0);
        assert!(map.usage().1 <= map.budget());
    }

    #[test]
    fn a_budget_too_small_for_one_key_is_refused() {
        assert!(ShardedMap::<E>::new(8, 1, StoreMetrics::new("test")).is_err());
    }

    #[test]
    fn allocation_sizes() {
        assert_eq!(allocation_bytes(0), 0);
        assert_eq!(allocation_bytes(1), 32);
        assert_eq!(allocation_bytes(24), 32);
        assert_eq!(allocation_bytes(25), 48);
    }
}
