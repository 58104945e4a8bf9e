//! Local-first mode: decide locally, reconcile with Redis in the background.

use std::{
    fmt,
    sync::{
        atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering},
        Arc, Weak,
    },
    time::Duration,
};

use super::{
    breaker::within,
    keys,
    script::{self, Mode},
    store::{RedisConnection, RedisStoreBuilder},
};
use crate::{
    algorithm::{Params, MAX_WORDS},
    clock::{Clock, TokioClock},
    decision::Decision,
    error::{ConfigError, StoreError},
    observe::StoreMetrics,
    policy::Policy,
    store::{
        map::{self, allocation_bytes, default_shards, Both, KeyHasher, Residual, ShardedMap},
        tags::Tags,
        CheckFuture, KeyBytes, Store, StoreFuture,
    },
};

/// Keys synced concurrently in one round.
const CONCURRENCY: usize = 16;

struct Entry {
    /// The Redis key.
    key: Box<[u8]>,
    /// The policy the state is for (see `store::tags`).
    tag: u32,
    /// The policy's state words in the server's clock (ns since the Unix epoch).
    state: [u64; MAX_WORDS],
    /// Units admitted here and not yet pushed to Redis.
    pending: u64,
    /// Seen since the last round (pulled even when nothing was admitted).
    touched: bool,
}

impl map::Entry for Entry {
    fn heap_bytes(&self) -> usize {
        allocation_bytes(self.key.len())
    }
}

/// Eviction order of the local state: fresh, unused and synced entries may go at once;
/// otherwise the entries with the fewest units not yet pushed go first, and their units
/// are counted as lost.
struct ByPending<'a> {
    tags: &'a Tags,
    now: u64,
    lost: &'a AtomicU64,
}

impl Residual<Entry> for ByPending<'_> {
    fn residual(&mut self, e: &mut Entry) -> u64 {
        let fresh = || {
            self.tags
                .with(e.tag, |p| p.is_none_or(|p| p.is_fresh(&e.state, self.now)))
        };
        if e.pending == 0 && !e.touched && fresh() {
            0
        } else {
            e.pending.saturating_add(1)
        }
    }

    fn evicted(&mut self, e: &Entry) {
        self.lost.fetch_add(e.pending, Ordering::Relaxed);
    }
}

struct Shared {
    conn: RedisConnection,
    /// The policy of the store's own methods.
    policy: Policy,
    prefix: Vec<u8>,
    readable: bool,
    interval: Duration,
    map: ShardedMap<Entry>,
    tags: Tags,
    hasher: KeyHasher,
    clock: Arc<dyn Clock>,
    /// Whether the syncs send `clock`'s time to the script instead of the server's.
    overrides: bool,
    /// Server time minus the clock's time, in ns (0 when the clock is the time source).
    offset: AtomicI64,
    started: AtomicBool,
    rounds: AtomicU64,
    failed_rounds: AtomicU64,
    /// Units admitted here but evicted within the memory budget before they were pushed
    /// to Redis.
    evicted_units: AtomicU64,
}

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
/// quota per instance); pending units are pushed once Redis answers again.
///
/// **Memory.** The local state is bounded in bytes ([`RedisStoreBuilder::max_bytes`],
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

/// The background reconciliation task of a [`LocalFirstStore`]. Dropping it detaches the
/// task (it still stops when the store is dropped); [`SyncTask::stop`] ends it.
#[derive(Debug)]
pub struct SyncTask {
    handle: tokio::task::JoinHandle<()>,
}

impl SyncTask {
    /// Stops the task.
    pub fn stop(self) {
        self.handle.abort();
    }

    /// Whether the task has ended.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

impl LocalFirstStore {
    /// A local-first store for `policy` reconciling through `connection` every `interval`
    /// (clamped to at least 10 ms), with the defaults of [`RedisStore::builder`]
    /// (namespace `tollgate`; the keys are the [`RedisStore`]'s, so both kinds of store
    /// share state). [`RedisStoreBuilder::build_local_first`] sets the rest.
    ///
    /// [`RedisStore`]: super::RedisStore
    /// [`RedisStore::builder`]: super::RedisStore::builder
    pub fn new(
        policy: impl Into<Policy>,
        connection: impl Into<RedisConnection>,
        interval: Duration,
    ) -> Result<Self, ConfigError> {
        super::RedisStore::builder(policy).build_local_first(connection, interval)
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

    /// Starts the reconciliation task. `None` outside a tokio runtime, or when it runs
    /// already.
    pub fn start(&self) -> Option<SyncTask> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        if self.inner.started.swap(true, Ordering::AcqRel) {
            return None;
        }
        let weak = Arc::downgrade(&self.inner);
        let interval = self.inner.interval;
        Some(SyncTask {
            handle: handle.spawn(run(weak, interval)),
        })
    }

    /// Runs one reconciliation round now (also what the task does every interval).
    /// Returns how many keys were reconciled.
    pub async fn sync(&self) -> Result<usize, StoreError> {
        self.inner.clone().sync_round().await
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
        self.inner
            .with_entry(k, policy, |e, now| policy.peek(&e.state, now, cost))
    }
}

impl RedisStoreBuilder {
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
        let overrides = self.clock.is_some();
        let clock: Arc<dyn Clock> = self.clock.unwrap_or_else(|| Arc::new(TokioClock::new()));
        let metrics = StoreMetrics::new(&format!("{}-local", self.namespace));
        Ok(LocalFirstStore {
            inner: Arc::new(Shared {
                conn: connection.into(),
                prefix: keys::prefix(&self.namespace),
                readable: self.readable_keys,
                policy: self.policy,
                interval: interval.max(Duration::from_millis(10)),
                map: ShardedMap::new(self.max_bytes, default_shards(), metrics)?,
                tags: Tags::new(),
                hasher: KeyHasher::default(),
                clock,
                overrides,
                offset: AtomicI64::new(0),
                started: AtomicBool::new(false),
                rounds: AtomicU64::new(0),
                failed_rounds: AtomicU64::new(0),
                evicted_units: AtomicU64::new(0),
            }),
        })
    }
}

impl Shared {
    /// The server's time as this instance estimates it: the clock plus the offset seen at
    /// the last sync.
    fn now(&self) -> u64 {
        (self.clock.now() as i64)
            .saturating_add(self.offset.load(Ordering::Relaxed))
            .max(0) as u64
    }

    fn redis_key<K: KeyBytes + ?Sized>(&self, key: &K) -> Vec<u8> {
        keys::redis_key(&self.prefix, key, self.readable)
    }

    /// Runs `f` on the key's entry (made if new) with its state as `policy`'s at now.
    fn with_entry<R>(
        &self,
        key: Vec<u8>,
        policy: &Policy,
        f: impl FnOnce(&mut Entry, u64) -> R,
    ) -> R {
        let hash = map::hash_of(&self.hasher, &key[..]);
        let tag = self.tags.tag(policy);
        let mut shard = self.map.write(hash);
        // Read under the lock: never older than the time of whoever wrote the state last
        // (a reading taken before waiting for the lock could refuse a request that fits).
        let now = self.now();
        if shard.one.find(hash, |e| *e.key == *key).is_none() {
            let entry = Entry {
                key: key.clone().into_boxed_slice(),
                tag,
                state: [0; MAX_WORDS],
                pending: 0,
                touched: false,
            };
            let evict = ByPending {
                tags: &self.tags,
                now,
                lost: &self.evicted_units,
            };
            let hasher = &self.hasher;
            self.map.insert_one(
                &mut shard,
                hash,
                entry,
                |e| map::hash_of(hasher, &e.key[..]),
                Both(evict, ()),
            );
        }
        let e = shard
            .one
            .find_mut(hash, |e| *e.key == *key)
            .expect("inserted above, under the same lock");
        if e.tag != tag {
            // Decided under another policy than its state's: carry the state over; the
            // units not yet pushed stay units.
            e.state = self.tags.carry(e.tag, &e.state, policy, now);
            e.tag = tag;
        }
        e.touched = true;
        f(e, now)
    }

    async fn sync_round(self: Arc<Self>) -> Result<usize, StoreError> {
        let mut batch: Vec<(Vec<u8>, u64, u32)> = Vec::new();
        self.map.for_each_one(|e| {
            if e.pending > 0 || e.touched {
                batch.push((e.key.to_vec(), e.pending, e.tag));
                e.pending = 0;
                e.touched = false;
            }
        });
        let n = batch.len();
        let chunk = n.div_ceil(CONCURRENCY).max(1);
        let mut tasks = tokio::task::JoinSet::new();
        let mut it = batch.into_iter();
        loop {
            let part: Vec<_> = it.by_ref().take(chunk).collect();
            if part.is_empty() {
                break;
            }
            let me = self.clone();
            tasks.spawn(async move { me.sync_keys(part).await });
        }
        let mut result = Ok(n);
        while let Some(r) = tasks.join_next().await {
            if let Ok(Err(e)) = r {
                result = Err(e);
            }
        }
        self.rounds.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = &result {
            self.failed_rounds.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(target: "tollgate::redis", error = %e, "local-first sync round failed");
        }
        result
    }

    /// Syncs keys one after the other; after a failure the rest are put back unsent.
    async fn sync_keys(&self, keys: Vec<(Vec<u8>, u64, u32)>) -> Result<(), StoreError> {
        let mut failed: Option<StoreError> = None;
        for (key, units, tag) in keys {
            let policy = self.tags.policy(tag);
            let limits = policy.as_ref().map(script::limit_args);
            let (Some(policy), Some(Ok(limits)), None) = (policy, limits, &failed) else {
                self.put_back(&key, units);
                continue;
            };
            let at = self.overrides.then(|| self.clock.now());
            let inv = script::invocation(&key, Mode::Sync, units, at, &limits, true);
            let r = self.in_time(self.conn.invoke(&inv)).await;
            match r.and_then(|reply| script::decode_sync(&reply, &policy)) {
                Ok((server_now, words)) => {
                    if !self.overrides {
                        let local = self.clock.now() as i64;
                        self.offset
                            .store(server_now as i64 - local, Ordering::Relaxed);
                    }
                    self.merge(&key, tag, &policy, words);
                }
                Err(e) => {
                    self.put_back(&key, units);
                    failed = Some(e);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// A call to Redis under the store's deadline (its sync interval, at least 50 ms).
    async fn in_time<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        within(self.interval.max(Duration::from_millis(50)), call).await
    }

    /// Drops a key's local entry.
    fn forget(&self, key: &[u8]) {
        let hash = map::hash_of(&self.hasher, key);
        let mut s = self.map.write(hash);
        if let Ok(e) = s.one.find_entry(hash, |e| *e.key == *key) {
            let (entry, _) = e.remove();
            let heap = map::Entry::heap_bytes(&entry);
            self.map.removed(&mut s, heap);
        }
    }

    fn put_back(&self, key: &[u8], units: u64) {
        let hash = map::hash_of(&self.hasher, key);
        let mut s = self.map.write(hash);
        if let Some(e) = s.one.find_mut(hash, |e| *e.key == *key) {
            e.pending = e.pending.saturating_add(units);
            e.touched = true;
        }
    }

    /// Replaces the local state by the shared one, then charges what was admitted here
    /// since the round started.
    fn merge(&self, key: &[u8], tag: u32, policy: &Policy, words: [u64; MAX_WORDS]) {
        let hash = map::hash_of(&self.hasher, key);
        let mut s = self.map.write(hash);
        let now = self.now();
        let Some(e) = s.one.find_mut(hash, |e| *e.key == *key) else {
            return;
        };
        // Decided under another policy since the round began: the next round syncs it.
        if e.tag != tag {
            return;
        }
        e.state = words;
        if e.pending > 0 {
            force_charge(policy, &mut e.state, now, e.pending);
        }
    }
}

/// Charges `units` to every limit of `state` whether or not they fit.
fn force_charge(policy: &Policy, state: &mut [u64], now: u64, units: u64) {
    let mut off = 0;
    for l in policy.limits() {
        match l.params {
            Params::Gcra(g) => {
                state[off] = state[off]
                    .max(now)
                    .saturating_add(units.saturating_mul(g.t));
                off += 1;
            }
            Params::Fixed(w) => {
                let tag = w.tag(now);
                if state[off] == tag {
                    state[off + 1] = state[off + 1].saturating_add(units);
                } else {
                    state[off] = tag;
                    state[off + 1] = units;
                }
                off += 2;
            }
            Params::Sliding(w) => {
                let tag = w.tag(now);
                if state[off] == tag {
                    state[off + 2] = state[off + 2].saturating_add(units);
                } else if state[off] != 0 && state[off] + 1 == tag {
                    state[off + 1] = state[off + 2];
                    state[off] = tag;
                    state[off + 2] = units;
                } else {
                    state[off] = tag;
                    state[off + 1] = 0;
                    state[off + 2] = units;
                }
                off += 3;
            }
        }
    }
}

async fn run(weak: Weak<Shared>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = weak.upgrade() else {
            return;
        };
        let _ = shared.sync_round().await;
    }
}

impl<K: KeyBytes + 'static> Store<K> for LocalFirstStore {
    fn supports(&self, policy: &Policy) -> Result<(), ConfigError> {
        script::limit_args(policy).map(|_| ())
    }

    fn default_policy(&self) -> Option<Policy> {
        Some(self.inner.policy.clone())
    }

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
        let ns = u64::try_from(ban.as_nanos())
            .unwrap_or(u64::MAX)
            .min(1 << 52);
        self.inner.with_entry(k.clone(), policy, |e, now| {
            policy.ban(&mut e.state, now, ns)
        });
        let limits = match script::limit_args(policy) {
            Ok(l) => l,
            Err(e) => return StoreFuture::ready(Err(StoreError::backend(e))),
        };
        let shared = self.inner.clone();
        StoreFuture::boxed(async move {
            let at = shared.overrides.then(|| shared.clock.now());
            let inv = script::invocation(&k, Mode::Ban, ns, at, &limits, true);
            shared.in_time(shared.conn.invoke(&inv)).await.map(|_| ())
        })
    }

    /// Forgets the local state (with its units not yet pushed) and deletes the shared
    /// one.
    fn reset(&self, key: &K) -> StoreFuture<()> {
        let k = self.inner.redis_key(key);
        self.inner.forget(&k);
        let shared = self.inner.clone();
        StoreFuture::boxed(async move {
            let mut cmd = redis::cmd("DEL");
            cmd.arg(&k);
            shared
                .in_time(shared.conn.query::<i64>(&cmd))
                .await
                .map(|_| ())
        })
    }
}
