//! The in-memory keyed store: sharded, lock-free on the hot path, bounded.

use std::{
    fmt,
    hash::{BuildHasher, Hash},
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
    },
};

use hashbrown::HashTable;

use super::{CheckFuture, Store};
use crate::{
    algorithm::{Gcra, MAX_WORDS},
    clock::{Clock, MonotonicClock},
    decision::Decision,
    error::ConfigError,
    Policy,
};

/// Default cap on the number of keys: 1 M (tens of MB at most).
const DEFAULT_MAX_KEYS: usize = 1 << 20;
/// A shard is swept for fresh keys once it has grown to twice its size after the last
/// sweep, and never below this many entries.
const MIN_SWEEP: usize = 64;

/// The in-memory store: per-key state in a sharded hash table.
///
/// - **Hot path.** A key already present costs one hash, one shared (read) lock of its
///   shard and, for a single GCRA-based limit (token bucket, leaky meter, leaky queue), one
///   compare-and-swap on one `u64`. Windows and multi-limit policies lock the key's own
///   small mutex instead. A refused request never writes.
/// - **Bounded memory, no sweeper task.** A shard that has doubled since its last sweep
///   drops every key whose state is back to fresh (indistinguishable from a key never
///   seen): amortized O(1) per insert. At the cap ([`MemoryStore::with_max_keys`], default
///   2^20 keys) a new key first triggers that sweep; if every key still carries state, the
///   eighth of the shard closest to fresh is evicted and counted in
///   [`MemoryStats::evicted_with_state`] (such a key restarts with a full bucket).
///
/// See the [module docs](super) for an example.
pub struct MemoryStore<K, C = MonotonicClock> {
    policy: Policy,
    gcra: Option<Gcra>,
    clock: C,
    hasher: foldhash::fast::RandomState,
    shards: Box<[Shard<K>]>,
    shard_shift: u32,
    shard_cap: usize,
    evicted_fresh: AtomicU64,
    evicted_with_state: AtomicU64,
}

/// Aligned to two cache lines (what adjacent-line prefetch pulls together) so that
/// threads working in different shards never share a line: every reader writes its
/// shard's lock word.
#[repr(align(128))]
struct Shard<K> {
    inner: RwLock<ShardInner<K>>,
}

struct ShardInner<K> {
    one: HashTable<(K, AtomicU64)>,
    many: HashTable<(K, Mutex<Box<[u64]>>)>,
    sweep_at: usize,
}

impl<K> Shard<K> {
    /// The shard's tables for lookups. A poisoned lock (a panic while it was held) is used
    /// as it is, so that one panic does not fail every later request on the shard.
    #[inline]
    fn read(&self) -> RwLockReadGuard<'_, ShardInner<K>> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The shard's tables for inserts and sweeps (poisoning as in [`Shard::read`]).
    fn write(&self) -> RwLockWriteGuard<'_, ShardInner<K>> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Counters of a [`MemoryStore`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Keys currently held.
    pub keys: usize,
    /// Keys dropped because their state was back to fresh (nothing lost).
    pub evicted_fresh: u64,
    /// Keys dropped at the cap while they still carried state (they restart full).
    pub evicted_with_state: u64,
}

impl<K, C> fmt::Debug for MemoryStore<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("policy", &self.policy)
            .field("shards", &self.shards.len())
            .field("max_keys", &(self.shard_cap * self.shards.len()))
            .finish_non_exhaustive()
    }
}

fn default_shards() -> usize {
    let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
    (cpus * 8).next_power_of_two().clamp(16, 256)
}

impl<K: Hash + Eq + Send + Sync + 'static> MemoryStore<K, MonotonicClock> {
    /// A store for `policy` with the monotonic clock and the default key cap.
    pub fn new(policy: impl Into<Policy>) -> Self {
        Self::build(
            policy.into(),
            MonotonicClock::new(),
            DEFAULT_MAX_KEYS,
            default_shards(),
        )
    }
}

impl<K: Hash + Eq + Send + Sync + 'static, C: Clock> MemoryStore<K, C> {
    fn build(policy: Policy, clock: C, max_keys: usize, shards: usize) -> Self {
        // At least one key per shard, and a power of two.
        let mut n = shards.next_power_of_two();
        while n > 1 && n > max_keys {
            n /= 2;
        }
        MemoryStore {
            gcra: policy.single_gcra().copied(),
            policy,
            clock,
            hasher: foldhash::fast::RandomState::default(),
            shards: (0..n)
                .map(|_| Shard {
                    inner: RwLock::new(ShardInner {
                        one: HashTable::new(),
                        many: HashTable::new(),
                        sweep_at: MIN_SWEEP,
                    }),
                })
                .collect(),
            shard_shift: n.trailing_zeros(),
            shard_cap: max_keys / n,
            evicted_fresh: AtomicU64::new(0),
            evicted_with_state: AtomicU64::new(0),
        }
    }

    /// Caps the number of keys held (rounded down to a multiple of the shard count).
    pub fn with_max_keys(self, max_keys: usize) -> Result<Self, ConfigError> {
        if max_keys == 0 {
            return Err(ConfigError::Store("max_keys must be at least 1".into()));
        }
        let shards = self.shards.len().max(default_shards());
        Ok(MemoryStore::build(
            self.policy,
            self.clock,
            max_keys,
            shards,
        ))
    }

    /// Uses another clock (a [`crate::clock::ManualClock`] in tests, a
    /// [`crate::clock::TokioClock`] under paused tokio time).
    pub fn with_clock<C2: Clock>(self, clock: C2) -> MemoryStore<K, C2> {
        let max = self.shard_cap * self.shards.len();
        MemoryStore::build(self.policy, clock, max, self.shards.len())
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The most keys this store holds.
    pub fn max_keys(&self) -> usize {
        self.shard_cap * self.shards.len()
    }

    /// Decides for `key` at the clock's now and charges `cost` when admitted.
    #[inline]
    pub fn check(&self, key: &K, cost: u64) -> Decision
    where
        K: Clone,
    {
        self.check_with(key, cost, || self.clock.now())
    }

    /// Decides without charging.
    #[inline]
    pub fn peek(&self, key: &K, cost: u64) -> Decision {
        self.peek_with(key, cost, || self.clock.now())
    }

    /// [`MemoryStore::check`] at an explicit time (nanoseconds of this store's clock).
    #[inline]
    pub fn check_at(&self, key: &K, cost: u64, now: u64) -> Decision
    where
        K: Clone,
    {
        self.check_with(key, cost, || now)
    }

    /// The check, with the clock read only once the key's state is in hand (see
    /// `Gcra::charge`).
    #[inline]
    fn check_with(&self, key: &K, cost: u64, now: impl Fn() -> u64 + Copy) -> Decision
    where
        K: Clone,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        if let Some(g) = &self.gcra {
            // The hot path: a known key under a single GCRA limit. The decision is built
            // once, here, straight into the caller's return slot.
            let found = {
                let inner = shard.read();
                inner
                    .one
                    .find(hash, |e| e.0 == *key)
                    .map(|e| g.charge(&e.1, now, cost))
            };
            if let Some((outcome, report)) = found {
                return Decision::single(outcome, report);
            }
        } else {
            let inner = shard.read();
            if let Some(d) = self.update_existing(&inner, hash, key, cost, now) {
                return d;
            }
        }
        self.check_new(shard, hash, key, cost, now)
    }

    #[cold]
    fn check_new(
        &self,
        shard: &Shard<K>,
        hash: u64,
        key: &K,
        cost: u64,
        now: impl Fn() -> u64 + Copy,
    ) -> Decision
    where
        K: Clone,
    {
        // Unknown key: a cost no fresh bucket admits is refused without a write (and
        // without the write lock).
        if self.policy.max_cost() < cost {
            return self.policy.eval(&[0; MAX_WORDS], now(), cost).0;
        }
        let mut inner = shard.write();
        if let Some(d) = self.update_existing(&inner, hash, key, cost, now) {
            return d; // inserted meanwhile by another thread
        }
        let now = now();
        let (decision, next) = self.policy.eval(&[0; MAX_WORDS], now, cost);
        let Some(next) = next else {
            return decision;
        };
        self.make_room(&mut inner, now);
        let hasher = &self.hasher;
        if self.gcra.is_some() {
            inner
                .one
                .insert_unique(hash, (key.clone(), AtomicU64::new(next[0])), |e| {
                    hasher.hash_one(&e.0)
                });
        } else {
            let words = next[..self.policy.state_words()].into();
            inner
                .many
                .insert_unique(hash, (key.clone(), Mutex::new(words)), |e| {
                    hasher.hash_one(&e.0)
                });
        }
        decision
    }

    /// [`MemoryStore::peek`] at an explicit time.
    pub fn peek_at(&self, key: &K, cost: u64, now: u64) -> Decision {
        self.peek_with(key, cost, || now)
    }

    /// The peek, with the clock read once the key's state is in hand (as in `check_with`).
    fn peek_with(&self, key: &K, cost: u64, now: impl Fn() -> u64) -> Decision {
        let hash = self.hasher.hash_one(key);
        let inner = self.shard(hash).read();
        if self.gcra.is_some() {
            let tat = inner
                .one
                .find(hash, |e| e.0 == *key)
                .map_or(0, |e| e.1.load(Ordering::Acquire));
            self.policy.peek(&[tat], now(), cost)
        } else if let Some(e) = inner.many.find(hash, |e| e.0 == *key) {
            let s = e.1.lock().unwrap_or_else(PoisonError::into_inner);
            self.policy.peek(&s, now(), cost)
        } else {
            self.policy.peek(&[0; MAX_WORDS], now(), cost)
        }
    }

    /// Gives back `cost` units charged to `key` (a dropped queued request).
    pub fn refund_at(&self, key: &K, cost: u64, now: u64) {
        self.refund_with(key, cost, || now);
    }

    fn refund_with(&self, key: &K, cost: u64, now: impl Fn() -> u64) {
        let hash = self.hasher.hash_one(key);
        let inner = self.shard(hash).read();
        if let Some(g) = &self.gcra {
            if let Some(e) = inner.one.find(hash, |e| e.0 == *key) {
                let _ = e.1.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                    Some(g.refund(t, cost))
                });
            }
        } else if let Some(e) = inner.many.find(hash, |e| e.0 == *key) {
            let mut s = e.1.lock().unwrap_or_else(PoisonError::into_inner);
            // The window the charge is in is decided under the key's lock.
            self.policy.refund(&mut s, now(), cost);
        }
    }

    /// Keys held and eviction counters.
    pub fn stats(&self) -> MemoryStats {
        let keys = self
            .shards
            .iter()
            .map(|s| {
                let i = s.read();
                i.one.len() + i.many.len()
            })
            .sum();
        MemoryStats {
            keys,
            evicted_fresh: self.evicted_fresh.load(Ordering::Relaxed),
            evicted_with_state: self.evicted_with_state.load(Ordering::Relaxed),
        }
    }

    /// Number of keys held.
    pub fn len(&self) -> usize {
        self.stats().keys
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every key whose state is back to fresh now. Never needed for boundedness
    /// (inserts sweep as they go); useful before measuring.
    pub fn sweep(&self) {
        let now = self.clock.now();
        for s in self.shards.iter() {
            let mut inner = s.write();
            self.sweep_fresh(&mut inner, now);
        }
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard<K> {
        // Bits 32.. are used neither by hashbrown's bucket index (low bits) nor by its
        // control tag (top 7 bits) at these table sizes.
        let i = if self.shard_shift == 0 {
            0
        } else {
            ((hash >> 32) as usize) & ((1 << self.shard_shift) - 1)
        };
        &self.shards[i]
    }

    #[inline]
    fn update_existing(
        &self,
        inner: &ShardInner<K>,
        hash: u64,
        key: &K,
        cost: u64,
        now: impl Fn() -> u64,
    ) -> Option<Decision> {
        if let Some(g) = &self.gcra {
            let cell = &inner.one.find(hash, |e| e.0 == *key)?.1;
            let (outcome, report) = g.charge(cell, now, cost);
            Some(Decision::single(outcome, report))
        } else {
            let cell = &inner.many.find(hash, |e| e.0 == *key)?.1;
            let mut s = cell.lock().unwrap_or_else(PoisonError::into_inner);
            // Under the key's lock, so no state written with a later clock is seen.
            Some(self.policy.decide(&mut s, now(), cost))
        }
    }

    fn sweep_fresh(&self, inner: &mut ShardInner<K>, now: u64) {
        let before = inner.one.len() + inner.many.len();
        inner.one.retain(|e| e.1.load(Ordering::Acquire) > now);
        let policy = &self.policy;
        inner.many.retain(|e| {
            let s = e.1.get_mut().unwrap_or_else(PoisonError::into_inner);
            !policy.is_fresh(s, now)
        });
        let after = inner.one.len() + inner.many.len();
        self.evicted_fresh
            .fetch_add((before - after) as u64, Ordering::Relaxed);
        inner.sweep_at = (after * 2).max(MIN_SWEEP);
    }

    /// Called with the shard write-locked before an insert.
    fn make_room(&self, inner: &mut ShardInner<K>, now: u64) {
        let len = inner.one.len() + inner.many.len();
        if len >= inner.sweep_at || len >= self.shard_cap {
            self.sweep_fresh(inner, now);
        }
        let len = inner.one.len() + inner.many.len();
        if len < self.shard_cap {
            return;
        }
        // Every key still carries state: evict the eighth closest to fresh.
        let target = (len / 8).max(1);
        let residual_one = |tat: u64| tat.saturating_sub(now);
        let policy = &self.policy;
        let residual_many = |s: &[u64]| {
            policy
                .peek(s, now, 0)
                .limits()
                .iter()
                .map(|l| l.reset_after().as_nanos() as u64)
                .max()
                .unwrap_or(0)
        };
        let mut residuals: Vec<u64> = inner
            .one
            .iter_mut()
            .map(|e| residual_one(*e.1.get_mut()))
            .chain(
                inner
                    .many
                    .iter_mut()
                    .map(|e| residual_many(e.1.get_mut().unwrap_or_else(PoisonError::into_inner))),
            )
            .collect();
        let (_, &mut threshold, _) = residuals.select_nth_unstable(target - 1);
        let mut left = target;
        let mut keep = |r: u64| {
            if left > 0 && r <= threshold {
                left -= 1;
                false
            } else {
                true
            }
        };
        inner.one.retain(|e| keep(residual_one(*e.1.get_mut())));
        inner.many.retain(|e| {
            keep(residual_many(
                e.1.get_mut().unwrap_or_else(PoisonError::into_inner),
            ))
        });
        self.evicted_with_state
            .fetch_add((target - left) as u64, Ordering::Relaxed);
    }
}

impl<K, C> Store<K> for MemoryStore<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    fn policy(&self) -> &Policy {
        &self.policy
    }

    #[inline]
    fn check(&self, key: &K, cost: u64) -> CheckFuture {
        CheckFuture::ready(Ok(MemoryStore::check(self, key, cost)))
    }

    fn peek(&self, key: &K, cost: u64) -> CheckFuture {
        CheckFuture::ready(Ok(MemoryStore::peek(self, key, cost)))
    }

    #[inline]
    fn check_now(&self, key: &K, cost: u64) -> Option<Decision> {
        Some(MemoryStore::check(self, key, cost))
    }

    fn refund(&self, key: &K, cost: u64) {
        self.refund_with(key, cost, || self.clock.now());
    }
}
