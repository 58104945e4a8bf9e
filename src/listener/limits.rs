//! [`ConnectionLimits`]: what a [`LimitedListener`] enforces, set with builder setters and
//! checked when the listener is built.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;

use super::accept::LimitedListener;
use super::gate::Gate;
use super::watch::Watch;
use crate::algorithm::Limit;
use crate::error::ConfigError;
use crate::key::{cidr::Cidr, PeerIp};
use crate::policy::Policy;
use crate::setters::setters;
use crate::store::MemoryStore;

/// The limits of a [`LimitedListener`]: a rate of new connections per address group,
/// caps on open connections per address group and in total, and a deadline for a new
/// connection's first request head. Each is off until set. Setters take and return the
/// value; [`ConnectionLimits::build`] checks it.
///
/// See the [module docs](super).
#[derive(Clone, Debug)]
#[must_use]
pub struct ConnectionLimits {
    limits: Vec<Limit>,
    group: PeerIp,
    exempt: Vec<String>,
    max_per_address: Option<u32>,
    max_total: Option<u32>,
    head_timeout: Option<Duration>,
    label: String,
    max_bytes: Option<usize>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self::new()
    }
}

impl ConnectionLimits {
    /// No limits yet; addresses grouped as [`PeerIp::new`] groups them (IPv6 by /56).
    pub fn new() -> Self {
        ConnectionLimits {
            limits: Vec::new(),
            group: PeerIp::new(),
            exempt: Vec::new(),
            max_per_address: None,
            max_total: None,
            head_timeout: None,
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

    setters! {
        /// At most `max` connections open at once per address group.
        max_per_address(max: u32) => max_per_address = Some(max);

        /// At most `max` connections open at once in total (keep it below the process's
        /// descriptor limit, with room for everything else the process opens).
        max_total(max: u32) => max_total = Some(max);

        /// Closes a new connection whose first request head (its bytes up to the blank line)
        /// has not arrived `timeout` after it was accepted. Only the first request's head is
        /// timed; a TLS connection's head cannot be read here (see the module docs).
        head_timeout(timeout: Duration) => head_timeout = Some(timeout);

        /// How addresses are grouped: as `peer` groups them (its IPv6 prefix).
        key(peer: PeerIp) => group;
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

    setters! {
        /// The listener's name in metrics and logs (default `listener`).
        label(label: &str) => label = label.into();

        /// The memory budget of the rate's state, in bytes (default 32 MiB), bounded as a
        /// [`MemoryStore`]'s.
        max_bytes(bytes: usize) => max_bytes = Some(bytes);
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
            max_total: self.max_total,
            rate,
            head_timeout: self.head_timeout,
            counts: Mutex::default(),
            watch: Watch::new(self.label.into()),
        };
        Ok(LimitedListener::new(listener, Arc::new(gate)))
    }
}
