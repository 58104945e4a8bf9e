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

use super::connection::RedisConnection;
use super::deadline::within;
use crate::observe::Throttle;
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
    /// The connection's generation when it opened: a connection rebuilt since is probed
    /// at once, without waiting out the cooldown.
    opened_generation: u64,
    probe_in_flight: bool,
    /// When the current outage began (the first opening since it was last closed).
    outage_since: u64,
}

/// Consecutive-failure breaker with a cooldown and a single half-open probe. Its openings
/// and closings are logged at most once per [`Throttle::INTERVAL_MS`] each, with how many
/// were left out.
pub(crate) struct Breaker {
    threshold: u32,
    cooldown: Duration,
    clock: Arc<dyn Clock>,
    /// The connection the store calls through (for its generation; none in unit tests).
    conn: Option<RedisConnection>,
    inner: Mutex<Inner>,
    opened_log: Throttle,
    closed_log: Throttle,
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
    pub(crate) fn new(
        threshold: u32,
        cooldown: Duration,
        clock: Arc<dyn Clock>,
        conn: Option<&RedisConnection>,
    ) -> Self {
        Breaker {
            threshold: threshold.max(1),
            cooldown,
            inner: Mutex::new(Inner {
                state: BreakerState::Closed,
                failures: 0,
                opened_at: clock.now(),
                opened_generation: 0,
                probe_in_flight: false,
                outage_since: 0,
            }),
            clean: AtomicBool::new(true),
            clock,
            conn: conn.cloned(),
            opened_log: Throttle::default(),
            closed_log: Throttle::default(),
        }
    }

    /// The store clock's time in ms (at least 1), for the logs' throttles.
    fn millis(&self) -> u64 {
        self.clock.now() / 1_000_000 + 1
    }

    /// Makes the call `make` returns under the breaker and `deadline`: refused at once
    /// with [`StoreError::CircuitOpen`] while the breaker is open (the call is not made),
    /// otherwise made, its failure or missed deadline counted toward opening it.
    /// `changed` hears each change of state the call's outcome makes. A `deadline` may be
    /// shorter than the store's own (the time the request has left, a
    /// [`Budget`](crate::store::Budget)): a call that misses it counts all the same, as
    /// Redis did not answer in the time the request had.
    pub(crate) async fn call<T, F>(
        &self,
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
        if let Some(state) = entered.finish(&result) {
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

    /// Whether an open breaker may probe now: its cooldown has passed, or the connection
    /// was rebuilt since it opened.
    fn may_probe(&self, i: &Inner) -> bool {
        self.cooled(i.opened_at) || self.generation() != i.opened_generation
    }

    fn generation(&self) -> u64 {
        self.conn.as_ref().map_or(0, RedisConnection::generation)
    }

    pub(crate) fn state(&self) -> BreakerState {
        let i = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if i.state == BreakerState::Open && self.may_probe(&i) {
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
            BreakerState::Open if !self.may_probe(&i) => None,
            BreakerState::Open | BreakerState::HalfOpen => {
                if i.probe_in_flight {
                    return None;
                }
                if i.state == BreakerState::Open {
                    i.state = BreakerState::HalfOpen;
                    tracing::debug!(target: "tollgate::redis", "circuit breaker half-open: probing Redis");
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
            let now = self.clock.now();
            let outage = Duration::from_nanos(now.saturating_sub(i.outage_since));
            if let Some(suppressed) = self.closed_log.first(self.millis()) {
                tracing::info!(
                    target: "tollgate::redis",
                    ?outage,
                    suppressed,
                    "circuit breaker closed: Redis answers again (logged at most once per 10 s; `suppressed`: closings since the last line)"
                );
            }
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
            self.open(&mut i, what, "circuit breaker opened again: probe failed");
            return Some(BreakerState::Open);
        }
        i.failures = i.failures.saturating_add(1);
        if i.state != BreakerState::Closed || i.failures < self.threshold {
            return None;
        }
        i.outage_since = self.clock.now();
        self.open(
            &mut i,
            what,
            "circuit breaker opened: Redis is not called until the cooldown has passed",
        );
        Some(BreakerState::Open)
    }

    /// Opens the breaker, logging `message` unless another opening was logged within the
    /// throttle's interval.
    fn open(&self, i: &mut Inner, what: &dyn std::fmt::Display, message: &str) {
        i.state = BreakerState::Open;
        i.opened_at = self.clock.now();
        i.opened_generation = self.generation();
        if let Some(suppressed) = self.opened_log.first(self.millis()) {
            tracing::warn!(
                target: "tollgate::redis",
                error = %what,
                failures = i.failures,
                cooldown = ?self.cooldown,
                suppressed,
                "{message} (logged at most once per 10 s; `suppressed`: openings since the last line)"
            );
        }
    }
}

/// A call let through by [`Breaker::enter`]; dropped without
/// [`finish`](Entered::finish) (the call was dropped), it gives a probe's permit back.
pub(crate) struct Entered<'a>(PermitGuard<'a>);

impl Entered<'_> {
    /// Counts the call's `result` (a missed deadline as a failure, whatever the deadline,
    /// as in [`Breaker::call`]); the state it moved the breaker to, if it did.
    pub(crate) fn finish<T>(mut self, result: &Result<T, StoreError>) -> Option<BreakerState> {
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
        let b = Breaker::new(2, Duration::from_millis(30), Arc::new(clock.clone()), None);
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
