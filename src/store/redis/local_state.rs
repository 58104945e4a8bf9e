//! The per-instance state of a [`LocalFirstStore`](super::LocalFirstStore) and of a
//! [`RedisStore`](super::RedisStore)'s local fallback: what each key's requests are
//! decided from locally, bounded in bytes, with the units admitted here not yet charged to
//! the shared state.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use super::batch::Call;
use super::failure::Share;
use super::script::{Args, Mode};
use super::send::{self, Batcher};
use crate::{
    algorithm::{Params, MAX_WORDS},
    clock::Clock,
    error::{ConfigError, StoreError},
    key::KeyBytes,
    observe::StoreMetrics,
    policy::Policy,
    redis::{within, Common, KeyNames, RedisConnection},
    store::{
        map::{self, allocation_bytes, default_shards, Both, KeyHasher, Residual, ShardedMap},
        tags::Tags,
    },
};

pub(super) struct Entry {
    /// The Redis key.
    pub(super) key: Box<[u8]>,
    /// The policy the state is for (see `store::tags`): the shared limits, whose units
    /// the sync pushes.
    pub(super) tag: u32,
    /// The state words, in the server's clock (ns since the Unix epoch), of the policy at
    /// the store's share (see [`Shared::share`]): the shared policy's own for a
    /// local-first store.
    pub(super) state: [u64; MAX_WORDS],
    /// Units admitted here and not yet pushed to Redis.
    pub(super) pending: u64,
    /// Seen since the last round (pulled even when nothing was admitted).
    pub(super) touched: bool,
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

pub(super) struct Shared {
    pub(super) conn: RedisConnection,
    /// The policy of the store's own methods.
    pub(super) policy: Policy,
    pub(super) names: KeyNames,
    pub(super) interval: Duration,
    pub(super) map: ShardedMap<Entry>,
    pub(super) tags: Tags,
    pub(super) hasher: KeyHasher,
    pub(super) clock: Arc<dyn Clock>,
    /// Whether the syncs send `clock`'s time to the script instead of the server's.
    pub(super) overrides: bool,
    /// Server time minus the clock's time, in ns (0 when the clock is the time source).
    pub(super) offset: AtomicI64,
    pub(super) started: AtomicBool,
    /// The reconciliation task, while it runs.
    pub(super) task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    pub(super) rounds: AtomicU64,
    pub(super) failed_rounds: AtomicU64,
    /// Units admitted here but evicted within the memory budget before they were pushed
    /// to Redis.
    pub(super) evicted_units: AtomicU64,
    /// The share of each quota the local state is decided at (1 for a local-first store).
    pub(super) share: Share,
    /// Whether syncs raise the shared state to the local one before charging (see
    /// `local_sync`): set when Redis failed (it may have lost its data), cleared by a
    /// round that succeeds. Not otherwise, so that a reset is not undone.
    pub(super) floors: AtomicBool,
    /// The connection's batcher, through which syncs without a floor go (a fallback's,
    /// when its store batches); `None`: every call its own.
    batcher: Option<Arc<Batcher>>,
}

/// A key's units and state taken for a sync: put back unless the sync succeeds.
pub(super) struct Unsynced {
    pub(super) key: Vec<u8>,
    /// Units admitted here and not yet pushed.
    pub(super) units: u64,
    pub(super) tag: u32,
    /// The local state when it was taken (the units included).
    pub(super) state: [u64; MAX_WORDS],
}

impl Shared {
    /// The state of a store deciding under `policy` at `share` within `max_bytes`, on the
    /// clock of `common`, its metrics labelled by the namespace and `label`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        conn: RedisConnection,
        names: KeyNames,
        policy: Policy,
        interval: Duration,
        max_bytes: usize,
        common: &Common,
        label: &str,
        share: Share,
    ) -> Result<Self, ConfigError> {
        let metrics = StoreMetrics::new(&format!("{}-{label}", common.namespace));
        Ok(Shared {
            conn,
            names,
            policy,
            interval,
            map: ShardedMap::new(max_bytes, default_shards(), metrics)?,
            tags: Tags::new(),
            hasher: KeyHasher::default(),
            clock: common.clock(),
            overrides: common.clock.is_some(),
            offset: AtomicI64::new(0),
            started: AtomicBool::new(false),
            task: Mutex::new(None),
            rounds: AtomicU64::new(0),
            failed_rounds: AtomicU64::new(0),
            evicted_units: AtomicU64::new(0),
            share,
            floors: AtomicBool::new(false),
            batcher: None,
        })
    }

    /// Sends the syncs without a floor through `batcher` (see [`batch`]).
    pub(super) fn batched(mut self, batcher: Arc<Batcher>) -> Self {
        self.batcher = Some(batcher);
        self
    }

    /// The server's time as this instance estimates it: the clock plus the offset seen at
    /// the last sync.
    pub(super) fn now(&self) -> u64 {
        (self.clock.now() as i64)
            .saturating_add(self.offset.load(Ordering::Relaxed))
            .max(0) as u64
    }

    pub(super) fn redis_key<K: KeyBytes + ?Sized>(&self, key: &K) -> Vec<u8> {
        self.names.key(|out| key.write_key(out))
    }

    /// Runs `f` on the key's entry (made if new) with its state as `policy`'s at now,
    /// marking the key for the next round.
    pub(super) fn with_entry<R>(
        &self,
        key: Vec<u8>,
        policy: &Policy,
        f: impl FnOnce(&mut Entry, u64) -> R,
    ) -> R {
        self.entry(&key, policy, true, f)
    }

    /// [`Shared::with_entry`], marking the key for the next round when `touch`.
    pub(super) fn entry<R>(
        &self,
        key: &[u8],
        policy: &Policy,
        touch: bool,
        f: impl FnOnce(&mut Entry, u64) -> R,
    ) -> R {
        let hash = map::hash_of(&self.hasher, key);
        let tag = self.tags.tag(policy);
        let mut shard = self.map.write(hash);
        // Read under the lock: never older than the time of whoever wrote the state last
        // (a reading taken before waiting for the lock could refuse a request that fits).
        let now = self.now();
        if shard.one.find(hash, |e| *e.key == *key).is_none() {
            let entry = Entry {
                key: key.into(),
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
        self.retag(e, tag, policy, now);
        e.touched |= touch;
        f(e, now)
    }

    /// Runs `f` on the key's state as `policy` sees it (carried over when written under
    /// another policy, fresh when the key is not held), changing nothing: a look.
    pub(super) fn look<R>(
        &self,
        key: &[u8],
        policy: &Policy,
        f: impl FnOnce(&[u64; MAX_WORDS], u64) -> R,
    ) -> R {
        let hash = map::hash_of(&self.hasher, key);
        let tag = self.tags.tag(policy);
        let shard = self.map.read(hash);
        let now = self.now();
        match shard.one.find(hash, |e| *e.key == *key) {
            Some(e) if e.tag == tag => f(&e.state, now),
            Some(e) => f(&self.tags.carry(e.tag, &e.state, policy, now), now),
            None => f(&[0; MAX_WORDS], now),
        }
    }

    /// Runs `f` on the key's entry, as [`Shared::entry`] does, when the key is held.
    pub(super) fn existing(&self, key: &[u8], policy: &Policy, f: impl FnOnce(&mut Entry, u64)) {
        let hash = map::hash_of(&self.hasher, key);
        let tag = self.tags.tag(policy);
        let mut shard = self.map.write(hash);
        let now = self.now();
        if let Some(e) = shard.one.find_mut(hash, |e| *e.key == *key) {
            self.retag(e, tag, policy, now);
            f(e, now);
        }
    }

    /// An entry decided under another policy than its state's: its state carried over
    /// (the units not yet pushed stay units).
    fn retag(&self, e: &mut Entry, tag: u32, policy: &Policy, now: u64) {
        if e.tag != tag {
            e.state = self.tags.carry(e.tag, &e.state, policy, now);
            e.tag = tag;
        }
    }

    /// Takes the key's units and state for a sync when it was decided here since its
    /// last one.
    pub(super) fn take(&self, key: &[u8]) -> Option<Unsynced> {
        let hash = map::hash_of(&self.hasher, key);
        let mut s = self.map.write(hash);
        let e = s.one.find_mut(hash, |e| *e.key == *key)?;
        take(e)
    }

    /// A call to Redis under the store's deadline (its sync interval, at least 50 ms).
    pub(super) async fn in_time<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        within(self.interval.max(Duration::from_millis(50)), call).await
    }

    /// One call of the general script (a sync, a ban) on `key`, under the deadline (a
    /// sync with its floor, see `script::floor_args`), through the batcher when there is
    /// one and no floor (a batch carries none).
    pub(super) async fn update(
        &self,
        key: &[u8],
        mode: Mode,
        units: u64,
        limits: Vec<u64>,
        floor: Vec<u64>,
    ) -> Result<Vec<i64>, StoreError> {
        let args = Args {
            mode,
            cost: units,
            now_ns: self.overrides.then(|| self.clock.now()),
            limits: limits.into(),
            general: true,
            floor,
        };
        match &self.batcher {
            Some(batcher) if args.floor.is_empty() => {
                let call = Call::Script(args);
                self.in_time(send::request(&self.conn, batcher, key, &call, true))
                    .await
            }
            _ => {
                self.in_time(self.conn.invoke(&args.invocation(key, true)))
                    .await
            }
        }
    }

    /// Drops a key's local entry.
    pub(super) fn forget(&self, key: &[u8]) {
        let hash = map::hash_of(&self.hasher, key);
        let mut s = self.map.write(hash);
        if let Ok(e) = s.one.find_entry(hash, |e| *e.key == *key) {
            let (entry, _) = e.remove();
            let heap = map::Entry::heap_bytes(&entry);
            self.map.removed(&mut s, heap);
        }
    }
}

/// The entry's units and state for a sync, when it was decided here since its last one
/// (its units then count as taken).
pub(super) fn take(e: &mut Entry) -> Option<Unsynced> {
    if e.pending == 0 && !e.touched {
        return None;
    }
    let taken = Unsynced {
        key: e.key.to_vec(),
        units: e.pending,
        tag: e.tag,
        state: e.state,
    };
    e.pending = 0;
    e.touched = false;
    Some(taken)
}

/// Charges `units` to every limit of `state` whether or not they fit.
pub(super) fn force_charge(policy: &Policy, state: &mut [u64], now: u64, units: u64) {
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
