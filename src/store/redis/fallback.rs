//! The local fallback of a [`RedisStore`](super::RedisStore): what decides while Redis
//! cannot, and how it stays tied to the shared state.
//!
//! Every answer from Redis leaves the key's state here, as of that answer, at the share
//! (the local state of a [`LocalFirstStore`](super::LocalFirstStore), the same map and
//! the same sync): while Redis fails, a key's requests are decided from the state Redis
//! last returned for it, advanced by the clock (a key Redis never answered for starts
//! full, at its share). When Redis answers again, a key decided here meanwhile is synced
//! before Redis decides it again (its units charged to the shared state, which is first
//! raised to what this instance knew of it, should Redis have lost it), and a round in
//! the background pushes the units of the others (batched with the store's calls).

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, Mutex, PoisonError,
};
use std::time::Duration;

use super::failure::to_share;
use super::local_state::{force_charge, Shared as Local, Unsynced};
use super::local_sync::Round;
use super::script::Mode;
use crate::algorithm::{Params, MAX_WORDS};
use crate::decision::{Decision, Source};
use crate::error::StoreError;
use crate::policy::Policy;

/// Scaled policies kept for reuse (policies per plan, times the shares seen lately).
const SCALED: usize = 8;

/// How long a background round waits after Redis answers again, gathering what is still
/// decided here meanwhile: the most often rounds run (Redis may just have come back from
/// an overload).
const ROUND_PACE: Duration = Duration::from_millis(100);

/// A store's local fallback. See the [module docs](self).
pub(super) struct Fallback {
    pub(super) local: Arc<Local>,
    /// Set by every local decision: the next answer from Redis syncs what was decided.
    dirty: AtomicBool,
    /// Whether a background round runs.
    syncing: AtomicBool,
    /// Policies at a share, by the policy's fingerprint and the share's bits.
    scaled: Mutex<Vec<(u64, u64, Policy)>>,
}

impl Fallback {
    pub(super) fn new(local: Local) -> Self {
        Fallback {
            local: Arc::new(local),
            dirty: AtomicBool::new(false),
            syncing: AtomicBool::new(false),
            scaled: Mutex::new(Vec::new()),
        }
    }

    /// The share of each quota applied now.
    pub(super) fn share(&self) -> f64 {
        self.local.share.get()
    }

    /// `policy` at `share`; `None` when it cannot be scaled.
    fn scaled(&self, policy: &Policy, share: f64) -> Option<Policy> {
        let id = (policy.fingerprint(), share.to_bits());
        let mut cache = self.scaled.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, _, p)) = cache.iter().find(|(f, s, _)| (*f, *s) == id) {
            return Some(p.clone());
        }
        let p = super::failure::scaled_policy(policy, share).ok()?;
        if cache.len() == SCALED {
            cache.remove(0);
        }
        cache.push((id.0, id.1, p.clone()));
        Some(p)
    }

    /// Redis decided `d` for `key` under `policy` (a check: a peek's report describes the
    /// state its cost would leave): the key's local state becomes the state of that
    /// answer at the share, with the units admitted here and not yet synced charged on
    /// top, unless it holds a later one already (concurrent answers may come back in any
    /// order). A fresh answer for a key not held here is not kept.
    pub(super) fn record(&self, key: &[u8], policy: &Policy, d: &Decision) {
        let share = self.share();
        let Some(local) = self.scaled(policy, share) else {
            return;
        };
        let now = self.local.now();
        let state = answered_state(policy, d, now);
        let apply = |e: &mut super::local_state::Entry, now: u64| {
            let mut answered = to_share(policy, &state, share);
            if e.pending > 0 {
                force_charge(&local, &mut answered, now, e.pending);
            }
            e.state = fuller(policy, &e.state, &answered);
        };
        if state == [0; MAX_WORDS] {
            self.local.existing(key, policy, apply);
        } else {
            self.local.entry(key, policy, false, apply);
        }
    }

    /// Decides locally (Redis failed), from the key's state at the share; `None` when
    /// the policy cannot be scaled.
    pub(super) fn decide(
        &self,
        key: &[u8],
        policy: &Policy,
        mode: Mode,
        cost: u64,
    ) -> Option<Decision> {
        let local = self.scaled(policy, self.share())?;
        if mode == Mode::Peek {
            // A look changes nothing, not even the policy the key's state is kept under.
            let d = self
                .local
                .look(key, policy, |state, now| local.peek(state, now, cost));
            return Some(d.with_source(Source::Fallback));
        }
        let d = self.local.entry(key, policy, true, |e, now| {
            let d = local.decide(&mut e.state, now, cost);
            if d.is_allowed() {
                e.pending = e.pending.saturating_add(cost);
            }
            d
        });
        self.local.floors.store(true, Ordering::Release);
        self.dirty.store(true, Ordering::Release);
        Some(d.with_source(Source::Fallback))
    }

    /// Bans `key` under `policy` for `ban_ns` here (Redis failed to take the ban).
    pub(super) fn ban(&self, key: &[u8], policy: &Policy, ban_ns: u64) {
        if let Some(local) = self.scaled(policy, self.share()) {
            self.local.entry(key, policy, false, |e, now| {
                local.ban(&mut e.state, now, ban_ns)
            });
        }
    }

    /// The key's units and state to sync before Redis decides it again, when it was
    /// decided here since its last sync.
    pub(super) fn take(&self, key: &[u8]) -> Option<Unsynced> {
        if !self.dirty.load(Ordering::Acquire) {
            return None;
        }
        self.local.take(key)
    }

    /// Syncs one key taken by [`Fallback::take`], with its floor (put back if this fails
    /// or is dropped).
    pub(super) async fn sync(&self, key: Unsynced) -> Result<(), StoreError> {
        let floors = self.local.floors.load(Ordering::Acquire);
        self.local.sync_keys(vec![key], floors).await
    }

    /// Redis answered: when keys were decided here since the last round, a round pushes
    /// their units in the background (inside a tokio runtime), [`ROUND_PACE`] later.
    pub(super) fn answered(self: &Arc<Self>) {
        if !self.dirty.load(Ordering::Acquire) || self.syncing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.syncing.store(false, Ordering::Release);
            return;
        };
        let me = Arc::clone(self);
        handle.spawn(async move {
            tokio::time::sleep(ROUND_PACE).await;
            me.dirty.store(false, Ordering::Release);
            if me.local.clone().sync_round(Round::Admitted).await.is_err() {
                me.dirty.store(true, Ordering::Release);
            }
            me.syncing.store(false, Ordering::Release);
        });
    }
}

/// The state of `policy` (in the in-memory layout, at `now`) that Redis's answer `d`
/// describes: a GCRA limit's TAT is now plus its fill (its report's reset time, exact); a
/// window's count is what its remaining leaves of the limit (a debt above the limit reads
/// as the limit), in the window its reset time falls in; a sliding window's whole estimate
/// counts as the current window's (it then decays a window later than it would, the
/// cautious side).
fn answered_state(policy: &Policy, d: &Decision, now: u64) -> [u64; MAX_WORDS] {
    let mut out = [0; MAX_WORDS];
    for ((l, span), r) in policy.spans().zip(d.limits()) {
        let off = span.start;
        let reset = r.reset_after;
        match l.params {
            Params::Gcra(_) => {
                if reset > 0 {
                    out[off] = now.saturating_add(reset);
                }
            }
            Params::Fixed(w) => {
                if reset > 0 {
                    out[off] = w.tag(now.saturating_add(reset - 1));
                    out[off + 1] = w.limit.saturating_sub(r.remaining);
                }
            }
            Params::Sliding(w) => {
                let used = w.limit.saturating_sub(r.remaining);
                if reset > 0 && used > 0 {
                    out[off] = w.tag(now);
                    out[off + 2] = used;
                }
            }
        }
    }
    out
}

/// Of two states of `policy`, the later, limit by limit: a GCRA limit's later TAT; a
/// window's later window, or in the same window the larger of each count.
fn fuller(policy: &Policy, a: &[u64; MAX_WORDS], b: &[u64; MAX_WORDS]) -> [u64; MAX_WORDS] {
    let mut out = *a;
    for (l, span) in policy.spans() {
        let (x, y) = (&a[span.clone()], &b[span.clone()]);
        if y[0] > x[0] {
            out[span].copy_from_slice(y);
        } else if y[0] == x[0] && !matches!(l.params, Params::Gcra(_)) {
            for (o, c) in out[span.start + 1..span.end].iter_mut().zip(&y[1..]) {
                *o = (*o).max(*c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Limit;
    use crate::quota::Quota;

    /// What the in-memory store decides, read back through its answer: the same state
    /// (GCRA, fixed window) or a cautious one (sliding window).
    #[test]
    fn an_answer_gives_back_the_state_that_made_it() {
        let policy = Policy::new(
            Limit::token_bucket(Quota::per_second(10).unwrap().with_burst(20).unwrap()).unwrap(),
        )
        .and(Limit::fixed_window(Quota::per_minute(7).unwrap()).unwrap())
        .unwrap()
        .and(Limit::sliding_window(Quota::per_minute(9).unwrap()).unwrap())
        .unwrap();
        let now = 1_700_000_000_123_456_789;
        let mut state = [0; MAX_WORDS];
        let mut d = policy.decide(&mut state, now, 1);
        for _ in 0..3 {
            d = policy.decide(&mut state, now + 1_000, 1);
        }
        let got = answered_state(&policy, &d, now + 1_000);
        assert_eq!(got[0], state[0], "the bucket's TAT");
        assert_eq!(got[1..3], state[1..3], "the fixed window's tag and count");
        assert_eq!(got[3], state[3], "the sliding window's tag");
        assert_eq!(got[4] + got[5], 4, "the sliding window's units");
        // Deciding on from the answer's state answers as the store does.
        let later = now + 2_000_000_000;
        let mut from_answer = got;
        assert_eq!(
            policy.decide(&mut from_answer, later, 2).outcome(),
            policy.decide(&mut state, later, 2).outcome()
        );
        // An earlier answer coming back last leaves the later state.
        let earlier = answered_state(&policy, &policy.peek(&[0; MAX_WORDS], now, 0), now);
        assert_eq!(fuller(&policy, &got, &earlier), got);
        assert_eq!(fuller(&policy, &earlier, &got), got);
        // A fresh key's answer is no state.
        let fresh = policy.peek(&[0; MAX_WORDS], now, 0);
        assert_eq!(answered_state(&policy, &fresh, now), [0; MAX_WORDS]);
    }
}
