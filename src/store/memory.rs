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
    map::{self, default_shards, Both, Entry, KeyHasher, ShardInner, ShardedMap},
    tags::Tags,
    CheckFuture, Store, StoreFuture,
};
use crate::{
    algorithm::MAX_WORDS,
    clock::{Clock, TokioClock},
    decision::Decision,
    error::ConfigError,
    observe::StoreMetrics,
    policy::Policy,
};

/// The default memory budget of a store: 32 MiB.
pub const DEFAULT_MAX_BYTES: usize = 32 << 20;

/// The in-memory store: per-key state in a sharded hash table, within a memory budget.
///
/// - **Hot path.** A key already present costs one hash, one shared (read) lock of its
///   shard and, for a single GCRA-based limit (token bucket, leaky meter, leaky queue), one
///   compare-and-swap on one `u64`. Windows and multi-limit policies lock the key's own
///   small mutex instead. A refused request never writes.
/// - **Policies.** [`MemoryStore::new`] takes the policy its own [`check`](Self::check),
///   [`peek`](Self::peek) and [`refund`](Self::refund) apply; through the [`Store`] trait
///   every call names its policy. A key has one state, tagged with the policy it was last
///   written under; decided under another, it is carried over first (see
///   [`crate::policy`]).
/// - **Keys.** A key type that owns no heap memory (an IP address, an integer, `()`, a
///   tuple of those) is kept as it is. Any other (a `String`, a header value, a tuple with
///   one) is kept as a 96-bit keyed SipHash-1-3 digest of its `Hash` output: 12 bytes
///   whatever the key's length, and nothing of the request kept alive. Two such keys
///   share state only if their digests collide, which a keyed PRF makes a chance of about
///   `n^2 / 2^97` for `n` keys held (below 10^-17 at a million keys), not something a
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
    clock: C,
    label: std::sync::Arc<str>,
    keys: Keys<K>,
    tags: Tags,
}

/// How keys are kept: as they are, or as digests.
enum Keys<K> {
    Inline(Tables<K>, KeyHasher),
    Digest(Tables<Digest>, SipKeys),
}

/// A 96-bit keyed digest of a key's `Hash` output: twelve bytes, aligned to four, so that
/// with its tag and state an entry takes 24 bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Digest([u32; 3]);

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
        Digest([(d.h1 >> 32) as u32, d.h1 as u32, d.h2 as u32])
    }
}

impl Digest {
    #[inline]
    fn hash(&self) -> u64 {
        u64::from(self.0[0]) << 32 | u64::from(self.0[1])
    }
}

/// A single GCRA limit's state: the key, the tag of the policy it was written under, the
/// TAT.
type One<S> = (S, u32, AtomicU64);
/// Any other policy's state: the key, and under its lock the tag and the words.
type Many<S> = (S, Mutex<(u32, Box<[u64]>)>);

impl<S: Send + Sync> Entry for (S, u32, AtomicU64) {}
impl<S: Send + Sync> Entry for (S, Mutex<(u32, Box<[u64]>)>) {
    fn heap_bytes(&self) -> usize {
        let words = self
            .1
            .lock()
            .map_or_else(|e| e.into_inner().1.len(), |s| s.1.len());
        map::allocation_bytes(words * 8)
    }
}

type Tables<S> = ShardedMap<One<S>, Many<S>>;

/// Counters of a [`MemoryStore`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Keys currently held.
    pub keys: usize,
    /// Bytes held: the tables' allocations and multi-limit states (at most the budget).
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

/// What a decision does once it has the key's state in hand.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Check,
    Peek,
    Refund,
    /// Charges whatever the limits say (a settled cost above its estimate).
    Force,
    /// Forgets the key's state.
    Reset,
    /// Refuses the key for `cost` ns.
    Ban,
}

/// A store and a policy: what every table operation needs.
struct Ctx<'a> {
    policy: &'a Policy,
    tag: u32,
    tags: &'a Tags,
    /// The policy's limits in shadow for the key.
    shadow: u8,
}

impl Ctx<'_> {
    /// `state` (written under `tag`) as this policy's state at `now`.
    fn own(&self, tag: u32, state: &[u64; MAX_WORDS], now: u64) -> [u64; MAX_WORDS] {
        if tag == self.tag {
            return *state;
        }
        self.tags.carry(tag, state, self.policy, now)
    }
}

/// How far a single-limit state is from fresh.
fn residual_one<S>(now: u64) -> impl FnMut(&mut One<S>) -> u64 {
    move |e| e.2.get_mut().saturating_sub(now)
}

/// How far a multi-limit state is from fresh: 0 when fresh, else at least 1. A state
/// written under a policy the store no longer knows counts as fresh.
fn residual_many<'a, S>(tags: &'a Tags, now: u64) -> impl FnMut(&mut Many<S>) -> u64 + 'a {
    move |e| {
        let (tag, words) = e.1.get_mut().unwrap_or_else(PoisonError::into_inner);
        tags.with(*tag, |policy| match policy {
            None => 0,
            Some(p) if p.is_fresh(words, now) => 0,
            Some(p) => (p.report(words, now).reset_after().as_nanos() as u64).max(1),
        })
    }
}

impl<S: Eq + Clone + Send + Sync> Tables<S> {
    /// The decision, with the clock read only once the key's state is in hand (see
    /// `Gcra::charge`).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        cx: &Ctx<'_>,
        op: Op,
        key: &S,
        hash: u64,
        cost: u64,
        now: impl Fn() -> u64 + Copy,
        rehash: impl Fn(&S) -> u64 + Copy,
    ) -> Decision {
        match (cx.policy.single_gcra(), op) {
            (Some(g), Op::Check) => {
                // The hot path: a known key under a single GCRA limit, written under this
                // same policy. The decision is built once, here, in the caller's slot.
                let found = {
                    let inner = self.read(hash);
                    inner
                        .one
                        .find(hash, |e| e.0 == *key && e.1 == cx.tag)
                        .map(|e| g.charge(&e.2, now, cost))
                };
                if let Some((outcome, report)) = found {
                    return Decision::single_in(outcome, report, cx.shadow);
                }
            }
            (None, Op::Check) => {
                let inner = self.read(hash);
                if let Some(d) = Self::in_many(cx, &inner, key, hash, now, |p, s, now| {
                    p.decide(s, now, cost)
                }) {
                    return d;
                }
            }
            (_, Op::Peek) => {
                let inner = self.read(hash);
                if let Some(e) = inner.one.find(hash, |e| e.0 == *key && e.1 == cx.tag) {
                    let tat = e.2.load(Ordering::Acquire);
                    return cx.policy.eval(&[tat], now(), cost).0;
                }
                if let Some(d) = Self::in_many(cx, &inner, key, hash, now, |p, s, now| {
                    p.eval(s, now, cost).0
                }) {
                    return d;
                }
            }
            (g, Op::Refund) => {
                let inner = self.read(hash);
                if let (Some(g), Some(e)) =
                    (g, inner.one.find(hash, |e| e.0 == *key && e.1 == cx.tag))
                {
                    let _ = e.2.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                        Some(g.refund(t, cost))
                    });
                    return Decision::without_state(
                        crate::decision::Outcome::Allowed {
                            wait: std::time::Duration::ZERO,
                        },
                        crate::decision::Source::Local,
                        1,
                    );
                }
                if let Some(d) = Self::in_many(cx, &inner, key, hash, now, |p, s, now| {
                    // The window the charge is in is decided under the key's lock.
                    p.refund(s, now, cost);
                    p.report(s, now)
                }) {
                    return d;
                }
            }
            // Rare: under the shard's write lock.
            (_, Op::Force | Op::Reset | Op::Ban) => {}
        }
        self.run_cold(cx, op, key, hash, cost, now, rehash)
    }

    /// A multi-limit state written under this policy, updated under its lock.
    #[inline]
    fn in_many(
        cx: &Ctx<'_>,
        inner: &ShardInner<One<S>, Many<S>>,
        key: &S,
        hash: u64,
        now: impl Fn() -> u64,
        f: impl FnOnce(&Policy, &mut [u64], u64) -> Decision,
    ) -> Option<Decision> {
        let cell = &inner.many.find(hash, |e| e.0 == *key)?.1;
        let mut s = cell.lock().unwrap_or_else(PoisonError::into_inner);
        if s.0 != cx.tag {
            return None;
        }
        // Under the key's lock, so no state written with a later clock is seen.
        Some(f(cx.policy, &mut s.1, now()))
    }

    /// Every other case, under the shard's write lock: a key not known yet, known under
    /// another policy (its state carried over first), or in the other table.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn run_cold(
        &self,
        cx: &Ctx<'_>,
        op: Op,
        key: &S,
        hash: u64,
        cost: u64,
        now: impl Fn() -> u64 + Copy,
        rehash: impl Fn(&S) -> u64 + Copy,
    ) -> Decision {
        let policy = cx.policy;
        // An unknown key asking for a cost no fresh bucket admits is refused without a
        // write (and without the write lock); not when limits in shadow may let it
        // through to be charged by the others.
        if op == Op::Check && policy.max_cost() < cost && cx.shadow == 0 {
            let inner = self.read(hash);
            let known = inner.one.find(hash, |e| e.0 == *key).is_some()
                || inner.many.find(hash, |e| e.0 == *key).is_some();
            if !known {
                return policy.eval(&[0; MAX_WORDS], now(), cost).0;
            }
        }
        if op == Op::Peek {
            // A look changes nothing: the state as this policy would see it.
            let inner = self.read(hash);
            let now = now();
            let state =
                Self::found(&inner, key, hash).map_or([0; MAX_WORDS], |(t, s)| cx.own(t, &s, now));
            return policy.eval(&state, now, cost).0;
        }
        let mut inner = self.write(hash);
        let now = now();
        let found = Self::found(&inner, key, hash);
        let known = found.is_some();
        if let Ok(e) = inner.one.find_entry(hash, |e| e.0 == *key) {
            e.remove();
            self.removed(&mut inner, 0);
        } else if let Ok(e) = inner.many.find_entry(hash, |e| e.0 == *key) {
            let ((_, cell), _) = e.remove();
            let (_, words) = cell.into_inner().unwrap_or_else(PoisonError::into_inner);
            self.removed(&mut inner, map::allocation_bytes(words.len() * 8));
        }
        if op == Op::Reset {
            return policy.eval(&[0; MAX_WORDS], now, 0).0;
        }
        // The state stays under the policy that wrote it when that one belongs to a set
        // installed after this request's (it began before a swap): decided on the state as
        // its policy sees it, it is charged to the state as it is. Converting the state
        // back would cap it at the old limit, and the next request, converting it forward
        // again, would find units given back.
        let newer = found
            .filter(|&(tag, _)| op == Op::Check && tag != cx.tag && cx.tags.newer(tag, cx.tag))
            .and_then(|(tag, s)| Some((tag, cx.tags.policy(tag)?, s)));
        let (tag, owner, state, decision) = if let Some((t, p, mut s)) = newer {
            let d = policy.decide(&mut cx.own(t, &s, now), now, cost);
            if d.is_allowed() {
                p.force(&mut s, now, cost);
            }
            (t, p, s, d)
        } else {
            let mut s = found.map_or([0; MAX_WORDS], |(t, s)| cx.own(t, &s, now));
            let d = match op {
                Op::Check => policy.decide(&mut s, now, cost),
                Op::Peek => policy.eval(&s, now, cost).0,
                Op::Refund => {
                    policy.refund(&mut s, now, cost);
                    policy.report(&s, now)
                }
                Op::Force => {
                    policy.force(&mut s, now, cost);
                    policy.report(&s, now)
                }
                Op::Ban => {
                    policy.ban(&mut s, now, cost);
                    policy.report(&s, now)
                }
                Op::Reset => unreachable!("returned above"),
            };
            (cx.tag, policy.clone(), s, d)
        };
        // A state back to fresh is not stored; nor is an unknown key merely looked at.
        if owner.is_fresh(&state, now) || (!known && matches!(op, Op::Peek | Op::Refund)) {
            return decision;
        }
        let residuals = Both(residual_one::<S>(now), residual_many::<S>(cx.tags, now));
        if owner.single_gcra().is_some() {
            let entry = (key.clone(), tag, AtomicU64::new(state[0]));
            self.insert_one(&mut inner, hash, entry, |e| rehash(&e.0), residuals);
        } else {
            let words: Box<[u64]> = state[..owner.state_words()].into();
            let entry = (key.clone(), Mutex::new((tag, words)));
            self.insert_many(&mut inner, hash, entry, |e| rehash(&e.0), residuals);
        }
        decision
    }

    /// The key's state from either table, with the tag of the policy that wrote it.
    fn found(
        inner: &ShardInner<One<S>, Many<S>>,
        key: &S,
        hash: u64,
    ) -> Option<(u32, [u64; MAX_WORDS])> {
        let mut s = [0; MAX_WORDS];
        if let Some(e) = inner.one.find(hash, |e| e.0 == *key) {
            s[0] = e.2.load(Ordering::Acquire);
            return Some((e.1, s));
        }
        let e = inner.many.find(hash, |e| e.0 == *key)?;
        let cell = e.1.lock().unwrap_or_else(PoisonError::into_inner);
        s[..cell.1.len()].copy_from_slice(&cell.1);
        Some((cell.0, s))
    }

    fn stats(&self) -> MemoryStats {
        let (keys, bytes) = self.usage();
        MemoryStats {
            keys,
            bytes,
            evicted_fresh: self.evictions.fresh.load(Ordering::Relaxed),
            evicted_with_state: self.evictions.with_state.load(Ordering::Relaxed),
        }
    }
}

impl<K, C> MemoryStore<K, C> {
    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The policy of the store's own [`check`](Self::check), [`peek`](Self::peek) and
    /// [`refund`](Self::refund).
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

    /// The most keys of a single GCRA limit the budget can hold at once.
    pub fn max_keys(&self) -> usize {
        match &self.keys {
            Keys::Inline(t, _) => t.max_keys(),
            Keys::Digest(t, _) => t.max_keys(),
        }
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> MemoryStore<K, TokioClock> {
    /// A store whose own methods apply `policy`, on tokio's clock (so paused-time tests
    /// drive it) with the default memory budget ([`DEFAULT_MAX_BYTES`]).
    pub fn new(policy: impl Into<Policy>) -> Self {
        let policy = policy.into();
        Self::build(
            policy,
            TokioClock::new(),
            DEFAULT_MAX_BYTES,
            "memory".into(),
        )
        .expect("the default budget holds keys of any type")
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> MemoryStore<K, TokioClock> {
    /// The store a layer builds for itself: its metrics under the layer's label from the
    /// start (`new` then `with_label` would leave an empty `memory` series behind).
    pub(crate) fn for_layer(
        policy: Policy,
        label: &str,
        max_bytes: Option<usize>,
    ) -> Result<Self, ConfigError> {
        Self::build(
            policy,
            TokioClock::new(),
            max_bytes.unwrap_or(DEFAULT_MAX_BYTES),
            label.into(),
        )
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> MemoryStore<K, C> {
    fn build(
        policy: Policy,
        clock: C,
        max_bytes: usize,
        label: std::sync::Arc<str>,
    ) -> Result<Self, ConfigError> {
        let shards = default_shards();
        let metrics = StoreMetrics::new(&label);
        let keys = if std::mem::needs_drop::<K>() {
            Keys::Digest(
                ShardedMap::new(max_bytes, shards, metrics)?,
                SipKeys::random(),
            )
        } else {
            Keys::Inline(
                ShardedMap::new(max_bytes, shards, metrics)?,
                KeyHasher::default(),
            )
        };
        Ok(MemoryStore {
            policy,
            clock,
            label,
            keys,
            tags: Tags::new(),
        })
    }

    /// Bounds the memory the store holds, in bytes (default [`DEFAULT_MAX_BYTES`]). Keys
    /// held so far are dropped.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Store`] when the budget cannot hold a single key.
    pub fn with_max_bytes(self, max_bytes: usize) -> Result<Self, ConfigError> {
        MemoryStore::build(self.policy, self.clock, max_bytes, self.label)
    }

    /// Names the store in metrics (`tollgate.store`, default `memory`; a layer names the
    /// store it builds after itself). Keys held so far are dropped.
    pub fn with_label(self, label: &str) -> Self {
        let max = self.max_bytes();
        MemoryStore::build(self.policy, self.clock, max, label.into())
            .expect("the budget held keys before")
    }

    /// Uses another clock (a [`crate::clock::ManualClock`] in tests). Keys held so far are
    /// dropped.
    pub fn with_clock<C2: Clock>(self, clock: C2) -> MemoryStore<K, C2> {
        let max = self.max_bytes();
        MemoryStore::build(self.policy, clock, max, self.label)
            .expect("the budget held keys before")
    }

    #[inline]
    fn run(&self, op: Op, key: &K, policy: &Policy, cost: u64) -> Decision {
        let cx = Ctx {
            policy,
            tag: self.tags.tag(policy),
            tags: &self.tags,
            shadow: policy.shadow_mask(),
        };
        let now = || self.clock.now();
        match &self.keys {
            Keys::Inline(t, h) => t.run(&cx, op, key, map::hash_of(h, key), cost, now, |k| {
                map::hash_of(h, k)
            }),
            Keys::Digest(t, sip) => {
                let d = sip.digest(key);
                t.run(&cx, op, &d, d.hash(), cost, now, Digest::hash)
            }
        }
    }

    /// Decides for `key` under the store's policy at the clock's now and charges `cost`
    /// when admitted.
    #[inline]
    pub fn check(&self, key: &K, cost: u64) -> Decision {
        self.run(Op::Check, key, &self.policy, cost)
    }

    /// Decides without charging: what [`MemoryStore::check`] would answer now. A cost of 0
    /// reports the key's state as it is.
    #[inline]
    pub fn peek(&self, key: &K, cost: u64) -> Decision {
        self.run(Op::Peek, key, &self.policy, cost)
    }

    /// Gives back `cost` units charged to `key` (a queued request dropped before its slot).
    pub fn refund(&self, key: &K, cost: u64) {
        self.run(Op::Refund, key, &self.policy, cost);
    }

    /// Settles a request charged `reserved` units whose real cost is `actual`: charges
    /// the difference whatever the limit, or gives it back. See [`Store::settle`].
    pub fn settle(&self, key: &K, reserved: u64, actual: u64) {
        self.settle_with(key, &self.policy, reserved, actual);
    }

    fn settle_with(&self, key: &K, policy: &Policy, reserved: u64, actual: u64) {
        match actual.cmp(&reserved) {
            std::cmp::Ordering::Greater => self.run(Op::Force, key, policy, actual - reserved),
            std::cmp::Ordering::Less => self.run(Op::Refund, key, policy, reserved - actual),
            std::cmp::Ordering::Equal => return,
        };
    }

    /// Forgets `key`'s state: its next request finds it fresh.
    pub fn reset(&self, key: &K) {
        self.run(Op::Reset, key, &self.policy, 0);
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
        let r = &self.tags;
        match &self.keys {
            Keys::Inline(t, _) => t.sweep(Both(residual_one::<K>(now), residual_many::<K>(r, now))),
            Keys::Digest(t, _) => t.sweep(Both(
                residual_one::<Digest>(now),
                residual_many::<Digest>(r, now),
            )),
        }
    }
}

impl<K, C> Store<K> for MemoryStore<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    fn default_policy(&self) -> Option<Policy> {
        Some(self.policy.clone())
    }

    #[inline]
    fn decide(&self, key: &K, policy: &Policy, cost: u64) -> CheckFuture {
        CheckFuture::ready(Ok(self.run(Op::Check, key, policy, cost)))
    }

    fn preview(&self, key: &K, policy: &Policy, cost: u64) -> CheckFuture {
        CheckFuture::ready(Ok(self.run(Op::Peek, key, policy, cost)))
    }

    #[inline]
    fn decide_now(&self, key: &K, policy: &Policy, cost: u64) -> Option<Decision> {
        Some(self.run(Op::Check, key, policy, cost))
    }

    fn policies_installed(&self, set: &crate::policy::PolicySet) {
        self.tags.installed(set.policies());
    }

    fn refund(&self, key: &K, policy: &Policy, cost: u64) {
        self.run(Op::Refund, key, policy, cost);
    }

    fn settle(&self, key: &K, policy: &Policy, reserved: u64, actual: u64) -> StoreFuture<()> {
        self.settle_with(key, policy, reserved, actual);
        StoreFuture::ready(Ok(()))
    }

    fn reset(&self, key: &K) -> StoreFuture<()> {
        MemoryStore::reset(self, key);
        StoreFuture::ready(Ok(()))
    }

    fn ban(&self, key: &K, policy: &Policy, ban: std::time::Duration) -> StoreFuture<()> {
        let ns = u64::try_from(ban.as_nanos()).unwrap_or(u64::MAX);
        self.run(Op::Ban, key, policy, ns);
        StoreFuture::ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{algorithm::Limit, clock::ManualClock, quota::Quota};

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

    /// A key moves between the tables as its policy changes, its state carried over.
    #[test]
    fn a_key_keeps_its_state_across_policies_and_tables() {
        let free = Policy::new(Limit::token_bucket(Quota::per_minute(10).unwrap()).unwrap());
        let pro = Policy::new(Limit::token_bucket(Quota::per_minute(100).unwrap()).unwrap());
        let daily = Limit::fixed_window(Quota::per_day(1000).unwrap()).unwrap();
        let pro_daily = Policy::from_limits([
            Limit::token_bucket(Quota::per_minute(100).unwrap()).unwrap(),
            daily,
        ])
        .unwrap();
        let s = MemoryStore::<u32, _>::new(free.clone()).with_clock(ManualClock::at(
            std::time::Duration::from_secs(1_700_000_000),
        ));
        for _ in 0..4 {
            assert!(s.check(&7, 1).is_allowed());
        }
        let decide = |p: &Policy| s.run(Op::Check, &7, p, 1);
        // 4 spent of 10; under pro, 4 of 100 stay spent: 95 left after this one.
        assert_eq!(decide(&pro).remaining(), 95);
        // Into the multi-limit table: the bucket's 5 carry, the new daily window starts.
        let d = decide(&pro_daily);
        assert_eq!(d.limits()[0].remaining(), 94);
        assert_eq!(d.limits()[1].remaining(), 999);
        assert_eq!(s.len(), 1, "one state per key");
        // Back under free: 6 units outstanding, so 4 left.
        assert_eq!(decide(&free).remaining(), 3);
    }
}
