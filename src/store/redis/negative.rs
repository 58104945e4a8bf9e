//! The negative cache: refusals remembered locally until their retry-after.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex, PoisonError,
    },
    time::Duration,
};

use crate::decision::{Decision, Outcome, Source};

/// Times are the store clock's nanoseconds.
type Nanos = u64;

const MIN_SWEEP: usize = 64;

#[derive(Debug)]
struct Entry {
    /// The fingerprint of the policy that refused: another policy's request is not
    /// answered here.
    policy: u64,
    /// When the refused request becomes admissible (the store's retry-after counted from
    /// the moment the call was sent, so never later than the store's own answer).
    until: Nanos,
    /// The refused cost: a smaller cost may be admitted earlier and is not answered here.
    cost: u64,
    sent: Nanos,
    decision: Decision,
}

#[derive(Debug)]
struct Map {
    entries: HashMap<Vec<u8>, Entry>,
    sweep_at: usize,
}

/// A bounded map from Redis key to its last refusal.
#[derive(Debug)]
pub(super) struct NegativeCache {
    max: usize,
    map: Mutex<Map>,
    /// Entries held, updated under the lock: an empty cache is skipped without locking.
    len: AtomicUsize,
}

impl NegativeCache {
    pub(super) fn new(max: usize) -> Self {
        NegativeCache {
            max,
            map: Mutex::new(Map {
                entries: HashMap::new(),
                sweep_at: MIN_SWEEP.min(max),
            }),
            len: AtomicUsize::new(0),
        }
    }

    /// The remembered refusal of `key` for `cost`, with its times brought up to `now`.
    pub(super) fn lookup(
        &self,
        key: &[u8],
        policy: u64,
        cost: u64,
        now: Nanos,
    ) -> Option<Decision> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut m = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let e = m.entries.get(key)?;
        if now >= e.until {
            m.entries.remove(key);
            self.len.store(m.entries.len(), Ordering::Release);
            return None;
        }
        if cost < e.cost || e.policy != policy {
            return None;
        }
        let elapsed = now.saturating_sub(e.sent);
        let mut d = e.decision;
        d.outcome = Outcome::Denied {
            retry_after: Duration::from_nanos(e.until - now),
        };
        for r in d.limits.iter_mut().take(d.len as usize) {
            r.reset_after = r.reset_after.saturating_sub(elapsed);
            r.next_after = r.next_after.saturating_sub(elapsed);
        }
        Some(d.with_source(Source::NegativeCache))
    }

    /// Remembers a refusal decided by a call sent at `sent`; `now` is the time it arrived.
    pub(super) fn insert(
        &self,
        key: Vec<u8>,
        policy: u64,
        cost: u64,
        sent: Nanos,
        now: Nanos,
        decision: Decision,
    ) {
        let Outcome::Denied { retry_after } = decision.outcome else {
            return;
        };
        if retry_after < Duration::from_micros(100) {
            return; // not worth remembering
        }
        let until = sent.saturating_add(retry_after.as_nanos() as u64);
        let mut m = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if !m.entries.contains_key(&key) && m.entries.len() >= m.sweep_at {
            m.entries.retain(|_, e| e.until > now);
            let len = m.entries.len();
            m.sweep_at = (len * 2).clamp(MIN_SWEEP.min(self.max), self.max);
            if len >= self.max {
                // Full of live refusals: forget the one that ends soonest.
                if let Some(k) = m
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| e.until)
                    .map(|(k, _)| k.clone())
                {
                    m.entries.remove(&k);
                }
            }
        }
        m.entries.insert(
            key,
            Entry {
                policy,
                until,
                cost,
                sent,
                decision,
            },
        );
        self.len.store(m.entries.len(), Ordering::Release);
    }

    /// Forgets the refusal remembered for `key` (under whichever policy).
    pub(super) fn remove(&self, key: &[u8]) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut m = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        m.entries.remove(key);
        self.len.store(m.entries.len(), Ordering::Release);
    }
}
