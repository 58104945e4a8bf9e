//! What the listener decides of a new connection: exempt, admitted (holding a place in
//! the counts until it closes), or refused and why.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::watch::{Refusal, Watch};
use crate::key::{cidr::Cidr, PeerIp};
use crate::store::MemoryStore;

/// What every connection of one listener shares: its limits, the counts of open
/// connections, and its observer.
pub(super) struct Gate {
    pub(super) group: PeerIp,
    pub(super) exempt: Vec<Cidr>,
    pub(super) max_per_address: Option<u32>,
    pub(super) max_total: Option<u32>,
    /// The rate of new connections per address group, when limits were given.
    pub(super) rate: Option<MemoryStore<IpAddr>>,
    pub(super) head_timeout: Option<Duration>,
    pub(super) counts: Mutex<Counts>,
    pub(super) watch: Watch,
}

/// Open connections: in total, and per address group (an entry only while the group has
/// one open, so the map holds at most as many entries as connections are open).
#[derive(Default)]
pub(super) struct Counts {
    total: u32,
    per: HashMap<IpAddr, u32, foldhash::fast::RandomState>,
}

fn lock(m: &Mutex<Counts>) -> MutexGuard<'_, Counts> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Gate {
    /// Admits a connection from `ip` (its place held by the returned [`Place`]), or says
    /// why not. The counts are checked before the rate, so that a connection refused for
    /// them spends none of its address's rate. Connections are admitted one at a time (the
    /// listener accepts them in turn), and closing ones only free room, so the counts
    /// checked are still good when the place is taken.
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Place, Refusal> {
        let group = self.group.group(ip);
        let exempt = self.exempt.iter().any(|c| c.contains(group));
        {
            let counts = lock(&self.counts);
            if self.max_total.is_some_and(|max| counts.total >= max) {
                return Err(Refusal::Total);
            }
            let per = || counts.per.get(&group).copied().unwrap_or(0);
            if !exempt && self.max_per_address.is_some_and(|max| per() >= max) {
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
        counts.total += 1;
        *counts.per.entry(group).or_insert(0) += 1;
        let open = counts.total;
        drop(counts);
        self.watch.opened(exempt, open);
        Ok(Place {
            gate: Arc::clone(self),
            group,
        })
    }

    fn close(&self, group: IpAddr) {
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
        drop(counts);
        self.watch.closed(open);
    }

    /// Open connections: in total, and the address groups that have one.
    pub(super) fn open(&self) -> (u32, usize) {
        let counts = lock(&self.counts);
        (counts.total, counts.per.len())
    }
}

/// An admitted connection's place in the counts, given back when it is dropped (when the
/// connection closes).
pub(super) struct Place {
    pub(super) gate: Arc<Gate>,
    group: IpAddr,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.gate.close(self.group);
    }
}
