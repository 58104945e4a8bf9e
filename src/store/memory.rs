//! The in-memory keyed store: sharded, lock-free on the hot path, bounded in bytes.

use std::{
    fmt,
    hash::Hash,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex, PoisonError,
    },
};

use siphasher::sip128::{Hasher128, SipHasher13};

use super::{
    map::{self, default_shards, Entry, KeyHasher, ShardInner, ShardedMap},
    CheckFuture, Store,
};
use crate::{
    algorithm::{Gcra, MAX_WORDS},
    clock::{Clock, TokioClock},
    decision::Decision,
    error::ConfigError,
    Policy,
};

/// The default memory budget of a store: 32 MiB.
pub const DEFAULT_MAX_BYTES: usize = 32 << 20;

/// The in-memory store: per-key state in a sharded hash table, within a memory budget.
///
/// - **Hot path.** A key already present costs one hash, one shared (read) lock of its
///   shard and, for a single GCRA-based limit (token bucket, leaky meter, leaky queue), one
///   compare-and-swap on one `u64`. Windows and multi-limit policies lock the key's own
///   small mutex instead. A refused request never writes.
/// - **Keys.** A key type that owns no heap memory (an IP address, an integer, `()`, a
///   tuple of those) is kept as it is. Any other (a `String`, a header value, a tuple with
///   one) is kept as a 128-bit keyed SipHash-1-3 digest of its `Hash` output: 16 bytes
///   whatever the key's length, and nothing of the request kept alive. Two such keys
///   share state only if their digests collide, which a keyed PRF makes a chance of about
///   `n^2 / 2^129` for `n` keys held (below 10^-26 at a million keys), not something a
///   client can aim for.
/// - **Bounded memory, no sweeper task.** Memory is bounded in bytes
///   ([`MemoryStore::with_max_bytes`], default [`DEFAULT_MAX_BYTES`]): the tables'
///   allocations count against the budget, split evenly over the shards. A shard that has
///   doubled since its last sweep drops every key whose state is back to fresh
///   (indistinguishable from a key never seen): amortized O(1) per insert. When an insert
///   would not fit, a new key first triggers that sweep; if every key still carries
///   state, the keys closest to fresh are evicted and counted in
///   [`MemoryStats::evicted_with_state`] (such a key restarts with a full bucket).
///   `BENCHMARKS.md` gives the bytes per key by key type.
///
/// See the [module docs](super) for an example.
pub struct MemoryStore<K, C = TokioClock> {
    policy: Policy,
    gcra: Option<Gcra>,
    clock: C,
    keys: Keys<K>,
}

/// How keys are kept: as they are, or as digests.
enum Keys<K> {
    Inline(Tables<K>, KeyHasher),
    Digest(Tables<Digest>, SipKeys),
}

/// A 128-bit keyed digest of a key's `Hash` output.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Digest([u64; 2]);

/// The digest's random keys, drawn once per store.
#[derive(Clone, Copy)]
struct SipKeys(u64, u64);

impl SipKeys {
    fn random() -> Self {
        // std's RandomState is seeded from the OS once per thread; two fresh states give
        // two independent 64-bit outputs.
        let draw = |i: u64| std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), i);
        SipKeys(draw(0), draw(1))
    }

    #[inline]
    fn digest<K: Hash + ?Sized>(&self, key: &K) -> Digest {
        let mut h = SipHasher13::new_with_keys(self.0, self.1);
        key.hash(&mut h);
        let d = h.finish128();
        Digest([d.h1, d.h2])
    }
}

impl Digest {
    #[inline]
    fn hash(&self) -> u64 {
        self.0[0]
    }
}

/// One store's tables: a single GCRA limit keeps one atomic word per key, other policies a
/// small locked state.
enum Tables<S> {
    Single(ShardedMap<(S, AtomicU64)>),
    Multi(ShardedMap<(S, Mutex<Box<[u64]>>)>),
}

impl<S: Send + Sync> Entry for (S, AtomicU64) {}
impl<S: Send + Sync> Entry for (S, Mutex<Box<[u64]>>) {}

/// Counters of a [`MemoryStore`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Keys currently held.
    pub keys: usize,
    /// Bytes held: the tables' allocations (at most the budget).
    pub bytes: usize,
    /// Keys dropped because their state was back to fresh (nothing lost).
    pub evicted_fresh: u64,
    /// Keys dropped to stay within the budget while they still carried state (they restart
    /// full).
    pub evicted_with_state: u64,
}

impl<K, C> fmt::Debug for MemoryStore<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("policy", &self.policy)
            .field("max_bytes", &self.max_bytes())
            .field(
                "keys_as",
                &match self.keys {
                    Keys::Inline(..) => "inline",
                    Keys::Digest(..) => "digest",
                },
            )
            .finish_non_exhaustive()
    }
}

impl<S: Send + Sync> Tables<S> {
    fn new(policy: &Policy, max_bytes: usize) -> Result<Self, ConfigError> {
        Ok(if policy.single_gcra().is_some() {
            Tables::Single(ShardedMap::new(max_bytes, default_shards())?)
        } else {
            Tables::Multi(ShardedMap::new(max_bytes, default_shards())?)
        })
    }
}

impl<S> Tables<S> {
    fn budget(&self) -> usize {
        match self {
            Tables::Single(m) => m.budget(),
            Tables::Multi(m) => m.budget(),
        }
    }

    fn max_keys(&self) -> usize {
        match self {
            Tables::Single(m) => m.max_keys(),
            Tables::Multi(m) => m.max_keys(),
        }
    }

    fn stats(&self) -> MemoryStats {
        let ((keys, bytes), ev) = match self {
            Tables::Single(m) => (m.usage(), &m.evictions),
            Tables::Multi(m) => (m.usage(), &m.evictions),
        };
        MemoryStats {
            keys,
            bytes,
            evicted_fresh: ev.fresh.load(Ordering::Relaxed),
            evicted_with_state: ev.with_state.load(Ordering::Relaxed),
        }
    }
}

impl<S: Eq + Clone + Send + Sync> Tables<S> {
    /// The check, with the clock read only once the key's state is in hand (see
    /// `Gcra::charge`).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn check(
        &self,
        policy: &Policy,
        gcra: Option<&Gcra>,
        key: &S,
        hash: u64,
        cost: u64,
        now: impl Fn() -> u64 + Copy,
        rehash: impl Fn(&S) -> u64,
    ) -> Decision {
        match (self, gcra) {
            (Tables::Single(map), Some(g)) => {
                // The hot path: a known key under a single GCRA limit. The decision is built
                // once, here, straight into the caller's return slot.
                let found = {
                    let inner = map.read(hash);
                    inner
                        .table
                        .find(hash, |e| e.0 == *key)
                        .map(|e| g.charge(&e.1, now, cost))
                };
                if let Some((outcome, report)) = found {
                    return Decision::single(outcome, report);
                }
                self.check_new(policy, gcra, key, hash, cost, now, rehash)
            }
            (Tables::Multi(map), _) => {
                if let Some(d) = Self::update_many(policy, &map.read(hash), key, hash, cost, now) {
                    return d;
                }
                self.check_new(policy, gcra, key, hash, cost, now, rehash)
            }
            // Tables are built for the store's policy: single only with one GCRA limit.
            (Tables::Single(_), None) => policy.eval(&[0; MAX_WORDS], now(), cost).0,
        }
    }

    #[inline]
    fn update_many(
        policy: &Policy,
        inner: &ShardInner<(S, Mutex<Box<[u64]>>)>,
        key: &S,
        hash: u64,
        cost: u64,
        now: impl Fn() -> u64,
    ) -> Option<Decision> {
        let cell = &inner.table.find(hash, |e| e.0 == *key)?.1;
        let mut s = cell.lock().unwrap_or_else(PoisonError::into_inner);
        // Under the key's lock, so no state written with a later clock is seen.
        Some(policy.decide(&mut s, now(), cost))
    }

    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn check_new(
        &self,
        policy: &Policy,
        gcra: Option<&Gcra>,
        key: &S,
        hash: u64,
        cost: u64,
        now: impl Fn() -> u64 + Copy,
        rehash: impl Fn(&S) -> u64,
    ) -> Decision {
        // Unknown key: a cost no fresh bucket admits is refused without a write (and
        // without the write lock).
        if policy.max_cost() < cost {
            return policy.eval(&[0; MAX_WORDS], now(), cost).0;
        }
        match self {
            Tables::Single(map) => {
                let mut inner = map.write(hash);
                if let (Some(e), Some(g)) = (inner.table.find(hash, |e| e.0 == *key), gcra) {
                    // Inserted meanwhile by another thread.
                    let (outcome, report) = g.charge(&e.1, now, cost);
                    return Decision::single(outcome, report);
                }
                let now = now();
                let (decision, next) = policy.eval(&[0; MAX_WORDS], now, cost);
                if let Some(next) = next.filter(|n| !policy.is_fresh(n, now)) {
                    let entry = (key.clone(), AtomicU64::new(next[0]));
                    map.insert(
                        &mut inner,
                        hash,
                        entry,
                        |e| rehash(&e.0),
                        |e: &mut (S, AtomicU64)| e.1.get_mut().saturating_sub(now),
                    );
                }
                decision
            }
            Tables::Multi(map) => {
                let mut inner = map.write(hash);
                if let Some(d) = Self::update_many(policy, &inner, key, hash, cost, now) {
                    return d;
                }
                let now = now();
                let (decision, next) = policy.eval(&[0; MAX_WORDS], now, cost);
                if let Some(next) = next.filter(|n| !policy.is_fresh(n, now)) {
                    let words = next[..policy.state_words()].into();
                    map.insert(
                        &mut inner,
                        hash,
                        (key.clone(), Mutex::new(words)),
                        |e| rehash(&e.0),
                        |e: &mut (S, Mutex<Box<[u64]>>)| residual_many(policy, e.1.get_mut(), now),
                    );
                }
                decision
            }
        }
    }

    /// The peek, with the clock read once the key's state is in hand (as in `check`).
    fn peek(
        &self,
        policy: &Policy,
        key: &S,
        hash: u64,
        cost: u64,
        now: impl Fn() -> u64,
    ) -> Decision {
        match self {
            Tables::Single(map) => {
                let inner = map.read(hash);
                let tat = inner
                    .table
                    .find(hash, |e| e.0 == *key)
                    .map_or(0, |e| e.1.load(Ordering::Acquire));
                policy.peek(&[tat], now(), cost)
            }
            Tables::Multi(map) => {
                let inner = map.read(hash);
                if let Some(e) = inner.table.find(hash, |e| e.0 == *key) {
                    let s = e.1.lock().unwrap_or_else(PoisonError::into_inner);
                    policy.peek(&s, now(), cost)
                } else {
                    policy.peek(&[0; MAX_WORDS], now(), cost)
                }
            }
        }
    }

    fn refund(
        &self,
        policy: &Policy,
        gcra: Option<&Gcra>,
        key: &S,
        hash: u64,
        cost: u64,
        now: impl Fn() -> u64,
    ) {
        match (self, gcra) {
            (Tables::Single(map), Some(g)) => {
                let inner = map.read(hash);
                if let Some(e) = inner.table.find(hash, |e| e.0 == *key) {
                    let _ = e.1.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                        Some(g.refund(t, cost))
                    });
                }
            }
            (Tables::Multi(map), _) => {
                let inner = map.read(hash);
                if let Some(e) = inner.table.find(hash, |e| e.0 == *key) {
                    let mut s = e.1.lock().unwrap_or_else(PoisonError::into_inner);
                    // The window the charge is in is decided under the key's lock.
                    policy.refund(&mut s, now(), cost);
                }
            }
            (Tables::Single(_), None) => {}
        }
    }

    fn sweep(&self, policy: &Policy, now: u64) {
        match self {
            Tables::Single(map) => {
                map.sweep(|e: &mut (S, AtomicU64)| e.1.get_mut().saturating_sub(now))
            }
            Tables::Multi(map) => map
                .sweep(|e: &mut (S, Mutex<Box<[u64]>>)| residual_many(policy, e.1.get_mut(), now)),
        }
    }
}

/// How far a multi-limit state is from fresh: 0 when fresh, else the time until every
/// limit is restored (at least 1).
fn residual_many(
    policy: &Policy,
    state: Result<&mut Box<[u64]>, PoisonError<&mut Box<[u64]>>>,
    now: u64,
) -> u64 {
    let s = state.unwrap_or_else(PoisonError::into_inner);
    if policy.is_fresh(s, now) {
        0
    } else {
        let d = policy.peek(s, now, 0);
        (d.reset_after().as_nanos() as u64).max(1)
    }
}

impl<K, C> MemoryStore<K, C> {
    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The memory budget, in bytes (rounded down to a multiple of the shard count).
    pub fn max_bytes(&self) -> usize {
        match &self.keys {
            Keys::Inline(t, _) => t.budget(),
            Keys::Digest(t, _) => t.budget(),
        }
    }

    /// The most keys the budget can hold at once.
    pub fn max_keys(&self) -> usize {
        match &self.keys {
            Keys::Inline(t, _) => t.max_keys(),
            Keys::Digest(t, _) => t.max_keys(),
        }
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> MemoryStore<K, TokioClock> {
    /// A store for `policy` on tokio's clock (so paused-time tests drive it) with the
    /// default memory budget ([`DEFAULT_MAX_BYTES`]).
    pub fn new(policy: impl Into<Policy>) -> Self {
        let policy = policy.into();
        Self::build(policy, TokioClock::new(), DEFAULT_MAX_BYTES)
            .expect("the default budget holds keys of any type")
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> MemoryStore<K, C> {
    fn build(policy: Policy, clock: C, max_bytes: usize) -> Result<Self, ConfigError> {
        let keys = if std::mem::needs_drop::<K>() {
            Keys::Digest(Tables::new(&policy, max_bytes)?, SipKeys::random())
        } else {
            Keys::Inline(Tables::new(&policy, max_bytes)?, KeyHasher::default())
        };
        Ok(MemoryStore {
            gcra: policy.single_gcra().copied(),
            policy,
            clock,
            keys,
        })
    }

    /// Bounds the memory the store holds, in bytes (default [`DEFAULT_MAX_BYTES`]). Keys
    /// held so far are dropped.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Store`] when the budget cannot hold a single key.
    pub fn with_max_bytes(self, max_bytes: usize) -> Result<Self, ConfigError> {
        MemoryStore::build(self.policy, self.clock, max_bytes)
    }

    /// Uses another clock (a [`crate::clock::ManualClock`] in tests). Keys held so far are
    /// dropped.
    pub fn with_clock<C2: Clock>(self, clock: C2) -> MemoryStore<K, C2> {
        let max = self.max_bytes();
        MemoryStore::build(self.policy, clock, max).expect("the budget held keys before")
    }

    /// Decides for `key` at the clock's now and charges `cost` when admitted.
    #[inline]
    pub fn check(&self, key: &K, cost: u64) -> Decision {
        let now = || self.clock.now();
        let (policy, gcra) = (&self.policy, self.gcra.as_ref());
        match &self.keys {
            Keys::Inline(t, h) => {
                t.check(policy, gcra, key, map::hash_of(h, key), cost, now, |k| {
                    map::hash_of(h, k)
                })
            }
            Keys::Digest(t, sip) => {
                let d = sip.digest(key);
                t.check(policy, gcra, &d, d.hash(), cost, now, Digest::hash)
            }
        }
    }

    /// Decides without charging: what [`MemoryStore::check`] would answer now. A cost of 0
    /// reports the key's state as it is.
    #[inline]
    pub fn peek(&self, key: &K, cost: u64) -> Decision {
        let now = || self.clock.now();
        match &self.keys {
            Keys::Inline(t, h) => t.peek(&self.policy, key, map::hash_of(h, key), cost, now),
            Keys::Digest(t, sip) => {
                let d = sip.digest(key);
                t.peek(&self.policy, &d, d.hash(), cost, now)
            }
        }
    }

    /// Gives back `cost` units charged to `key` (a queued request dropped before its slot).
    pub fn refund(&self, key: &K, cost: u64) {
        let now = || self.clock.now();
        let (policy, gcra) = (&self.policy, self.gcra.as_ref());
        match &self.keys {
            Keys::Inline(t, h) => t.refund(policy, gcra, key, map::hash_of(h, key), cost, now),
            Keys::Digest(t, sip) => {
                let d = sip.digest(key);
                t.refund(policy, gcra, &d, d.hash(), cost, now)
            }
        }
    }

    /// Keys and bytes held, and eviction counters.
    pub fn stats(&self) -> MemoryStats {
        match &self.keys {
            Keys::Inline(t, _) => t.stats(),
            Keys::Digest(t, _) => t.stats(),
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
        match &self.keys {
            Keys::Inline(t, _) => t.sweep(&self.policy, now),
            Keys::Digest(t, _) => t.sweep(&self.policy, now),
        }
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
    fn decide(&self, key: &K, cost: u64) -> CheckFuture {
        CheckFuture::ready(Ok(self.check(key, cost)))
    }

    fn preview(&self, key: &K, cost: u64) -> CheckFuture {
        CheckFuture::ready(Ok(self.peek(key, cost)))
    }

    #[inline]
    fn decide_now(&self, key: &K, cost: u64) -> Option<Decision> {
        Some(self.check(key, cost))
    }

    fn refund(&self, key: &K, cost: u64) {
        MemoryStore::refund(self, key, cost);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{clock::ManualClock, Limit, Quota};

    #[test]
    fn heap_keys_are_digests_and_plain_keys_are_kept_as_they_are() {
        let p = Policy::new(Limit::token_bucket(Quota::per_second(1).unwrap()).unwrap());
        let s: MemoryStore<String> = MemoryStore::new(p.clone());
        assert!(format!("{s:?}").contains("digest"));
        let s: MemoryStore<Option<std::net::IpAddr>> = MemoryStore::new(p);
        assert!(format!("{s:?}").contains("inline"));
    }

    #[test]
    fn digests_keep_keys_apart() {
        let p = Policy::new(Limit::token_bucket(Quota::per_hour(1).unwrap()).unwrap());
        let s = MemoryStore::<String, _>::new(p).with_clock(ManualClock::new());
        for i in 0..10_000 {
            assert!(s.check(&format!("k{i}"), 1).is_allowed(), "key {i}");
        }
        assert!(!s.check(&"k17".to_owned(), 1).is_allowed());
        assert_eq!(s.len(), 10_000);
    }
}
