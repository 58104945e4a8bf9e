//! [`MemoryFair`]: one pool and its keys' states in this process.

use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use hashbrown::HashTable;

use super::share::{decide, key_fresh_at, FairDecision, KeyState, Pool, PoolState, Share};
use super::store::{
    sealed::{Attach, Backend},
    FairStore,
};
use crate::clock::{Clock, TokioClock};
use crate::store::map::{hash_of, Geometry, KeyHasher};
use crate::store::Budget;
use crate::store::{Digest, SipKeys, StoreFuture};

/// The default memory budget of the keys' states.
const DEFAULT_MAX_BYTES: usize = 32 << 20;

/// The in-process store of a fair-sharing pool (the default): the pool's state and each
/// key's, under one lock (every decision reads and writes the pool, so a pool is one hot
/// spot whatever the layout). Cheap to clone: clones share the pool.
///
/// Memory is bounded in bytes (32 MiB by default, [`with_max_bytes`](Self::with_max_bytes)):
/// the budget covers the table of keys' states, keys included. As in the
/// [`MemoryStore`](crate::store::MemoryStore), a key type that owns no heap memory (an
/// address, an integer) is kept as it is, and any other (a `String`, a header value) as a
/// 96-bit keyed digest of it, 12 bytes whatever its length. Keys whose state is back to
/// fresh are dropped when the table is full; past the budget, new keys share one state
/// until room is made, so a flood of keys cannot grow memory.
///
/// Layers built on one store share its pool: give them the same pool quota.
pub struct MemoryFair<K, C = TokioClock> {
    state: Arc<Mutex<State<K>>>,
    clock: C,
}

struct State<K> {
    pool: PoolState,
    keys: Keys<K>,
    /// Keyless requests (and new keys while the table is full).
    shared: KeyState,
}

/// The keys' states: keyed by the key itself or by a digest of it, within a budget.
enum Keys<K> {
    Inline(Table<K>, KeyHasher),
    Digest(Table<Digest>, SipKeys),
}

/// One table of keys' states and the sizes it may take.
struct Table<Q> {
    states: HashTable<(Q, KeyState)>,
    geometry: Geometry,
    /// No key held can be fresh before this time (0: unknown): a full table is swept for
    /// fresh keys only from then on, so a flood of new keys does not sweep it each time.
    sweep_at: u64,
}

impl<Q> Table<Q> {
    /// A table within `max_bytes`, or the smallest table if that is larger.
    fn new(max_bytes: usize) -> Self {
        let smallest = HashTable::<(Q, KeyState)>::with_capacity(1).allocation_size();
        Table {
            states: HashTable::new(),
            geometry: Geometry::for_budget::<(Q, KeyState)>(max_bytes.max(smallest)),
            sweep_at: 0,
        }
    }
}

impl<Q: Eq> Table<Q> {
    /// The state of the key `q` (of hash `hash`) at `now`, added if the budget has room
    /// for it: after dropping the fresh keys if it has none. `None`: no room.
    fn state(
        &mut self,
        q: Q,
        hash: u64,
        rehash: impl Fn(&Q) -> u64,
        fresh_at: impl Fn(&KeyState) -> u64,
        now: u64,
    ) -> Option<&mut KeyState> {
        let Table {
            states,
            geometry,
            sweep_at,
        } = self;
        if states.find(hash, |e| e.0 == q).is_none() {
            if geometry.after_insert(states).is_none() {
                if now < *sweep_at {
                    return None;
                }
                let mut next = u64::MAX;
                states.retain(|e| {
                    let at = fresh_at(&e.1);
                    next = next.min(at);
                    at > now
                });
                *sweep_at = next;
                geometry.after_insert(states)?;
            }
            // The new key may come to be fresh before any other.
            *sweep_at = 0;
        }
        let entry = states.entry(hash, |e| e.0 == q, |e| rehash(&e.0));
        Some(&mut entry.or_insert((q, KeyState::default())).into_mut().1)
    }
}

impl<K> Keys<K> {
    fn new(max_bytes: usize) -> Self {
        if std::mem::needs_drop::<K>() {
            Keys::Digest(Table::new(max_bytes), SipKeys::random())
        } else {
            Keys::Inline(Table::new(max_bytes), KeyHasher::default())
        }
    }

    fn len(&self) -> usize {
        match self {
            Keys::Inline(t, _) => t.states.len(),
            Keys::Digest(t, _) => t.states.len(),
        }
    }
}

impl<K, C: Clone> Clone for MemoryFair<K, C> {
    fn clone(&self) -> Self {
        MemoryFair {
            state: Arc::clone(&self.state),
            clock: self.clock.clone(),
        }
    }
}

impl<K, C> fmt::Debug for MemoryFair<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryFair")
            .field("keys", &self.len())
            .finish_non_exhaustive()
    }
}

impl<K> Default for MemoryFair<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> MemoryFair<K> {
    /// An empty store on tokio's clock, holding at most 32 MiB of key states. A layer
    /// builds its own; build one to share a pool between layers.
    pub fn new() -> Self {
        MemoryFair {
            state: Arc::new(Mutex::new(State {
                pool: PoolState::default(),
                keys: Keys::new(DEFAULT_MAX_BYTES),
                shared: KeyState::default(),
            })),
            clock: TokioClock::new(),
        }
    }
}

impl<K, C> MemoryFair<K, C> {
    /// Holds at most `bytes` of key states: the table's allocation, keys included (a key
    /// that owns heap memory is kept as a 12-byte digest). The smallest table (three keys)
    /// is held whatever the budget.
    pub fn with_max_bytes(self, bytes: usize) -> Self {
        lock(&self.state).keys = Keys::new(bytes);
        self
    }

    /// Uses another clock (a [`ManualClock`](crate::clock::ManualClock) in tests and
    /// simulations).
    pub fn with_clock<C2: Clock>(self, clock: C2) -> MemoryFair<K, C2> {
        MemoryFair {
            state: self.state,
            clock,
        }
    }

    /// How many keys have a state.
    pub fn len(&self) -> usize {
        lock(&self.state).keys.len()
    }

    /// Whether no key has a state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K, C> MemoryFair<K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    fn decide_now(&self, key: Option<&K>, pool: &Pool, share: &Share) -> FairDecision {
        let mut guard = lock(&self.state);
        // The clock is read under the lock, so decisions are made in time order.
        let now = self.clock.now();
        let s = &mut *guard;
        let fresh_at = |k: &KeyState| key_fresh_at(pool, k);
        let state = key.and_then(|key| match &mut s.keys {
            Keys::Inline(t, h) => {
                let h = &*h;
                t.state(
                    key.clone(),
                    hash_of(h, key),
                    |k| hash_of(h, k),
                    fresh_at,
                    now,
                )
            }
            Keys::Digest(t, sip) => {
                let d = sip.digest(key);
                t.state(d, d.hash(), Digest::hash, fresh_at, now)
            }
        });
        decide(
            pool,
            share,
            &mut s.pool,
            state.unwrap_or(&mut s.shared),
            now,
        )
    }
}

impl<K, C> Attach for MemoryFair<K, C> {}

impl<K, C> Backend<K> for MemoryFair<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    fn decide(
        &self,
        key: Option<&K>,
        pool: &Pool,
        share: &Share,
        _: Option<&Budget>,
    ) -> StoreFuture<FairDecision> {
        StoreFuture::ready(Ok(self.decide_now(key, pool, share)))
    }
}

impl<K, C> FairStore<K> for MemoryFair<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
}
