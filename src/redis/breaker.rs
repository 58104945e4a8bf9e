//! The circuit breaker in front of every Redis-backed store (the rate-limit, in-flight
//! and fair-share stores).

use std::{
    future::Future,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use super::deadline::within;
use crate::{clock::Clock, error::StoreError};

/// The state of a Redis-backed store's circuit breaker
/// ([`RedisStore::breaker_state`](crate::store::RedisStore::breaker_state) and its
/// in-flight and fair-share peers). See the [`store::redis`](crate::store::redis) module
/// docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BreakerState {
    /// Calls go to Redis.
    Closed,
    /// Redis is not called; every decision follows the failure policy at once.
    Open,
    /// The cooldown has passed: one probe call is let through; its result closes or
    /// re-opens the breaker.
    HalfOpen,
}

impl BreakerState {
    /// The state as the breaker gauge's value: 0 closed, 1 half-open, 2 open.
    pub(crate) fn gauge(self) -> u8 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        }
    }
}

#[derive(Debug)]
struct Inner {
    state: BreakerState,
    failures: u32,
    /// When it opened, in the store clock's nanoseconds.
    opened_at: u64,
    probe_in_flight: bool,
}

/// Consecutive-failure breaker with a cooldown and a single half-open probe.
pub(crate) struct Breaker {
    threshold: u32,
    cooldown: Duration,
    clock: Arc<dyn Clock>,
    inner: Mutex<Inner>,
    /// `state == Closed && failures == 0`, republished under the lock after every change:
    /// the healthy steady state takes no lock at all.
    clean: AtomicBool,
}

impl std::fmt::Debug for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Breaker")
            .field("threshold", &self.threshold)
            .field("cooldown", &self.cooldown)
            .field("state", &self.state())
            .finish()
    }
}

/// Permission to call the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    Call,
    Probe,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cooldown: Duration, clock: Arc<dyn Clock>) -> Self {
        Breaker {
            threshold: threshold.max(1),
            cooldown,
            inner: Mutex::new(Inner {
                state: BreakerState::Closed,
                failures: 0,
                opened_at: clock.now(),
                probe_in_flight: false,
            }),
            clean: AtomicBool::new(true),
            clock,
        }
    }

    /// Makes the call `make` returns under the breaker and `deadline`: refused at once
    /// with [`StoreError::CircuitOpen`] while the breaker is open (the call is not made),
    /// otherwise made, its failure or missed deadline counted toward opening it.
    /// `changed` hears each change of state the call's outcome makes. A `deadline` shorter
    /// than the store's own deadline `own` is the time the request has left (a
    /// [`Budget`](super::deadline::Budget)): a call that misses it is not counted as a
    /// failure of Redis (it may not have had the time a call needs).
    pub(crate) async fn call<T, F>(
        &self,
        own: Duration,
        deadline: Duration,
        make: impl FnOnce() -> F,
        changed: impl FnOnce(BreakerState),
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        let Some(entered) = self.enter() else {
            return Err(StoreError::CircuitOpen);
        };
        let result = within(deadline, make()).await;
        if let Some(state) = entered.finish(own, deadline, &result) {
            changed(state);
        }
        result
    }

    /// [`Breaker::call`] in two steps, for a caller that makes the call itself: the
    /// permit to make it (`None` while the breaker is open), then
    /// [`Entered::finish`] with its result.
    pub(crate) fn enter(&self) -> Option<Entered<'_>> {
        let permit = self.permit()?;
        Some(Entered(PermitGuard {
            breaker: self,
            permit,
            done: false,
        }))
    }

    /// Whether the cooldown since `opened_at` has passed.
    fn cooled(&self, opened_at: u64) -> bool {
        self.clock.now().saturating_sub(opened_at) >= self.cooldown.as_nanos() as u64
    }

    fn publish(&self, i: &Inner) {
        self.clean.store(
            i.state == BreakerState::Closed && i.failures == 0,
            Ordering::Release,
        );
    }

    pub(crate) fn state(&self) -> BreakerState {
        let i = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if i.state == BreakerState::Open && self.cooled(i.opened_at) {
            BreakerState::HalfOpen
        } else {
            i.state
        }
    }

    /// Whether a call may go out now; `None` while open (or while a probe is out).
    pub(crate) fn permit(&self) -> Option<Permit> {
        if self.clean.load(Ordering::Acquire) {
            return Some(Permit::Call);
        }
        let mut i = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match i.state {
            BreakerState::Closed => Some(Permit::Call),
            BreakerState::Open if !self.cooled(i.opened_at) => None,
            BreakerState::Open | BreakerState::HalfOpen => {
                if i.probe_in_flight {
                    return None;
                }
                if i.state == BreakerState::Open {
                    i.state = BreakerState::HalfOpen;
                    tracing::info!(target: "tollgate::redis", "circuit breaker half-open: probing Redis");
                }
                i.probe_in_flight = true;
                Some(Permit::Probe)
            }
        }
    }

    /// A permitted call that succeeded; the state it moved the breaker to, if it did.
    pub(crate) fn success(&self, permit: Permit) -> Option<BreakerState> {
        if permit == Permit::Call && self.clean.load(Ordering::Acquire) {
            return None; // nothing to reset
        }
        let mut i = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        i.failures = 0;
        let change = (permit == Permit::Probe).then(|| {
            i.probe_in_flight = false;
            i.state = BreakerState::Closed;
            tracing::info!(target: "tollgate::redis", "circuit breaker closed: Redis answers again");
            BreakerState::Closed
        });
        self.publish(&i);
        change
    }

    /// A permitted call that never finished (its future was dropped).
    pub(crate) fn abandon(&self, permit: Permit) {
        if permit == Permit::Probe {
            self.inner
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .probe_in_flight = false;
        }
    }

    /// A permitted call that failed; the state it moved the breaker to, if it did.
    pub(crate) fn failure(
        &self,
        permit: Permit,
        what: &dyn std::fmt::Display,
    ) -> Option<BreakerState> {
        let mut i = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        self.clean.store(false, Ordering::Release);
        if permit == Permit::Probe {
            i.probe_in_flight = false;
            i.state = BreakerState::Open;
            i.opened_at = self.clock.now();
            tracing::warn!(target: "tollgate::redis", error = %what, "circuit breaker re-opened: probe failed");
            return Some(BreakerState::Open);
        }
        i.failures = i.failures.saturating_add(1);
        if i.state != BreakerState::Closed || i.failures < self.threshold {
            return None;
        }
        i.state = BreakerState::Open;
        i.opened_at = self.clock.now();
        tracing::warn!(
            target: "tollgate::redis",
            error = %what,
            failures = i.failures,
            cooldown = ?self.cooldown,
            "circuit breaker opened: Redis is not called until the cooldown has passed"
        );
        Some(BreakerState::Open)
    }
}

/// A call let through by [`Breaker::enter`]; dropped without
/// [`finish`](Entered::finish) (the call was dropped), it gives a probe's permit back.
pub(crate) struct Entered<'a>(PermitGuard<'a>);

impl Entered<'_> {
    /// Counts the call's `result` (made under `deadline`, the store's own being `own`, as
    /// in [`Breaker::call`]); the state it moved the breaker to, if it did.
    pub(crate) fn finish<T>(
        mut self,
        own: Duration,
        deadline: Duration,
        result: &Result<T, StoreError>,
    ) -> Option<BreakerState> {
        if deadline < own && matches!(result, Err(StoreError::Timeout(_))) {
            // Dropping the guard gives a probe's permit back.
            return None;
        }
        self.0.done = true;
        let (breaker, permit) = (self.0.breaker, self.0.permit);
        match result {
            Ok(_) => breaker.success(permit),
            Err(e) => breaker.failure(permit, e),
        }
    }
}

/// Releases a half-open probe whose call was dropped before it finished.
struct PermitGuard<'a> {
    breaker: &'a Breaker,
    permit: Permit,
    done: bool,
}

impl Drop for PermitGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.breaker.abandon(self.permit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_probes_and_closes() {
        let clock = crate::clock::ManualClock::new();
        let b = Breaker::new(2, Duration::from_millis(30), Arc::new(clock.clone()));
        let p = b.permit().unwrap();
        assert_eq!(b.failure(p, &"x"), None);
        assert_eq!(b.state(), BreakerState::Closed);
        let p = b.permit().unwrap();
        assert_eq!(b.failure(p, &"x"), Some(BreakerState::Open));
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.permit().is_none());
        clock.advance(Duration::from_millis(29));
        assert_eq!(
            b.state(),
            BreakerState::Open,
            "1 ms before the cooldown ends"
        );
        assert!(b.permit().is_none());
        clock.advance(Duration::from_millis(1));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let probe = b.permit().unwrap();
        assert_eq!(probe, Permit::Probe);
        assert!(b.permit().is_none(), "one probe at a time");
        assert_eq!(b.failure(probe, &"x"), Some(BreakerState::Open));
        assert_eq!(b.state(), BreakerState::Open);
        clock.advance(Duration::from_millis(30));
        let probe = b.permit().unwrap();
        assert_eq!(b.success(probe), Some(BreakerState::Closed));
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.success(Permit::Call), None);
        assert_eq!(b.permit(), Some(Permit::Call));
    }
}
