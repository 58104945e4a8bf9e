//! [`ConnectionLimits`]: what a [`LimitedListener`] enforces, set with builder setters
//! (safe defaults on from [`ConnectionLimits::new`]) and checked when the listener is
//! built.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::accept::LimitedListener;
use super::gate::{Gate, WhenFull};
use super::progress::{nanos, Rate, Timing};
use super::watch::Watch;
use crate::algorithm::Limit;
use crate::error::ConfigError;
use crate::key::{cidr::Cidr, PeerIp};
use crate::policy::Policy;
use crate::store::MemoryStore;

const MAX_PER_ADDRESS: u32 = 64;
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const IDLE_TIMEOUT: Duration = Duration::from_secs(75);
const MIN_RATE: u32 = 240;
const GRACE: Duration = Duration::from_secs(5);
/// The listen backlog of [`ConnectionLimits::bind`].
const BACKLOG: u32 = 4096;

/// The limits of a [`LimitedListener`]. [`ConnectionLimits::new`] starts from defaults
/// that hold floods of slow clients on their own:
///
/// | knob | default |
/// |---|---|
/// | [`max_per_address`](Self::max_per_address) | 64 open connections per address group |
/// | [`max_total`](Self::max_total) | 3/4 of the process's descriptor limit (768 of 1 024) |
/// | [`when_full`](Self::when_full) | [`WhenFull::CloseStalest`] |
/// | [`head_timeout`](Self::head_timeout) | 10 s for a whole request head |
/// | [`min_head_rate`](Self::min_head_rate) | 240 bytes a second, 5 s of grace |
/// | [`min_body_rate`](Self::min_body_rate) | 240 bytes a second, 5 s of grace |
/// | [`idle_timeout`](Self::idle_timeout) | 75 s between requests |
/// | [`limit`](Self::limit) | none: any rate of new connections |
///
/// Setters take and return the value; [`ConnectionLimits::build`] checks it.
///
/// See the [module docs](super).
#[derive(Clone, Debug)]
#[must_use]
pub struct ConnectionLimits {
    limits: Vec<Limit>,
    group: PeerIp,
    exempt: Vec<String>,
    max_per_address: u32,
    max_total: Option<u32>,
    when_full: WhenFull,
    head_timeout: Duration,
    idle_timeout: Duration,
    head_rate: (u32, Duration),
    body_rate: (u32, Duration),
    label: String,
    max_bytes: Option<usize>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self::new()
    }
}

impl ConnectionLimits {
    /// The defaults in the table above; addresses grouped as [`PeerIp::new`] groups them
    /// (IPv6 by /56).
    pub fn new() -> Self {
        ConnectionLimits {
            limits: Vec::new(),
            group: PeerIp::new(),
            exempt: Vec::new(),
            max_per_address: MAX_PER_ADDRESS,
            max_total: None,
            when_full: WhenFull::CloseStalest,
            head_timeout: HEAD_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            head_rate: (MIN_RATE, GRACE),
            body_rate: (MIN_RATE, GRACE),
            label: "listener".into(),
            max_bytes: None,
        }
    }

    /// Adds a limit on the rate of new connections per address group: a token bucket, a
    /// window, any [`Limit`] (a queue's connection cannot wait for its slot: it is
    /// refused). Several limits must all admit a connection.
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    /// At most `max` connections open at once per address group (`u32::MAX`: no cap).
    pub fn max_per_address(mut self, max: u32) -> Self {
        self.max_per_address = max;
        self
    }

    /// At most `max` connections open at once in total. By default, three quarters of
    /// the process's descriptor limit (its soft `RLIMIT_NOFILE` when the listener is
    /// built; no cap where there is none to read), leaving the rest to what else the
    /// process opens. While evicted connections close, up to 32 more may be open for a
    /// moment: keep `max` that far below the descriptor limit.
    pub fn max_total(mut self, max: u32) -> Self {
        self.max_total = Some(max);
        self
    }

    /// What gives way when `max_total` connections are open and a new one arrives
    /// (default [`WhenFull::CloseStalest`]).
    pub fn when_full(mut self, when: WhenFull) -> Self {
        self.when_full = when;
        self
    }

    /// Closes a connection whose request head is not whole `timeout` after its first
    /// byte (the first request's: after the accept, so a connection that says nothing
    /// is closed then too). Empty lines before a request line count as the head's
    /// bytes, not as a head. `Duration::MAX`: no deadline.
    pub fn head_timeout(mut self, timeout: Duration) -> Self {
        self.head_timeout = timeout;
        self
    }

    /// Closes a connection that waits for its next request longer than `timeout` after
    /// its last response (a kept-alive connection; an idle HTTP/2 connection, counted
    /// from its preface or its last response). `Duration::MAX`: no deadline.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Closes a connection whose request head arrives slower than `bytes_per_second`:
    /// each byte pays for `1 / bytes_per_second` of a second of the wait, never for
    /// time before it arrived, and a head may lag at most `grace` behind (0: no
    /// minimum rate). Under the head timeout, this closes a head trickled a byte at a
    /// time after `grace`, and ranks it for [`WhenFull::CloseStalest`].
    pub fn min_head_rate(mut self, bytes_per_second: u32, grace: Duration) -> Self {
        self.head_rate = (bytes_per_second, grace);
        self
    }

    /// As [`min_head_rate`](Self::min_head_rate), for a request body, timed while the
    /// server reads it (a handler that is slow to read its body does not count against
    /// the client).
    pub fn min_body_rate(mut self, bytes_per_second: u32, grace: Duration) -> Self {
        self.body_rate = (bytes_per_second, grace);
        self
    }

    /// How addresses are grouped: as `peer` groups them (its IPv6 prefix).
    pub fn key(mut self, peer: PeerIp) -> Self {
        self.group = peer;
        self
    }

    /// Exempts these addresses or blocks (`"10.0.0.0/8"`, your proxies') from the rate and
    /// the per-address cap; their connections still count in the total. A bad entry is
    /// reported by `build`.
    pub fn exempt<I, S>(mut self, cidrs: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.exempt
            .extend(cidrs.into_iter().map(|s| s.as_ref().to_owned()));
        self
    }

    /// The listener's name in metrics and logs (default `listener`).
    pub fn label(mut self, label: &str) -> Self {
        self.label = label.into();
        self
    }

    /// The memory budget of the rate's state, in bytes (default 32 MiB), bounded as a
    /// [`MemoryStore`]'s.
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    /// Wraps `listener`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidCidr`] for an exempt entry that is not an address or a
    /// block, [`ConfigError::Store`] for a memory budget that holds no key.
    pub fn build(self, listener: TcpListener) -> Result<LimitedListener, ConfigError> {
        let exempt = self
            .exempt
            .iter()
            .map(|s| Cidr::parse(s))
            .collect::<Result<_, _>>()?;
        let rate = if self.limits.is_empty() {
            None
        } else {
            let policy = Policy::from_limits(self.limits)?;
            Some(MemoryStore::for_layer(policy, &self.label, self.max_bytes)?)
        };
        let gate = Gate {
            group: self.group,
            exempt,
            max_per_address: self.max_per_address,
            max_total: self.max_total.or_else(from_descriptors),
            when_full: self.when_full,
            rate,
            timing: Timing {
                head_timeout: nanos(self.head_timeout),
                idle_timeout: nanos(self.idle_timeout),
                head_rate: Rate::new(self.head_rate.0, self.head_rate.1),
                body_rate: Rate::new(self.body_rate.0, self.body_rate.1),
            },
            epoch: Instant::now(),
            counts: Mutex::default(),
            evicted_closed: Notify::new(),
            watch: Watch::new(self.label.into()),
        };
        Ok(LimitedListener::new(listener, Arc::new(gate)))
    }

    /// Binds a listener to `addr` (the first of its addresses that binds) with a listen
    /// backlog of 4 096, which holds a wave of new connections where `TcpListener::bind`'s
    /// 1 024 drops them (the kernel caps it at `net.core.somaxconn`), and wraps it.
    ///
    /// # Errors
    ///
    /// The error of the last address that did not bind; a [`ConfigError`] from
    /// [`build`](Self::build) as an [`io::ErrorKind::InvalidInput`] error whose inner error
    /// it is.
    pub async fn bind(self, addr: impl tokio::net::ToSocketAddrs) -> io::Result<LimitedListener> {
        let mut last = None;
        for addr in tokio::net::lookup_host(addr).await? {
            match listen(addr) {
                Ok(tcp) => {
                    return self
                        .build(tcp)
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no address to bind to")
        }))
    }
}

/// A listening socket on `addr` with a [`BACKLOG`], as `TcpListener::bind` makes one
/// (with `SO_REUSEADDR` on Unix).
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// The default total cap: the process's soft descriptor limit less a quarter of it (at
/// least 64) for everything else the process opens.
fn from_descriptors() -> Option<u32> {
    #[cfg(unix)]
    {
        use rustix::process::{getrlimit, Resource};
        let limit = getrlimit(Resource::Nofile).current?;
        let total = limit.saturating_sub((limit / 4).max(64)).max(1);
        Some(u32::try_from(total).unwrap_or(u32::MAX))
    }
    #[cfg(not(unix))]
    {
        None
    }
}
