//! The settings every Redis-backed store's builder shares (namespace, deadline, circuit
//! breaker, clock), and their setters, written once for every builder.

use std::{fmt, sync::Arc, time::Duration};

use super::claims::{self, Claim};
use super::{breaker::Breaker, connection::RedisConnection, deadline, keys, KeyNames};
use crate::clock::{Clock, TokioClock};
use crate::error::ConfigError;

/// The settings every Redis-backed store shares: a builder's field `common`, set by the
/// setters of [`RedisBuilder`].
#[derive(Clone)]
pub(crate) struct Common {
    pub(crate) namespace: String,
    /// The store's name: its limit's identity in key names.
    pub(crate) name: String,
    pub(crate) deadline: Duration,
    /// Consecutive failures that open the breaker, and how long it stays open.
    pub(crate) breaker: (u32, Duration),
    /// The clock that replaces the server's `TIME`, if any.
    pub(crate) clock: Option<Arc<dyn Clock>>,
}

impl Default for Common {
    /// Namespace `tollgate`, deadline 20 ms, breaker open after 3 failures for 500 ms, the
    /// server's clock.
    fn default() -> Self {
        Common {
            namespace: "tollgate".into(),
            name: String::new(),
            deadline: Duration::from_millis(20),
            breaker: (3, Duration::from_millis(500)),
            clock: None,
        }
    }
}

impl fmt::Debug for Common {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Common")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("deadline", &self.deadline)
            .field("breaker", &self.breaker)
            .field("own_clock", &self.clock.is_some())
            .finish()
    }
}

impl Common {
    /// Refuses a bad namespace or name.
    pub(crate) fn check_names(&self) -> Result<(), ConfigError> {
        keys::check_namespace(&self.namespace)?;
        claims::check_name(&self.name)
    }

    /// The key names of this store, of `kind`.
    pub(crate) fn key_names(&self, kind: &str, readable: bool) -> KeyNames {
        KeyNames::new(&self.namespace, &self.name, kind, readable)
    }

    /// Claims this store's identity (of `kind`) on `conn` for limits of `fingerprint`
    /// (`applies` in words).
    pub(crate) fn claim(
        &self,
        conn: &RedisConnection,
        kind: &str,
        fingerprint: u64,
        applies: String,
    ) -> Result<Claim, ConfigError> {
        Claim::new(
            conn,
            &self.namespace,
            kind,
            &self.name,
            fingerprint,
            applies,
        )
    }

    /// Refuses a zero deadline.
    pub(crate) fn check_deadline(&self) -> Result<(), ConfigError> {
        deadline::check(self.deadline)
    }

    /// The store's clock: the one set, or tokio's.
    pub(crate) fn clock(&self) -> Arc<dyn Clock> {
        match &self.clock {
            Some(c) => Arc::clone(c),
            None => Arc::new(TokioClock::new()),
        }
    }

    /// The circuit breaker of a store calling through `conn`, its cooldown on `clock`.
    pub(crate) fn breaker(&self, clock: Arc<dyn Clock>, conn: &RedisConnection) -> Breaker {
        Breaker::new(self.breaker.0, self.breaker.1, clock, Some(conn))
    }
}

/// Builds a store shared through Redis: [`RedisStore::builder`](crate::store::RedisStore::builder)
/// (which also builds a [`LocalFirstStore`](crate::store::LocalFirstStore)),
/// [`RedisInFlight::builder`](crate::inflight::RedisInFlight::builder) and
/// [`RedisFair::builder`](crate::fair::RedisFair::builder). The setters every Redis store
/// has come first; each store's own follow in a block of their own (`S` is that store's
/// settings). Setters take and return the builder; `build` reports what is wrong.
#[derive(Clone, Debug)]
#[must_use]
pub struct RedisBuilder<S> {
    pub(crate) common: Common,
    pub(crate) own: S,
}

/// The stores that can decide on a clock of their own instead of the server's.
pub trait OwnClock {}

impl<S> RedisBuilder<S> {
    pub(crate) fn new(name: &str, own: S) -> Self {
        RedisBuilder {
            common: Common {
                name: name.to_owned(),
                ..Common::default()
            },
            own,
        }
    }

    /// The first part of every key (default `tollgate`): an application's, when several
    /// share one Redis. Printable ASCII, no spaces or braces. Stores share a key's state
    /// only when they share the namespace and the store's name (see the
    /// [module docs](crate::store::redis#identity-which-stores-share-state)).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.common.namespace = namespace.into();
        self
    }

    /// The most one Redis call, and so a decision, may wait for Redis (default 20 ms). A
    /// call that misses it counts as a failure, which the store's failure policy (a
    /// [`RedisStore`](crate::store::RedisStore)) or the layer's `OnStoreError` (in-flight
    /// and fair-share stores) answers.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.common.deadline = deadline;
        self
    }

    /// The circuit breaker opens after `failures` consecutive failed or timed-out calls
    /// (default 3) and stays open for `cooldown` (default 500 ms, on the store's clock):
    /// meanwhile no call goes out and requests get the failure answer at once instead of
    /// each waiting out the deadline. Then one probe call goes through and closes it again
    /// on success. (An in-flight store gives leases back whatever its state.)
    pub fn breaker(mut self, failures: u32, cooldown: Duration) -> Self {
        self.common.breaker = (failures, cooldown);
        self
    }
}

impl<S: OwnClock> RedisBuilder<S> {
    /// Decides on `clock` instead of the Redis server's `TIME`, and runs the circuit
    /// breaker's cooldown (and a [`RedisStore`](crate::store::RedisStore)'s negative cache)
    /// on it too; by default they follow tokio's clock. For tests and simulations under a
    /// [`ManualClock`](crate::clock::ManualClock): every instance must then share the
    /// clock, and state gets extra TTL (60 s; a fair-share pool's an hour) since Redis
    /// expires keys in real time. In production keep the server's clock, so that instances
    /// with drifting clocks agree.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.common.clock = Some(Arc::new(clock));
        self
    }
}
