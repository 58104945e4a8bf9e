//! What is observed of a listener: its connections counted in metrics (feature
//! `metrics`), and its refusals, the connections it closes and accept errors logged at
//! most once a second each.

use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::progress::Close;
use crate::observe::{key_hash, unix_secs, Bind, Count, Level, OncePerSecond};
use crate::observe::{CLOSED_CONNECTIONS, CONNECTIONS, OPEN_CONNECTIONS};

/// Why a connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Its address group opened new connections faster than its rate.
    Rate = 0,
    /// Its address group has as many connections open as it may.
    PerAddress = 1,
    /// The listener has as many connections open as it may.
    Total = 2,
}

impl Refusal {
    fn result(self) -> &'static str {
        match self {
            Refusal::Rate => "rate_limited",
            Refusal::PerAddress => "address_full",
            Refusal::Total => "total_full",
        }
    }
}

/// Events counted between two log lines, at most one a second.
#[derive(Default)]
struct Tally {
    since: AtomicU64,
    logged: OncePerSecond,
}

impl Tally {
    /// Counts an event: the events since the last log line, when this one is to be logged.
    fn tick(&self) -> Option<u64> {
        let n = self.since.fetch_add(1, Ordering::Relaxed) + 1;
        self.logged.first(unix_secs()).then(|| {
            self.since.store(0, Ordering::Relaxed);
            n
        })
    }
}

impl Close {
    fn reason(self) -> &'static str {
        match self {
            Close::Head => "head_timeout",
            Close::Body => "slow_body",
            Close::Idle => "idle_timeout",
            Close::Evicted => "evicted",
        }
    }

    const ALL: [Close; 4] = [Close::Head, Close::Body, Close::Idle, Close::Evicted];
}

/// A listener's metrics and logs.
pub(super) struct Watch {
    label: Arc<str>,
    refusals: Tally,
    /// Connections closed, by [`Close`].
    closes: [Tally; 4],
    errors_logged: OncePerSecond,
    tls_logged: AtomicBool,
    metrics: Metrics,
}

/// A listener's series: `tollgate.connections_total` by result (admitted, exempt, then
/// the refusals in [`Refusal`]'s order), the connections it closed by reason (in
/// [`Close`]'s order), and the connections open.
struct Metrics {
    results: [Count; 5],
    closed: [Count; 4],
    open: Level,
}

impl Watch {
    pub(super) fn new(label: Arc<str>) -> Self {
        let l = ("tollgate.listener", &*label);
        let metrics = Metrics {
            results: [
                "admitted",
                "exempt",
                Refusal::Rate.result(),
                Refusal::PerAddress.result(),
                Refusal::Total.result(),
            ]
            .map(|r| Count::new(CONNECTIONS, &[l, ("tollgate.result", r)], Bind::Now)),
            closed: Close::ALL.map(|c| {
                let reason = ("tollgate.reason", c.reason());
                Count::new(CLOSED_CONNECTIONS, &[l, reason], Bind::Now)
            }),
            open: Level::new(OPEN_CONNECTIONS, &[l], Bind::Now),
        };
        Watch {
            label,
            refusals: Tally::default(),
            closes: Default::default(),
            errors_logged: OncePerSecond::default(),
            tls_logged: AtomicBool::new(false),
            metrics,
        }
    }

    /// A connection opened, `open` now open in all.
    pub(super) fn opened(&self, exempt: bool, open: u32) {
        self.metrics.results[usize::from(exempt)].add(1);
        self.metrics.open.set(f64::from(open));
    }

    /// A connection closed, `open` still open in all.
    pub(super) fn closed(&self, open: u32) {
        self.metrics.open.set(f64::from(open));
    }

    /// A refused connection: counted; logged (with the refusals since the last event) at
    /// most once a second.
    pub(super) fn refused(&self, why: Refusal, group: IpAddr) {
        self.metrics.results[2 + why as usize].add(1);
        if let Some(n) = self.refusals.tick() {
            tracing::warn!(
                target: "tollgate",
                listener = %self.label,
                refused = n,
                reason = why.result(),
                key = %format_args!("{:016x}", key_hash(&group)),
                "connections refused at accept (count since the last such event)"
            );
        }
    }

    /// A connection the listener closed: counted; logged (with the closes for the same
    /// reason since the last event) at most once a second, except idle ones.
    pub(super) fn closed_by(&self, why: Close) {
        self.metrics.closed[why as usize].add(1);
        let Some(n) = self.closes[why as usize].tick() else {
            return;
        };
        let what = match why {
            Close::Head => "no whole request head by the deadline, or at the minimum rate",
            Close::Body => "a request body below the minimum rate",
            Close::Evicted => {
                "the listener was full: the connections with the least progress gave way"
            }
            Close::Idle => return,
        };
        tracing::warn!(
            target: "tollgate",
            listener = %self.label,
            closed = n,
            reason = why.reason(),
            "connections closed: {what} (count since the last such event)"
        );
    }

    /// A failed `accept` (out of descriptors, say), logged at most once a second.
    pub(super) fn accept_failed(&self, error: &io::Error) {
        if self.errors_logged.first(unix_secs()) {
            tracing::error!(target: "tollgate", listener = %self.label, %error, "accept failed");
        }
    }

    /// A TLS connection: logged once per listener.
    pub(super) fn tls(&self) {
        if !self.tls_logged.swap(true, Ordering::Relaxed) {
            tracing::info!(
                target: "tollgate",
                listener = %self.label,
                "TLS connections arrive at this listener: it cannot read their requests, so it times none of them (it ranks them by their last byte when full)"
            );
        }
    }
}
