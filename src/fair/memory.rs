//! [`MemoryFair`]: one pool and its keys' states in this process.

use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use hashbrown::HashMap;

use super::share::{decide, key_is_fresh, FairDecision, KeyState, Pool, PoolState, Share};
use super::store::{
    sealed::{Attach, Backend},
    FairStore,
};
use crate::clock::{Clock, TokioClock};
use crate::store::StoreFuture;

/// What one key's entry holds in memory, beside the key itself and the table's
/// overhead, for the budget.
const ENTRY_BYTES: usize = std::mem::size_of::<KeyState>() + 16;
/// The default memory budget of the keys' states.
const DEFAULT_MAX_BYTES: usize = 32 << 20;

/// The in-process store of a fair-sharing pool (the default): the pool's state and each
/// key's, under one lock (every decision reads and writes the pool, so a pool is one hot
/// spot whatever the layout). Keys whose state is back to fresh are dropped when the table
/// is full; past the memory budget, new keys share one state until room is made, so a
/// flood of keys cannot grow memory. Cheap to clone: clones share the pool.
///
/// Layers built on one store share its pool: give them the same pool quota.
pub struct MemoryFair<K, C = TokioClock> {
    state: Arc<Mutex<State<K>>>,
    clock: C,
    max_keys: usize,
}

struct State<K> {
    pool: PoolState,
    keys: HashMap<K, KeyState, foldhash::fast::RandomState>,
    /// Keyless requests (and new keys while the table is full).
    shared: KeyState,
}

impl<K, C: Clone> Clone for MemoryFair<K, C> {
    fn clone(&self) -> Self {
        MemoryFair {
            state: Arc::clone(&self.state),
            clock: self.clock.clone(),
            max_keys: self.max_keys,
        }
    }
}

impl<K, C> fmt::Debug for MemoryFair<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryFair")
            .field("keys", &self.len())
            .field("max_keys", &self.max_keys)
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
                keys: HashMap::default(),
                shared: KeyState::default(),
            })),
            clock: TokioClock::new(),
            max_keys: DEFAULT_MAX_BYTES / (ENTRY_BYTES + std::mem::size_of::<K>()),
        }
    }
}

impl<K, C> MemoryFair<K, C> {
    /// Holds at most `bytes` of key states (keys included, at their inline size).
    pub fn with_max_bytes(mut self, bytes: usize) -> Self {
        self.max_keys = (bytes / (ENTRY_BYTES + std::mem::size_of::<K>())).max(1);
        self
    }

    /// Uses another clock (a [`ManualClock`](crate::clock::ManualClock) in tests and
    /// simulations).
    pub fn with_clock<C2: Clock>(self, clock: C2) -> MemoryFair<K, C2> {
        MemoryFair {
            state: self.state,
            clock,
            max_keys: self.max_keys,
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
        let Some(key) = key else {
            return decide(pool, share, &mut s.pool, &mut s.shared, now);
        };
        if let Some(k) = s.keys.get_mut(key) {
            return decide(pool, share, &mut s.pool, k, now);
        }
        if s.keys.len() >= self.max_keys {
            s.keys.retain(|_, k| !key_is_fresh(pool, k, now));
        }
        if s.keys.len() >= self.max_keys {
            return decide(pool, share, &mut s.pool, &mut s.shared, now);
        }
        let k = s.keys.entry(key.clone()).or_default();
        decide(pool, share, &mut s.pool, k, now)
    }
}

impl<K, C> Attach for MemoryFair<K, C> {}

impl<K, C> Backend<K> for MemoryFair<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    fn decide(&self, key: Option<&K>, pool: &Pool, share: &Share) -> StoreFuture<FairDecision> {
        StoreFuture::ready(Ok(self.decide_now(key, pool, share)))
    }
}

impl<K, C> FairStore<K> for MemoryFair<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
}
