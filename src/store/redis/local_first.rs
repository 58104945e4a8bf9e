//! Local-first mode: decide locally, reconcile with Redis in the background.

use std::{
    collections::HashMap,
    fmt,
    sync::{
        atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, PoisonError, Weak,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use super::{
    keys,
    script::{self, Mode},
    store::RedisConnection,
};
use crate::{
    algorithm::{Params, MAX_WORDS},
    decision::{Decision, Source},
    error::{ConfigError, StoreError},
    store::{CheckFuture, KeyBytes, Store},
    Policy,
};

const SHARDS: usize = 16;
const MIN_SWEEP: usize = 64;
/// Default cap on the keys held locally (as the in-memory store's).
const DEFAULT_MAX_KEYS: usize = 1 << 20;
/// Keys synced concurrently in one round.
const CONCURRENCY: usize = 16;

#[derive(Clone, Copy)]
struct Entry {
    /// The policy's state words in the server's clock (ns since the Unix epoch).
    state: [u64; MAX_WORDS],
    /// Units admitted here and not yet pushed to Redis.
    pending: u64,
    /// Seen since the last round (pulled even when nothing was admitted).
    touched: bool,
}

struct Shard {
    map: HashMap<Vec<u8>, Entry>,
    sweep_at: usize,
}

struct Shared {
    conn: RedisConnection,
    policy: Policy,
    limits: Vec<u64>,
    prefix: Vec<u8>,
    interval: Duration,
    shards: Box<[Mutex<Shard>]>,
    /// Server time minus local monotonic time, in ns.
    offset: AtomicI64,
    epoch: Instant,
    started: AtomicBool,
    rounds: AtomicU64,
    failed_rounds: AtomicU64,
    /// Keys one shard may hold; at the cap the eighth with the least unsynced usage goes.
    shard_cap: AtomicUsize,
    /// Units admitted here but evicted at the cap before they were pushed to Redis.
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

fn unix_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

impl LocalFirstStore {
    /// A local-first store for `policy` reconciling through `connection` every `interval`
    /// (clamped to at least 10 ms), under namespace `tollgate` (the keys are the
    /// [`RedisStore`](super::RedisStore)'s, so both kinds of store share state).
    pub fn new(
        policy: impl Into<Policy>,
        connection: impl Into<RedisConnection>,
        interval: Duration,
    ) -> Result<Self, ConfigError> {
        Self::with_namespace(policy, connection, interval, "tollgate")
    }

    /// [`LocalFirstStore::new`] under another namespace.
    pub fn with_namespace(
        policy: impl Into<Policy>,
        connection: impl Into<RedisConnection>,
        interval: Duration,
        namespace: &str,
    ) -> Result<Self, ConfigError> {
        let policy = policy.into();
        keys::check_namespace(namespace)?;
        let limits = script::limit_args(&policy)?;
        let epoch = Instant::now();
        Ok(LocalFirstStore {
            inner: Arc::new(Shared {
                conn: connection.into(),
                prefix: keys::prefix(namespace, &policy),
                limits,
                policy,
                interval: interval.max(Duration::from_millis(10)),
                shards: (0..SHARDS)
                    .map(|_| {
                        Mutex::new(Shard {
                            map: HashMap::new(),
                            sweep_at: MIN_SWEEP,
                        })
                    })
                    .collect(),
                offset: AtomicI64::new(unix_ns()),
                epoch,
                started: AtomicBool::new(false),
                rounds: AtomicU64::new(0),
                failed_rounds: AtomicU64::new(0),
                shard_cap: AtomicUsize::new(DEFAULT_MAX_KEYS / SHARDS),
                evicted_units: AtomicU64::new(0),
            }),
        })
    }

    /// Caps the keys held locally (default 2^20), so a flood of distinct keys cannot grow
    /// memory without bound. At the cap, the eighth of a shard's keys with the least usage
    /// not yet pushed to Redis is dropped; units dropped that way are never shared (they
    /// widen the overshoot bound by that much) and are counted in
    /// [`LocalFirstStore::evicted_units`].
    pub fn with_max_keys(self, max_keys: usize) -> Result<Self, ConfigError> {
        if max_keys == 0 {
            return Err(ConfigError::Store("max_keys must be at least 1".into()));
        }
        self.inner
            .shard_cap
            .store((max_keys / SHARDS).max(1), Ordering::Relaxed);
        Ok(self)
    }

    /// Keys held locally now.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).map.len())
            .sum()
    }

    /// Whether no key is held locally.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Units admitted here that were evicted at the key cap before being pushed to Redis.
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

    /// Decides locally for `key` and charges `cost` when admitted.
    pub fn check_local<K: KeyBytes + ?Sized>(&self, key: &K, cost: u64) -> Decision {
        if !self.inner.started.load(Ordering::Relaxed) {
            let _ = self.start();
        }
        let k = keys::redis_key(&self.inner.prefix, key);
        self.inner.with_entry(k, |policy, e, now| {
            let d = policy.decide(&mut e.state, now, cost);
            if d.is_allowed() {
                e.pending = e.pending.saturating_add(cost);
            }
            d
        })
    }

    fn peek_local<K: KeyBytes + ?Sized>(&self, key: &K, cost: u64) -> Decision {
        let k = keys::redis_key(&self.inner.prefix, key);
        self.inner
            .with_entry(k, |policy, e, now| policy.peek(&e.state, now, cost))
    }
}

impl Shared {
    fn now(&self) -> u64 {
        (self.epoch.elapsed().as_nanos() as i64 + self.offset.load(Ordering::Relaxed)).max(0) as u64
    }

    fn shard(&self, key: &[u8]) -> &Mutex<Shard> {
        // FNV-1a: cheap and good enough to spread keys over a few shards.
        let mut h: u32 = 0x811c_9dc5;
        for &b in key {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        &self.shards[h as usize % SHARDS]
    }

    fn with_entry<R>(&self, key: Vec<u8>, f: impl FnOnce(&Policy, &mut Entry, u64) -> R) -> R {
        let mut shard = self
            .shard(&key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Read under the lock: never older than the time of whoever wrote the state last
        // (a reading taken before waiting for the lock could refuse a request that fits).
        let now = self.now();
        let cap = self.shard_cap.load(Ordering::Relaxed);
        let len = shard.map.len();
        if !shard.map.contains_key(&key) && (len >= shard.sweep_at || len >= cap) {
            let policy = &self.policy;
            shard
                .map
                .retain(|_, e| e.pending > 0 || e.touched || !policy.is_fresh(&e.state, now));
            shard.sweep_at = (shard.map.len() * 2).max(MIN_SWEEP);
            if shard.map.len() >= cap {
                // Every key still carries state: drop the eighth with the least unsynced use.
                let target = (shard.map.len() / 8).max(1);
                let mut pending: Vec<u64> = shard.map.values().map(|e| e.pending).collect();
                let (_, &mut threshold, _) = pending.select_nth_unstable(target - 1);
                let (mut left, mut lost) = (target, 0u64);
                shard.map.retain(|_, e| {
                    if left > 0 && e.pending <= threshold {
                        left -= 1;
                        lost += e.pending;
                        false
                    } else {
                        true
                    }
                });
                self.evicted_units.fetch_add(lost, Ordering::Relaxed);
            }
        }
        let e = shard.map.entry(key).or_insert(Entry {
            state: [0; MAX_WORDS],
            pending: 0,
            touched: false,
        });
        e.touched = true;
        f(&self.policy, e, now)
    }

    async fn sync_round(self: Arc<Self>) -> Result<usize, StoreError> {
        let mut batch: Vec<(Vec<u8>, u64)> = Vec::new();
        for s in self.shards.iter() {
            let mut s = s.lock().unwrap_or_else(PoisonError::into_inner);
            for (k, e) in s.map.iter_mut() {
                if e.pending > 0 || e.touched {
                    batch.push((k.clone(), e.pending));
                    e.pending = 0;
                    e.touched = false;
                }
            }
        }
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
    async fn sync_keys(&self, keys: Vec<(Vec<u8>, u64)>) -> Result<(), StoreError> {
        let mut failed: Option<StoreError> = None;
        for (key, units) in keys {
            if failed.is_some() {
                self.put_back(&key, units);
                continue;
            }
            let inv = script::invocation(&key, Mode::Sync, units, None, &self.limits);
            let deadline = self.interval.max(Duration::from_millis(50));
            let r = match tokio::time::timeout(deadline, self.conn.invoke(&inv)).await {
                Ok(r) => r,
                Err(_) => Err(StoreError::Timeout(deadline)),
            };
            match r.and_then(|reply| script::decode_sync(&reply, &self.policy)) {
                Ok((server_now, words)) => {
                    let local = self.epoch.elapsed().as_nanos() as i64;
                    self.offset
                        .store(server_now as i64 - local, Ordering::Relaxed);
                    self.merge(&key, words);
                }
                Err(e) => {
                    self.put_back(&key, units);
                    failed = Some(e);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    fn put_back(&self, key: &[u8], units: u64) {
        let mut s = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = s.map.get_mut(key) {
            e.pending = e.pending.saturating_add(units);
            e.touched = true;
        }
    }

    /// Replaces the local state by the shared one, then charges what was admitted here
    /// since the round started.
    fn merge(&self, key: &[u8], words: [u64; MAX_WORDS]) {
        let mut s = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = self.now();
        let Some(e) = s.map.get_mut(key) else {
            return;
        };
        e.state = words;
        if e.pending > 0 {
            force_charge(&self.policy, &mut e.state, now, e.pending);
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
                let tag = now / w.w + 1;
                if state[off] == tag {
                    state[off + 1] = state[off + 1].saturating_add(units);
                } else {
                    state[off] = tag;
                    state[off + 1] = units;
                }
                off += 2;
            }
            Params::Sliding(w) => {
                let tag = now / w.w + 1;
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
    fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    fn check(&self, key: &K, cost: u64) -> CheckFuture {
        CheckFuture::ready(Ok(self.check_local(key, cost).with_source(Source::Local)))
    }

    fn peek(&self, key: &K, cost: u64) -> CheckFuture {
        CheckFuture::ready(Ok(self.peek_local(key, cost)))
    }

    /// Gives the units back locally (and takes them off what is still to be pushed).
    fn refund(&self, key: &K, cost: u64) {
        let k = keys::redis_key(&self.inner.prefix, key);
        self.inner.with_entry(k, |policy, e, now| {
            policy.refund(&mut e.state, now, cost);
            e.pending = e.pending.saturating_sub(cost);
        });
    }
}
