//! What the listener decides of a new connection: exempt, admitted (holding a place in
//! the counts until it closes), admitted in the place of a connection that gives way, or
//! refused and why.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::progress::{Close, Timing};
use super::slots::{SlotRef, Slots};
use super::watch::{Refusal, Watch};
use crate::key::{cidr::Cidr, PeerIp};
use crate::store::MemoryStore;

/// Connections evicted and not yet closed, at most: past it, new connections wait in the
/// backlog for them to close.
pub(super) const MAX_EVICTING: u32 = 32;

/// What gives way when a [`LimitedListener`](super::LimitedListener) holds as many
/// connections as [`ConnectionLimits::max_total`](super::ConnectionLimits::max_total)
/// allows and a new one arrives.
///
/// See the [module docs](super).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenFull {
    /// The open connection that has made the least progress while the server waits on it
    /// is closed, and the new one admitted in its place: the one idle the longest, or
    /// whose head or body lags its minimum rate the most (among the next 1 024 open
    /// connections, taken in turn). A connection in the server's turn (its request read
    /// whole, its response not yet written) never gives way; when every one is, the new
    /// connection is refused.
    #[default]
    CloseStalest,
    /// The new connection is refused (reset at accept).
    Refuse,
}

/// What every connection of one listener shares: its limits, the counts of open
/// connections, and its observer.
pub(super) struct Gate {
    pub(super) group: PeerIp,
    pub(super) exempt: Vec<Cidr>,
    pub(super) max_per_address: u32,
    pub(super) max_total: Option<u32>,
    pub(super) when_full: WhenFull,
    /// The rate of new connections per address group, when limits were given.
    pub(super) rate: Option<MemoryStore<IpAddr>>,
    pub(super) timing: Timing,
    /// Time zero of the connections' clocks.
    pub(super) epoch: Instant,
    pub(super) counts: Mutex<Counts>,
    /// Told when an evicted connection closes.
    pub(super) evicted_closed: Notify,
    pub(super) watch: Watch,
}

/// Open connections: in total, and per address group (an entry only while the group has
/// one open, so the map holds at most as many entries as connections are open); the
/// connections' slots, and how many of them are evicted and not yet closed.
#[derive(Default)]
pub(super) struct Counts {
    total: u32,
    evicting: u32,
    per: HashMap<IpAddr, u32, foldhash::fast::RandomState>,
    slots: Slots,
}

fn lock(m: &Mutex<Counts>) -> MutexGuard<'_, Counts> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Gate {
    /// Now on the connections' clocks.
    pub(super) fn now(&self) -> u64 {
        super::progress::nanos(Instant::now().saturating_duration_since(self.epoch))
    }

    /// Admits a connection from `ip` (its place held by the returned [`Place`]), or says
    /// why not. The counts are checked before the rate, so that a connection refused for
    /// them spends none of its address's rate. When the listener is full, the connection
    /// that has made the least progress gives way (as [`WhenFull`] says). Connections are
    /// admitted one at a time (the listener accepts them in turn), and closing ones only
    /// free room, so the counts checked are still good when the place is taken.
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Place, Refusal> {
        let group = self.group.group(ip);
        let exempt = self.exempt.iter().any(|c| c.contains(group));
        {
            let counts = lock(&self.counts);
            if self.full(&counts) && self.when_full == WhenFull::Refuse {
                return Err(Refusal::Total);
            }
            let per = || counts.per.get(&group).copied().unwrap_or(0);
            if !exempt && per() >= self.max_per_address {
                return Err(Refusal::PerAddress);
            }
        }
        if let (false, Some(rate)) = (exempt, &self.rate) {
            let d = rate.check(&group, 1);
            if !d.wait().is_zero() {
                // A connection cannot wait for a queue's slot: refused, its unit back.
                rate.refund(&group, 1);
                return Err(Refusal::Rate);
            }
            if !d.is_allowed() {
                return Err(Refusal::Rate);
            }
        }
        let mut counts = lock(&self.counts);
        let mut evicted = false;
        if self.full(&counts) {
            evicted = counts.evicting < MAX_EVICTING && counts.slots.evict_stalest();
            if !evicted {
                drop(counts);
                if let (false, Some(rate)) = (exempt, &self.rate) {
                    rate.refund(&group, 1);
                }
                return Err(Refusal::Total);
            }
            counts.evicting += 1;
        }
        counts.total += 1;
        *counts.per.entry(group).or_insert(0) += 1;
        let accepted = self.now();
        let slot = counts.slots.take(accepted);
        let open = counts.total;
        drop(counts);
        if evicted {
            self.watch.closed_by(Close::Evicted);
        }
        self.watch.opened(exempt, open);
        Ok(Place {
            gate: Arc::clone(self),
            group,
            slot,
            accepted,
        })
    }

    /// Whether the listener holds as many connections as it may, not counting those
    /// evicted and on their way out.
    fn full(&self, counts: &Counts) -> bool {
        self.max_total
            .is_some_and(|max| counts.total - counts.evicting >= max)
    }

    /// Whether a new connection would find the listener full with as many evicted
    /// connections still closing as it waits for.
    pub(super) fn saturated(&self) -> bool {
        let counts = lock(&self.counts);
        self.full(&counts) && counts.evicting >= MAX_EVICTING
    }

    fn close(&self, group: IpAddr, slot: &SlotRef) {
        let mut counts = lock(&self.counts);
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.per.get_mut(&group) {
            *n -= 1;
            if *n == 0 {
                counts.per.remove(&group);
                // A flood of addresses is gone: give the table's memory back.
                if counts.per.is_empty() && counts.per.capacity() > 1024 {
                    counts.per = HashMap::default();
                }
            }
        }
        let open = counts.total;
        let evicted = counts.slots.give_back(slot, open);
        if evicted {
            counts.evicting = counts.evicting.saturating_sub(1);
        }
        drop(counts);
        if evicted {
            self.evicted_closed.notify_one();
        }
        self.watch.closed(open);
    }

    /// Open connections: in total, and the address groups that have one.
    pub(super) fn open(&self) -> (u32, usize) {
        let counts = lock(&self.counts);
        (counts.total, counts.per.len())
    }
}

/// An admitted connection's place in the counts, given back when it is dropped (when the
/// connection closes), and its slot.
pub(super) struct Place {
    pub(super) gate: Arc<Gate>,
    group: IpAddr,
    pub(super) slot: SlotRef,
    /// When it was admitted, on the connections' clocks.
    pub(super) accepted: u64,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.gate.close(self.group, &self.slot);
    }
}
