//! The in-memory keyed store: sharded, lock-free on the hot path, bounded in bytes.

use std::{fmt, hash::Hash};

use super::map::{self, default_shards, Both, KeyHasher, ShardedMap};
use super::tables::{
    residual_many, residual_one, Call, Ctx, Digest, Keys, MemoryStats, Op, SipKeys,
};
use super::tags::Tags;
use super::CheckFuture;
use super::Store;
use super::StoreFuture;
use crate::clock::{Clock, TokioClock};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::observe::StoreMetrics;
use crate::policy::Policy;

/// The default memory budget of a store: 32 MiB.
pub(crate) const DEFAULT_MAX_BYTES: usize = 32 << 20;

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
///   ([`MemoryStore::with_max_bytes`], default 32 MiB): the tables'
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
    /// drive it) with the default memory budget (32 MiB).
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

    /// Bounds the memory the store holds, in bytes (default 32 MiB). Keys
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
        let call = Call {
            cx: &cx,
            op,
            cost,
            now,
        };
        match &self.keys {
            Keys::Inline(t, h) => call.run(t, key, |k: &K| map::hash_of(h, k)),
            Keys::Digest(t, sip) => call.run(t, &sip.digest(key), Digest::hash),
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

    fn policies_installed(
        &self,
        set: &crate::policy::PolicySet,
    ) -> Result<(), crate::error::ConfigError> {
        self.tags.installed(set.policies());
        Ok(())
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
