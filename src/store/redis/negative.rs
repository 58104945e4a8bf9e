//! The negative cache: refusals remembered locally until their retry-after.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use crate::decision::{Decision, Outcome, Source};

const MIN_SWEEP: usize = 64;

#[derive(Debug)]
struct Entry {
    /// When the refused request becomes admissible (the store's retry-after counted from
    /// the moment the call was sent, so never later than the store's own answer).
    until: Instant,
    /// The refused cost: a smaller cost may be admitted earlier and is not answered here.
    cost: u64,
    sent: Instant,
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
}

impl NegativeCache {
    pub(super) fn new(max: usize) -> Self {
        NegativeCache {
            max,
            map: Mutex::new(Map {
                entries: HashMap::new(),
                sweep_at: MIN_SWEEP.min(max),
            }),
        }
    }

    /// The remembered refusal of `key` for `cost`, with its times brought up to now.
    pub(super) fn lookup(&self, key: &[u8], cost: u64) -> Option<Decision> {
        let mut m = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let e = m.entries.get(key)?;
        let now = Instant::now();
        if now >= e.until {
            m.entries.remove(key);
            return None;
        }
        if cost < e.cost {
            return None;
        }
        let elapsed = now.duration_since(e.sent).as_nanos() as u64;
        let mut d = e.decision;
        d.outcome = Outcome::Denied {
            retry_after: e.until - now,
        };
        for r in d.limits.iter_mut().take(d.len as usize) {
            r.reset_after = r.reset_after.saturating_sub(elapsed);
            r.next_after = r.next_after.saturating_sub(elapsed);
        }
        Some(d.with_source(Source::NegativeCache))
    }

    /// Remembers a refusal decided by a call sent at `sent`.
    pub(super) fn insert(&self, key: Vec<u8>, cost: u64, sent: Instant, decision: Decision) {
        let Outcome::Denied { retry_after } = decision.outcome else {
            return;
        };
        if retry_after < Duration::from_micros(100) {
            return; // not worth remembering
        }
        let until = sent + retry_after;
        let mut m = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if !m.entries.contains_key(&key) && m.entries.len() >= m.sweep_at {
            let now = Instant::now();
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
                until,
                cost,
                sent,
                decision,
            },
        );
    }

    pub(super) fn remove(&self, key: &[u8]) {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entries
            .remove(key);
    }
}
