//! The reconciliation of a local state with Redis: each key decided here since its last
//! sync pushes the units admitted here (raising the shared state to the local one first,
//! should Redis have lost it) and pulls the shared state back. A
//! [`LocalFirstStore`](super::LocalFirstStore) runs a round every interval; a
//! [`RedisStore`](super::RedisStore)'s fallback when Redis answers again.

use std::sync::{atomic::Ordering, Arc, Weak};
use std::time::Duration;

use super::failure::{from_share, scaled_policy, to_share};
use super::local_state::{force_charge, take, Shared, Unsynced};
use super::script::{self, Mode};
use crate::{algorithm::MAX_WORDS, error::StoreError, policy::Policy, store::map};

/// Keys synced concurrently in one round.
const CONCURRENCY: usize = 16;

/// What a round syncs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Round {
    /// Every key decided here since the last round, with floors after Redis failed: a
    /// local-first store's round.
    Every,
    /// The keys with units admitted here, without floors (so through the batcher, if
    /// any): a fallback's round in the background, after an outage. Each key's floor goes
    /// with its own sync, before Redis decides it again for this instance.
    Admitted,
}

impl Shared {
    /// One round: the keys `round` says are pushed and pulled, by up to [`CONCURRENCY`]
    /// tasks. Returns how many keys were reconciled.
    pub(super) async fn sync_round(self: Arc<Self>, round: Round) -> Result<usize, StoreError> {
        let mut batch: Vec<Unsynced> = Vec::new();
        self.map.for_each_one(|e| {
            if round == Round::Every || e.pending > 0 {
                batch.extend(take(e));
            }
        });
        let floors = round == Round::Every && self.floors.load(Ordering::Acquire);
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
            tasks.spawn(async move { me.sync_keys(part, floors).await });
        }
        let mut result = Ok(n);
        while let Some(r) = tasks.join_next().await {
            if let Ok(Err(e)) = r {
                result = Err(e);
            }
        }
        self.rounds.fetch_add(1, Ordering::Relaxed);
        if result.is_ok() && round == Round::Every {
            self.floors.store(false, Ordering::Release);
        }
        if let Err(e) = &result {
            self.failed_rounds.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(target: "tollgate::redis", error = %e, "local sync round failed");
        }
        result
    }

    /// Syncs keys one after the other, with floors when `floors`; after a failure, or
    /// when the sync is dropped midway, the rest are put back unsent.
    pub(super) async fn sync_keys(
        &self,
        keys: Vec<Unsynced>,
        floors: bool,
    ) -> Result<(), StoreError> {
        let mut left = Unsent {
            shared: self,
            keys: keys.into_iter().rev().collect(),
        };
        while let Some(k) = left.keys.last() {
            // Dropped or failed here, the guard puts this key back with the rest.
            if let Err(e) = self.sync_one(k, floors).await {
                self.floors.store(true, Ordering::Release);
                return Err(e);
            }
            left.keys.pop();
        }
        Ok(())
    }

    /// Pushes one key's units and pulls the shared state back. With `floors`, a floor
    /// goes with them: the shared state as this instance knew it before admitting them
    /// (its local state with the units given back, at the whole quota). Where Redis kept
    /// the key, its state is already there or later; where Redis lost it, it comes back.
    async fn sync_one(&self, k: &Unsynced, floors: bool) -> Result<(), StoreError> {
        let Some(policy) = self.tags.policy(k.tag) else {
            return Ok(());
        };
        let limits = script::limit_args(&policy).map_err(StoreError::backend)?;
        let share = self.share.get();
        let local = scaled_policy(&policy, share).map_err(StoreError::backend)?;
        let floor = if floors {
            let mut known = k.state;
            local.refund(&mut known, self.now(), k.units);
            script::floor_args(&policy, &from_share(&policy, &known, share))
        } else {
            Vec::new()
        };
        let reply = self
            .update(&k.key, Mode::Sync, k.units, limits, floor)
            .await?;
        let (server_now, words) = script::decode_sync(&reply, &policy)?;
        if !self.overrides {
            let local = self.clock.now() as i64;
            self.offset
                .store(server_now as i64 - local, Ordering::Relaxed);
        }
        self.merge(&k.key, k.tag, &policy, words);
        Ok(())
    }

    fn put_back(&self, key: &[u8], units: u64) {
        let hash = map::hash_of(&self.hasher, key);
        let mut s = self.map.write(hash);
        if let Some(e) = s.one.find_mut(hash, |e| *e.key == *key) {
            e.pending = e.pending.saturating_add(units);
            e.touched = true;
        }
    }

    /// Replaces the local state by the shared one (at the store's share), then charges
    /// what was admitted here since the round started.
    fn merge(&self, key: &[u8], tag: u32, policy: &Policy, words: [u64; MAX_WORDS]) {
        let share = self.share.get();
        let local = match scaled_policy(policy, share) {
            Ok(p) => p,
            Err(_) => return,
        };
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
        e.state = to_share(policy, &words, share);
        if e.pending > 0 {
            force_charge(&local, &mut e.state, now, e.pending);
        }
    }
}

/// The keys of a sync not sent yet: put back if the sync is dropped before it sends them.
struct Unsent<'a> {
    shared: &'a Shared,
    /// In reverse order: the next to send is last.
    keys: Vec<Unsynced>,
}

impl Drop for Unsent<'_> {
    fn drop(&mut self) {
        for k in self.keys.drain(..) {
            self.shared.put_back(&k.key, k.units);
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
        let _ = shared.sync_round(Round::Every).await;
    }
}
