//! [`MemoryInFlight`]: per-key counts of requests in flight and their FIFO queues, in a
//! sharded map of this process.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use hashbrown::HashTable;
use pin_project_lite::pin_project;
use tokio::time::Sleep;

use super::store::sealed::{Attach, Backend};
use super::store::Acquired;
use super::store::Acquiring;
use super::store::Attempt;
use super::store::InFlightStore;
use super::store::Limits;
use super::store::Permit;
use super::store::Release;
use crate::store::map::{default_shards, hash_of, KeyHasher};
use crate::store::Budget;

/// The in-process store of an in-flight limit (the default): for each key with a request
/// in flight, its count and the queue of requests waiting for a slot. A key's entry goes
/// as soon as nothing is in flight or waiting for it, so a flood of distinct keys holds
/// only what is in flight. Cheap to clone: clones share the counts.
///
/// See the [module docs](super).
pub struct MemoryInFlight<K> {
    table: Arc<Table<K>>,
}

impl<K> Clone for MemoryInFlight<K> {
    fn clone(&self) -> Self {
        MemoryInFlight {
            table: Arc::clone(&self.table),
        }
    }
}

impl<K> fmt::Debug for MemoryInFlight<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryInFlight")
            .field("keys", &self.len())
            .finish()
    }
}

impl<K> Default for MemoryInFlight<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> MemoryInFlight<K> {
    /// An empty store. A layer builds its own; build one to share counts between layers
    /// ([`InFlightLimitBuilder::build_with`](super::InFlightLimitBuilder::build_with)).
    pub fn new() -> Self {
        let shards = default_shards();
        MemoryInFlight {
            table: Arc::new(Table {
                shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
                hasher: KeyHasher::default(),
            }),
        }
    }

    /// How many keys have a request in flight or waiting now.
    pub fn len(&self) -> usize {
        self.table.shards.iter().map(|s| lock(s).index.len()).sum()
    }

    /// Whether no key has a request in flight or waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

struct Table<K> {
    shards: Box<[Mutex<Shard<K>>]>,
    hasher: KeyHasher,
}

struct Shard<K> {
    /// Indices into `entries`, by the hash of the key.
    index: HashTable<u32>,
    entries: Vec<Option<Entry<K>>>,
    free: Vec<u32>,
    next_ticket: u64,
}

impl<K> Default for Shard<K> {
    fn default() -> Self {
        Shard {
            index: HashTable::new(),
            entries: Vec::new(),
            free: Vec::new(),
            next_ticket: 0,
        }
    }
}

struct Entry<K> {
    key: Option<K>,
    hash: u64,
    /// Slots held: by admitted requests and by waiters granted a slot they have not yet
    /// picked up.
    count: u32,
    waiting: VecDeque<Waiter>,
    /// Tickets of waiters handed a slot, until their future picks it up.
    granted: Vec<u64>,
}

struct Waiter {
    ticket: u64,
    waker: Option<Waker>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A slot's address: shard in the high half, entry in the low half.
fn slot(shard: usize, entry: u32) -> u64 {
    ((shard as u64) << 32) | u64::from(entry)
}

fn unslot(slot: u64) -> (usize, usize) {
    ((slot >> 32) as usize, (slot & 0xffff_ffff) as usize)
}

impl<K> Shard<K> {
    fn entry(&mut self, i: usize) -> Option<&mut Entry<K>> {
        self.entries.get_mut(i).and_then(Option::as_mut)
    }

    /// Forgets entry `i` if nothing is in flight or waiting for it.
    fn forget_if_idle(&mut self, i: usize) {
        let Some(e) = self.entry(i) else { return };
        if e.count > 0 || !e.waiting.is_empty() {
            return;
        }
        let hash = e.hash;
        if let Ok(found) = self.index.find_entry(hash, |&j| j as usize == i) {
            found.remove();
        }
        self.entries[i] = None;
        self.free.push(i as u32);
        // A flood of distinct keys is gone: give its memory back.
        if self.index.is_empty() && self.entries.len() > 64 {
            self.entries = Vec::new();
            self.free = Vec::new();
            self.index = HashTable::new();
        }
    }

    /// Gives one slot of entry `i` back: to the first waiter, or to the pool. Returns the
    /// waiter's waker to wake once the lock is released.
    fn give_back(&mut self, i: usize) -> Option<Waker> {
        let e = self.entry(i)?;
        if let Some(w) = e.waiting.pop_front() {
            e.granted.push(w.ticket);
            return w.waker;
        }
        e.count = e.count.saturating_sub(1);
        self.forget_if_idle(i);
        None
    }
}

impl<K: Send + 'static> Release for Table<K> {
    fn release(&self, slot: u64) {
        let (s, i) = unslot(slot);
        let Some(shard) = self.shards.get(s) else {
            return;
        };
        let waker = lock(shard).give_back(i);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<K: Hash + Eq + Send + 'static> Table<K> {
    fn acquire(self: &Arc<Self>, key: Option<K>, limits: &Limits) -> Attempt {
        let hash = hash_of(&self.hasher, &key);
        let s = (hash >> 32) as usize % self.shards.len();
        let mut shard = lock(&self.shards[s]);
        let shard = &mut *shard;
        let found = shard.index.find(hash, |&j| {
            shard.entries[j as usize]
                .as_ref()
                .is_some_and(|e| e.key == key)
        });
        let i = match found {
            Some(&i) => i as usize,
            None => {
                if limits.max == 0 {
                    return Attempt::Now(Acquired::Full);
                }
                let entry = Entry {
                    key,
                    hash,
                    count: 0,
                    waiting: VecDeque::new(),
                    granted: Vec::new(),
                };
                let i = match shard.free.pop() {
                    Some(i) => {
                        shard.entries[i as usize] = Some(entry);
                        i
                    }
                    None => {
                        shard.entries.push(Some(entry));
                        (shard.entries.len() - 1) as u32
                    }
                };
                let entries = &shard.entries;
                shard.index.insert_unique(hash, i, |&j| {
                    entries[j as usize].as_ref().map_or(0, |e| e.hash)
                });
                i as usize
            }
        };
        let ticket = shard.next_ticket;
        let Some(e) = shard.entry(i) else {
            return Attempt::Now(Acquired::Full);
        };
        if e.count < limits.max && e.waiting.is_empty() {
            e.count += 1;
            let remaining = limits.max - e.count;
            let owner: Arc<dyn Release> = self.clone();
            return Attempt::Now(Acquired::Admitted {
                permit: Permit::new(owner, slot(s, i as u32)),
                remaining,
            });
        }
        if limits.max == 0 || e.waiting.len() as u64 >= u64::from(limits.queue) {
            return Attempt::Now(Acquired::Full);
        }
        e.waiting.push_back(Waiter {
            ticket,
            waker: None,
        });
        shard.next_ticket += 1;
        let wait = Wait {
            ticket: Ticket {
                table: self.clone(),
                slot: slot(s, i as u32),
                ticket,
                armed: true,
            },
            max: limits.max,
            sleep: tokio::time::sleep(limits.max_wait),
        };
        Attempt::Later(Acquiring::new(wait))
    }
}

/// A place in a key's queue; leaves it (or gives back the slot it was handed) when
/// dropped before the slot is picked up.
struct Ticket<K> {
    table: Arc<Table<K>>,
    slot: u64,
    ticket: u64,
    armed: bool,
}

impl<K> Ticket<K> {
    /// The slot, if it was handed over: with the key's free slots after it (`None`: the
    /// key's entry is gone, which a waiter's presence prevents; refused rather than hung).
    fn poll_turn(&mut self, max: u32, cx: &mut Context<'_>) -> Poll<Option<u32>> {
        let (s, i) = unslot(self.slot);
        let mut shard = lock(&self.table.shards[s]);
        let Some(e) = shard.entry(i) else {
            self.armed = false;
            return Poll::Ready(None);
        };
        if let Some(pos) = e.granted.iter().position(|&t| t == self.ticket) {
            e.granted.swap_remove(pos);
            self.armed = false;
            return Poll::Ready(Some(max.saturating_sub(e.count)));
        }
        if let Some(w) = e.waiting.iter_mut().find(|w| w.ticket == self.ticket) {
            match &mut w.waker {
                Some(old) if old.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
        }
        Poll::Pending
    }

    /// Leaves the queue, or passes on the slot it was handed.
    fn leave(&mut self) {
        if !std::mem::replace(&mut self.armed, false) {
            return;
        }
        let (s, i) = unslot(self.slot);
        let mut shard = lock(&self.table.shards[s]);
        let Some(e) = shard.entry(i) else { return };
        let waker = if let Some(pos) = e.granted.iter().position(|&t| t == self.ticket) {
            // Handed a slot it will never use: pass it on.
            e.granted.swap_remove(pos);
            shard.give_back(i)
        } else {
            e.waiting.retain(|w| w.ticket != self.ticket);
            shard.forget_if_idle(i);
            None
        };
        drop(shard);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<K> Drop for Ticket<K> {
    fn drop(&mut self) {
        self.leave();
    }
}

pin_project! {
    /// A request waiting in its key's queue, at most `max_wait`.
    struct Wait<K> {
        ticket: Ticket<K>,
        max: u32,
        #[pin]
        sleep: Sleep,
    }
}

impl<K: Send + 'static> Future for Wait<K> {
    type Output = Acquired;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Acquired> {
        let this = self.project();
        // A slot handed over wins over a timeout due at the same instant.
        if let Poll::Ready(turn) = this.ticket.poll_turn(*this.max, cx) {
            let Some(remaining) = turn else {
                return Poll::Ready(Acquired::Full);
            };
            let owner: Arc<dyn Release> = this.ticket.table.clone();
            return Poll::Ready(Acquired::Admitted {
                permit: Permit::new(owner, this.ticket.slot),
                remaining,
            });
        }
        match this.sleep.poll(cx) {
            Poll::Ready(()) => {
                this.ticket.leave();
                Poll::Ready(Acquired::Full)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<K: Hash + Eq + Send + Sync + 'static> Backend<K> for MemoryInFlight<K> {
    fn acquire(&self, key: Option<K>, limits: &Limits, _: Option<&Budget>) -> Attempt {
        self.table.acquire(key, limits)
    }
}

impl<K: Hash + Eq + Send + Sync + 'static> InFlightStore<K> for MemoryInFlight<K> {}

impl<K> Attach for MemoryInFlight<K> {}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const LIMITS: Limits = Limits {
        max: 1,
        queue: 2,
        max_wait: Duration::from_secs(60),
    };

    fn now(a: Attempt) -> Acquired {
        match a {
            Attempt::Now(o) => o,
            Attempt::Later(_) => panic!("queued"),
        }
    }

    fn later(a: Attempt) -> Acquiring {
        match a {
            Attempt::Later(w) => w,
            Attempt::Now(o) => panic!("decided at once: {o:?}"),
        }
    }

    /// Whether `w` is still waiting (paused time: the probe's timer fires at once).
    async fn pending(w: &mut Acquiring) -> bool {
        tokio::time::timeout(Duration::from_millis(1), w)
            .await
            .is_err()
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_goes_to_the_oldest_waiter_and_the_entry_goes_last() {
        let store = MemoryInFlight::<&str>::new();
        let Acquired::Admitted { permit, remaining } = now(store.acquire(Some("k"), &LIMITS, None))
        else {
            panic!("a free slot")
        };
        assert_eq!(remaining, 0);
        let mut w1 = later(store.acquire(Some("k"), &LIMITS, None));
        let mut w2 = later(store.acquire(Some("k"), &LIMITS, None));
        assert!(matches!(
            now(store.acquire(Some("k"), &LIMITS, None)),
            Acquired::Full
        ));
        assert!(pending(&mut w1).await && pending(&mut w2).await);
        drop(permit);
        assert!(pending(&mut w2).await);
        let Acquired::Admitted { permit, .. } = (&mut w1).await else {
            panic!("handed over")
        };
        drop(permit);
        let Acquired::Admitted { permit, .. } = w2.await else {
            panic!("handed over")
        };
        assert_eq!(store.len(), 1);
        drop(permit);
        assert!(store.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_keys_leaves_nothing_behind() {
        let store = MemoryInFlight::<u32>::new();
        // Enough keys for every shard (at most 256) to pass 64 entries.
        let permits: Vec<_> = (0..100_000)
            .map(|k| now(store.acquire(Some(k), &LIMITS, None)))
            .collect();
        assert_eq!(store.len(), 100_000);
        drop(permits);
        assert!(store.is_empty());
        let capacity: usize = store
            .table
            .shards
            .iter()
            .map(|s| lock(s).entries.capacity())
            .sum();
        assert_eq!(capacity, 0, "the shards gave their memory back");
    }

    #[test]
    fn slots_round_trip() {
        for (s, e) in [(0, 0), (255, u32::MAX), (7, 42)] {
            assert_eq!(unslot(slot(s, e)), (s, e as usize));
        }
    }
}
