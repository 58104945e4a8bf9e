//! Every open connection's slot, where the listener finds the one to close when it is
//! full: each connection publishes its rank there while the server waits on it (and its
//! task's waker), and the accept loop scans them. Slots come in chunks that never move, so
//! a connection writes its own without a lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Waker;

/// Slots in a chunk.
const CHUNK: usize = 64;

/// Slots scanned for the one to close, at most, per connection admitted when full: from
/// where the last scan stopped, so that every slot is seen in turn.
pub(super) const WINDOW: usize = 1024;

/// A rank meaning "not waited on": the server's turn, or no connection.
const UNRANKED: u64 = u64::MAX;

/// One connection's published state.
#[derive(Debug)]
struct Slot {
    /// While the server waits on the connection: since when it has made no progress.
    rank: AtomicU64,
    /// Chosen to give way: its next read or write fails.
    evicted: AtomicBool,
    /// The waker of the task that last waited on a read: woken when the slot is evicted.
    waker: Mutex<Option<Waker>>,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            rank: AtomicU64::new(UNRANKED),
            evicted: AtomicBool::new(false),
            waker: Mutex::new(None),
        }
    }
}

#[derive(Debug)]
struct Chunk {
    slots: [Slot; CHUNK],
}

/// A connection's own slot.
#[derive(Debug)]
pub(super) struct SlotRef {
    chunk: Arc<Chunk>,
    id: u32,
}

impl SlotRef {
    fn slot(&self) -> &Slot {
        &self.chunk.slots[self.id as usize % CHUNK]
    }

    /// Publishes the connection's rank (`None`: not waited on).
    pub(super) fn rank(&self, rank: Option<u64>) {
        self.slot()
            .rank
            .store(rank.unwrap_or(UNRANKED), Ordering::Relaxed);
    }

    /// Keeps `waker` to be woken if the connection is evicted.
    pub(super) fn wake_with(&self, waker: &Waker) {
        let mut w = self
            .slot()
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !w.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *w = Some(waker.clone());
        }
    }

    pub(super) fn evicted(&self) -> bool {
        self.slot().evicted.load(Ordering::Acquire)
    }
}

/// The slots of a listener's open connections.
#[derive(Debug, Default)]
pub(super) struct Slots {
    chunks: Vec<Arc<Chunk>>,
    free: Vec<u32>,
    /// Where the next scan starts.
    hand: usize,
}

impl Slots {
    /// A slot for a new connection, ranked `rank` (its accept: until its server first
    /// reads it, it has made no progress since then).
    pub(super) fn take(&mut self, rank: u64) -> SlotRef {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let base = (self.chunks.len() * CHUNK) as u32;
                self.chunks.push(Arc::new(Chunk {
                    slots: std::array::from_fn(|_| Slot::default()),
                }));
                self.free.extend((base + 1..base + CHUNK as u32).rev());
                base
            }
        };
        let chunk = Arc::clone(&self.chunks[id as usize / CHUNK]);
        let slot = &chunk.slots[id as usize % CHUNK];
        slot.rank.store(rank, Ordering::Relaxed);
        slot.evicted.store(false, Ordering::Relaxed);
        *slot.waker.lock().unwrap_or_else(PoisonError::into_inner) = None;
        SlotRef { chunk, id }
    }

    /// Gives a closed connection's slot back: whether it had been evicted. `open` is the
    /// connections still open: with none, a flood's chunks are given back.
    pub(super) fn give_back(&mut self, slot: &SlotRef, open: u32) -> bool {
        let s = slot.slot();
        s.rank.store(UNRANKED, Ordering::Relaxed);
        let evicted = s.evicted.load(Ordering::Relaxed);
        *s.waker.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.free.push(slot.id);
        if open == 0 && self.chunks.len() > 16 {
            *self = Slots::default();
        }
        evicted
    }

    /// Evicts the connection that has made the least progress while the server waits on
    /// it, among the next [`WINDOW`] slots: `false` when none of them is waited on. Its
    /// task is woken, and its next read or write fails.
    pub(super) fn evict_stalest(&mut self) -> bool {
        let n = self.chunks.len() * CHUNK;
        let window = n.min(WINDOW);
        let mut stalest: Option<(u64, &Slot)> = None;
        for k in 0..window {
            let id = (self.hand + k) % n;
            let slot = &self.chunks[id / CHUNK].slots[id % CHUNK];
            let rank = slot.rank.load(Ordering::Relaxed);
            if rank != UNRANKED
                && stalest.is_none_or(|(r, _)| rank < r)
                && !slot.evicted.load(Ordering::Relaxed)
            {
                stalest = Some((rank, slot));
            }
        }
        if n > 0 {
            self.hand = (self.hand + window) % n;
        }
        let Some((_, slot)) = stalest else {
            return false;
        };
        slot.evicted.store(true, Ordering::Release);
        slot.rank.store(UNRANKED, Ordering::Relaxed);
        let waker = slot
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(w) = waker {
            w.wake();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_rank_is_evicted_and_unranked_slots_never() {
        let mut slots = Slots::default();
        let conns: Vec<_> = (0..100).map(|_| slots.take(UNRANKED)).collect();
        for (i, c) in conns.iter().enumerate() {
            c.rank(if i % 10 == 3 {
                None
            } else {
                Some(1000 - i as u64)
            });
        }
        // Lowest first: 99 (rank 901), then 98, ...; 93 is never ranked.
        assert!(slots.evict_stalest());
        assert!(conns[99].evicted() && !conns[98].evicted());
        assert!(slots.evict_stalest());
        assert!(conns[98].evicted());
        for c in &conns {
            c.rank(None);
        }
        assert!(!slots.evict_stalest(), "none waited on");
        assert!(!conns[0].evicted());
    }

    #[test]
    fn a_slot_given_back_is_fresh_when_taken_again() {
        let mut slots = Slots::default();
        let a = slots.take(UNRANKED);
        a.rank(Some(5));
        assert!(slots.evict_stalest());
        assert!(slots.give_back(&a, 0));
        let b = slots.take(UNRANKED);
        assert_eq!(b.id, a.id);
        assert!(!b.evicted());
        assert!(!slots.evict_stalest());
    }

    #[test]
    fn a_connection_not_yet_read_ranks_from_its_accept() {
        let mut slots = Slots::default();
        let older = slots.take(10);
        let newer = slots.take(20);
        assert!(slots.evict_stalest());
        assert!(older.evicted() && !newer.evicted());
    }

    #[test]
    fn each_scan_looks_at_the_next_window() {
        let mut slots = Slots::default();
        let conns: Vec<_> = (0..WINDOW + CHUNK).map(|_| slots.take(UNRANKED)).collect();
        // The lowest rank lies past the first window: the first scan finds the first
        // window's lowest; later scans reach it.
        for (i, c) in conns.iter().enumerate() {
            c.rank(Some(if i == WINDOW + 5 { 0 } else { 100 + i as u64 }));
        }
        assert!(slots.evict_stalest());
        assert!(conns[0].evicted() && !conns[WINDOW + 5].evicted());
        assert!(slots.evict_stalest());
        assert!(conns[WINDOW + 5].evicted());
    }
}
