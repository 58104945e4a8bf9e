//! What is observed of a listener: its connections counted in metrics (feature
//! `metrics`), and its refusals, closed heads and accept errors logged at most once a
//! second each.

use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::observe::{key_hash, unix_secs, OncePerSecond};

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
    #[cfg(feature = "metrics")]
    metrics: Metrics,
}

#[cfg(feature = "metrics")]
struct Metrics {
    /// `tollgate.connections_total` by result: admitted, exempt, then the refusals in
    /// [`Refusal`]'s order.
    results: [metrics::Counter; 5],
    head_timeouts: metrics::Counter,
    open: metrics::Gauge,
}

impl Watch {
    pub(super) fn new(label: Arc<str>) -> Self {
        #[cfg(feature = "metrics")]
        let metrics = {
            use metrics::{describe_counter, describe_gauge, Unit};
            describe_counter!(
                "tollgate.connections_total",
                Unit::Count,
                "New connections at a limited listener, by result: admitted, exempt, or refused (rate_limited, address_full, total_full)"
            );
            describe_counter!(
                "tollgate.connections.head_timeouts_total",
                Unit::Count,
                "Connections closed because their first request head did not arrive in time"
            );
            describe_gauge!(
                "tollgate.connections.open",
                Unit::Count,
                "Connections open through a limited listener"
            );
            let l = label.to_string();
            Metrics {
                results: [
                    "admitted",
                    "exempt",
                    Refusal::Rate.result(),
                    Refusal::PerAddress.result(),
                    Refusal::Total.result(),
                ]
                .map(|r| {
                    metrics::counter!("tollgate.connections_total", "tollgate.listener" => l.clone(), "tollgate.result" => r)
                }),
                head_timeouts: metrics::counter!("tollgate.connections.head_timeouts_total", "tollgate.listener" => l.clone()),
                open: metrics::gauge!("tollgate.connections.open", "tollgate.listener" => l),
            }
        };
        Watch {
            label,
            refusals: Tally::default(),
            late_heads: Tally::default(),
            errors_logged: OncePerSecond::default(),
            #[cfg(feature = "metrics")]
            metrics,
        }
    }

    pub(super) fn opened(&self, exempt: bool) {
        #[cfg(feature = "metrics")]
        {
            self.metrics.results[usize::from(exempt)].increment(1);
            self.metrics.open.increment(1.0);
        }
        let _ = exempt;
    }

    pub(super) fn closed(&self) {
        #[cfg(feature = "metrics")]
        self.metrics.open.decrement(1.0);
    }

    /// A refused connection: counted; logged (with the refusals since the last event) at
    /// most once a second.
    pub(super) fn refused(&self, why: Refusal, group: IpAddr) {
        #[cfg(feature = "metrics")]
        self.metrics.results[2 + why as usize].increment(1);
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
        #[cfg(feature = "metrics")]
        self.metrics.head_timeouts.increment(1);
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
