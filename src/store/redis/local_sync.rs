//! The reconciliation of a [`LocalFirstStore`](super::LocalFirstStore) with Redis: every
//! interval, each key used since the last round pushes the units admitted here and pulls
//! the shared state back.

use std::sync::{atomic::Ordering, Arc, Weak};
use std::time::Duration;

use super::local_state::{force_charge, Shared};
use super::script::{self, Mode};
use crate::{algorithm::MAX_WORDS, error::StoreError, policy::Policy, store::map};

/// Keys synced concurrently in one round.
const CONCURRENCY: usize = 16;

impl Shared {
    /// One round: every key used since the last one is pushed and pulled, by up to
    /// [`CONCURRENCY`] tasks. Returns how many keys were reconciled.
    pub(super) async fn sync_round(self: Arc<Self>) -> Result<usize, StoreError> {
        let mut batch: Vec<(Vec<u8>, u64, u32)> = Vec::new();
        self.map.for_each_one(|e| {
            if e.pending > 0 || e.touched {
                batch.push((e.key.to_vec(), e.pending, e.tag));
                e.pending = 0;
                e.touched = false;
            }
        });
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
    async fn sync_keys(&self, keys: Vec<(Vec<u8>, u64, u32)>) -> Result<(), StoreError> {
        let mut failed: Option<StoreError> = None;
        for (key, units, tag) in keys {
            let policy = self.tags.policy(tag);
            let limits = policy.as_ref().map(script::limit_args);
            let (Some(policy), Some(Ok(limits)), None) = (policy, limits, &failed) else {
                self.put_back(&key, units);
                continue;
            };
            let r = self.update(&key, Mode::Sync, units, limits).await;
            match r.and_then(|reply| script::decode_sync(&reply, &policy)) {
                Ok((server_now, words)) => {
                    if !self.overrides {
                        let local = self.clock.now() as i64;
                        self.offset
                            .store(server_now as i64 - local, Ordering::Relaxed);
                    }
                    self.merge(&key, tag, &policy, words);
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
        let hash = map::hash_of(&self.hasher, key);
        let mut s = self.map.write(hash);
        if let Some(e) = s.one.find_mut(hash, |e| *e.key == *key) {
            e.pending = e.pending.saturating_add(units);
            e.touched = true;
        }
    }

    /// Replaces the local state by the shared one, then charges what was admitted here
    /// since the round started.
    fn merge(&self, key: &[u8], tag: u32, policy: &Policy, words: [u64; MAX_WORDS]) {
        let hash = map::hash_of(&self.hasher, key);
        let mut s = self.map.write(hash);
        let now = self.now();
        let Some(e) = s.one.find_mut(hash, |e| *e.key == *key) else {
            return;
        };
        // Decided under another policy since the round began: the next round syncs it.
        if e.tag != tag {
            return;
        }
        e.state = words;
        if e.pending > 0 {
            force_charge(policy, &mut e.state, now, e.pending);
        }
    }
}

/// Runs a round every `interval` until the store is dropped.
pub(super) async fn run(weak: Weak<Shared>, interval: Duration) {
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
