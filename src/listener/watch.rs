//! What is observed of a listener: its connections counted in metrics (feature
//! `metrics`), and its refusals, closed heads and accept errors logged at most once a
//! second each.

use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::observe::{key_hash, unix_secs, Bind, Count, Level, OncePerSecond};
use crate::observe::{CONNECTIONS, HEAD_TIMEOUTS, OPEN_CONNECTIONS};

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

/// A listener's metrics and logs.
pub(super) struct Watch {
    label: Arc<str>,
    refusals: Tally,
    late_heads: Tally,
    errors_logged: OncePerSecond,
    metrics: Metrics,
}

/// A listener's series: `tollgate.connections_total` by result (admitted, exempt, then
/// the refusals in [`Refusal`]'s order), closed heads, and the connections open.
struct Metrics {
    results: [Count; 5],
    head_timeouts: Count,
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
            head_timeouts: Count::new(HEAD_TIMEOUTS, &[l], Bind::Now),
            open: Level::new(OPEN_CONNECTIONS, &[l], Bind::Now),
        };
        Watch {
            label,
            refusals: Tally::default(),
            late_heads: Tally::default(),
            errors_logged: OncePerSecond::default(),
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

    /// A connection closed for not sending its first request head in time.
    pub(super) fn head_timed_out(&self) {
        self.metrics.head_timeouts.add(1);
        if let Some(n) = self.late_heads.tick() {
            tracing::warn!(
                target: "tollgate",
                listener = %self.label,
                closed = n,
                "connections closed: no request head by the deadline (count since the last such event)"
            );
        }
    }

    /// A failed `accept` (out of descriptors, say), logged at most once a second.
    pub(super) fn accept_failed(&self, error: &io::Error) {
        if self.errors_logged.first(unix_secs()) {
            tracing::error!(target: "tollgate", listener = %self.label, %error, "accept failed");
        }
    }

    /// A TLS connection under a head deadline, which cannot read its head.
    pub(super) fn tls_under_head_deadline(&self) {
        if self.errors_logged.first(unix_secs()) {
            tracing::warn!(
                target: "tollgate",
                listener = %self.label,
                "a TLS connection arrived at a listener with a head deadline: the deadline cannot read an encrypted head and is off for it"
            );
        }
    }
}
