//! Local-first mode: decide locally, reconcile with Redis in the background.

use std::fmt;
use std::sync::{atomic::Ordering, Arc, PoisonError};
use std::time::Duration;

use super::builder::{ForRedisStore, KEYS};
use super::failure::Share;
use super::local_state::{force_charge, Shared};
use super::local_sync::{run, Round};
use super::script::{self, Mode};
use super::store::RedisStore;
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::key::KeyBytes;
use crate::policy::{Policy, PolicySet};
use crate::redis::{policies_claim, Claim, RedisBuilder, RedisConnection};
use crate::store::{CheckFuture, Store, StoreFuture};

/// A store that decides from per-instance state and reconciles it with Redis in the
/// background: Redis is off the request path. See the [module docs](super).
///
/// Every `interval` (default 150 ms) a background task pushes, for each key used since the
/// last round, the units this instance admitted (charging them to the shared state
/// unconditionally, like `INCRBY` on a window's counter or moving a bucket's TAT), and
/// pulls back the shared state, which replaces the local one (units admitted during the
/// round trip are charged on top). Instances therefore see each other's consumption one
/// interval late.
///
/// **Overshoot bound.** Each instance may overshoot by at most what it admits within one
/// interval (plus the sync round trip) on top of what the shared state allowed at its last
/// sync. With `N` instances, over any span `D`, a GCRA-based limit (rate `r`, burst `b`)
/// admits at most about `b + r * D + N * (b + r * (interval + latency))`, and a window
/// at most `limit + N * (units one instance admits in one interval)` per window. The debt
/// an overshoot leaves in the shared state is remembered up to one extra bucket (GCRA) or
/// one extra window limit, so the fleet then backs off until it is paid.
///
/// **Redis down.** Each instance keeps limiting with its own state (at most the full
/// quota per instance); pending units are pushed once Redis answers again, each key's
/// shared state first raised to what this instance last knew of it (so a Redis restarted
/// without its data gets back the state of every key used meanwhile).
///
/// **Memory.** The local state is bounded in bytes ([`max_bytes`](RedisBuilder::max_bytes),
/// default 32 MiB). At the budget, keys that are fresh, unused since the last round and
/// fully pushed go first; then those with the fewest units not yet pushed, whose units
/// are never shared (they widen the overshoot bound by that much) and are counted in
/// [`LocalFirstStore::evicted_units`].
///
/// The task starts lazily on the first decision made inside a tokio runtime, or
/// explicitly with [`LocalFirstStore::start`]; it never panics outside a runtime and
/// stops when the store is dropped.
#[derive(Clone)]
pub struct LocalFirstStore {
    inner: Arc<Shared>,
    /// The store's identity on its connection, with what it applies.
    claim: Arc<Claim>,
}

impl fmt::Debug for LocalFirstStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalFirstStore")
            .field("policy", &self.inner.policy)
            .field("interval", &self.inner.interval)
            .field("started", &self.inner.started.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl LocalFirstStore {
    /// The local-first store named `name` for `policy`, reconciling through `connection`
    /// every `interval` (clamped to at least 10 ms), with the defaults of
    /// [`RedisStore::builder`] (namespace `tollgate`; the keys are the [`RedisStore`]'s, so
    /// both kinds of store share state under one name).
    /// [`build_local_first`](RedisBuilder::build_local_first) sets the rest.
    pub fn new(
        name: &str,
        policy: impl Into<Policy>,
        connection: impl Into<RedisConnection>,
        interval: Duration,
    ) -> Result<Self, ConfigError> {
        RedisStore::builder(name, policy).build_local_first(connection, interval)
    }

    /// Keys held locally now.
    pub fn len(&self) -> usize {
        self.inner.map.usage().0
    }

    /// Bytes the local state holds now (within the budget).
    pub fn bytes(&self) -> usize {
        self.inner.map.usage().1
    }

    /// Whether no key is held locally.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Units admitted here that were evicted within the memory budget before being pushed
    /// to Redis.
    pub fn evicted_units(&self) -> u64 {
        self.inner.evicted_units.load(Ordering::Relaxed)
    }

    /// Starts the reconciliation task (the first local decision starts it too). `false`
    /// outside a tokio runtime, or when it was started already. It ends when the store
    /// (every clone) is dropped, or with [`LocalFirstStore::stop`].
    pub fn start(&self) -> bool {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        if self.inner.started.swap(true, Ordering::AcqRel) {
            return false;
        }
        let weak = Arc::downgrade(&self.inner);
        let task = handle.spawn(run(weak, self.inner.interval));
        *self
            .inner
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(task);
        true
    }

    /// Stops the reconciliation task; decisions stay local until [`LocalFirstStore::sync`]
    /// is called. The store does not start it again by itself.
    pub fn stop(&self) {
        let task = self
            .inner
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            task.abort();
        }
    }

    /// Runs one reconciliation round now (also what the task does every interval).
    /// Returns how many keys were reconciled.
    pub async fn sync(&self) -> Result<usize, StoreError> {
        self.inner.clone().sync_round(Round::Every).await
    }

    /// Rounds completed and rounds that failed (Redis unreachable) so far.
    pub fn sync_stats(&self) -> (u64, u64) {
        (
            self.inner.rounds.load(Ordering::Relaxed),
            self.inner.failed_rounds.load(Ordering::Relaxed),
        )
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// Decides locally for `key` under the store's policy and charges `cost` when
    /// admitted.
    pub fn check_local<K: KeyBytes + ?Sized>(&self, key: &K, cost: u64) -> Decision {
        let policy = self.inner.policy.clone();
        self.check_with(key, &policy, cost)
    }

    fn check_with<K: KeyBytes + ?Sized>(&self, key: &K, policy: &Policy, cost: u64) -> Decision {
        if !self.inner.started.load(Ordering::Relaxed) {
            let _ = self.start();
        }
        let k = self.inner.redis_key(key);
        self.inner.with_entry(k, policy, |e, now| {
            let d = policy.decide(&mut e.state, now, cost);
            if d.is_allowed() {
                e.pending = e.pending.saturating_add(cost);
            }
            d
        })
    }

    fn peek_with<K: KeyBytes + ?Sized>(&self, key: &K, policy: &Policy, cost: u64) -> Decision {
        let k = self.inner.redis_key(key);
        // A look changes nothing: not the policy the key's state is kept under, not the
        // keys held.
        self.inner
            .look(&k, policy, |state, now| policy.peek(state, now, cost))
    }
}

impl RedisBuilder<ForRedisStore> {
    /// Builds a [`LocalFirstStore`] on `connection`, reconciling every `interval` (clamped
    /// to at least 10 ms). The namespace, the key names, the clock and the memory budget
    /// are this builder's; the deadline, breaker, failure policy and negative cache do not
    /// apply (Redis is off the request path).
    pub fn build_local_first(
        self,
        connection: impl Into<RedisConnection>,
        interval: Duration,
    ) -> Result<LocalFirstStore, ConfigError> {
        self.check_common()?;
        let conn: RedisConnection = connection.into();
        let claim = self.claim(&conn)?;
        let shared = Shared::new(
            conn,
            self.common.key_names(KEYS, self.own.readable_keys),
            self.own.policy,
            interval.max(Duration::from_millis(10)),
            self.own.max_bytes,
            &self.common,
            "local",
            Share::Fixed(1.0),
        )?;
        Ok(LocalFirstStore {
            inner: Arc::new(shared),
            claim: Arc::new(claim),
        })
    }
}

impl<K: KeyBytes + 'static> Store<K> for LocalFirstStore {
    fn decide(&self, key: &K, policy: &Policy, cost: u64) -> CheckFuture {
        CheckFuture::ready(Ok(self.check_with(key, policy, cost)))
    }

    fn preview(&self, key: &K, policy: &Policy, cost: u64) -> CheckFuture {
        CheckFuture::ready(Ok(self.peek_with(key, policy, cost)))
    }

    fn decide_now(&self, key: &K, policy: &Policy, cost: u64) -> Option<Decision> {
        Some(self.check_with(key, policy, cost))
    }

    /// Gives the units back locally (and takes them off what is still to be pushed).
    fn refund(&self, key: &K, policy: &Policy, cost: u64) {
        let k = self.inner.redis_key(key);
        self.inner.with_entry(k, policy, |e, now| {
            policy.refund(&mut e.state, now, cost);
            e.pending = e.pending.saturating_sub(cost);
        });
    }

    /// Applied locally at once: a charge above the estimate is charged whatever the limits
    /// and pushed with the next round; a cost below it is refunded as [`Store::refund`]
    /// does.
    fn settle(&self, key: &K, policy: &Policy, reserved: u64, actual: u64) -> StoreFuture<()> {
        if actual < reserved {
            Store::<K>::refund(self, key, policy, reserved - actual);
        } else if actual > reserved {
            let k = self.inner.redis_key(key);
            let extra = actual - reserved;
            self.inner.with_entry(k, policy, |e, now| {
                force_charge(policy, &mut e.state, now, extra);
                e.pending = e.pending.saturating_add(extra);
            });
        }
        StoreFuture::ready(Ok(()))
    }

    /// Applied locally at once, and to the shared state by one script call.
    fn ban(&self, key: &K, policy: &Policy, ban: Duration) -> StoreFuture<()> {
        let k = self.inner.redis_key(key);
        let ns = script::ban_ns(ban);
        self.inner.with_entry(k.clone(), policy, |e, now| {
            policy.ban(&mut e.state, now, ns)
        });
        let limits = script::limit_args(policy).map_err(StoreError::backend);
        let shared = self.inner.clone();
        StoreFuture::boxed(async move {
            shared
                .update(&k, Mode::Ban, ns, limits?, Vec::new())
                .await
                .map(|_| ())
        })
    }

    /// Forgets the local state (with its units not yet pushed) and deletes the shared
    /// one.
    fn reset(&self, key: &K) -> StoreFuture<()> {
        let k = self.inner.redis_key(key);
        self.inner.forget(&k);
        let shared = self.inner.clone();
        StoreFuture::boxed(async move {
            let mut cmd = ::redis::cmd("DEL");
            cmd.arg(&k);
            shared
                .in_time(shared.conn.query::<i64>(&cmd))
                .await
                .map(|_| ())
        })
    }

    fn supports(&self, policy: &Policy) -> Result<(), ConfigError> {
        script::limit_args(policy).map(|_| ())
    }

    fn default_policy(&self) -> Option<Policy> {
        Some(self.inner.policy.clone())
    }

    /// Refused when another store of this connection with the same name applies other
    /// limits.
    fn policies_installed(&self, set: &PolicySet) -> Result<(), ConfigError> {
        let (fingerprint, words) = policies_claim(set.policies());
        self.claim.update(fingerprint, words)
    }
}
