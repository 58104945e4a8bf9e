//! [`ForRedisStore`]: the settings of a [`RedisStore`] or a [`LocalFirstStore`], and
//! their construction.

use std::sync::Arc;

use super::failure::{check_share, FailurePolicy, Share};
use super::fallback::Fallback;
use super::local_state;
use super::negative::NegativeCache;
use super::script;
use super::store::{RedisStore, Shared};
use crate::error::ConfigError;
use crate::observe::StoreMetrics;
use crate::policy::Policy;
use crate::redis::{policies_claim, Claim, Fleet, OwnClock, RedisBuilder, RedisConnection};
use crate::store::DEFAULT_MAX_BYTES;

/// The kind part of the rate store's key names (with the layout's version): one key per
/// client holding every limit's state.
pub(super) const KEYS: &str = "rate:v4";

/// A [`RedisStore`]'s own settings (and a [`LocalFirstStore`](super::LocalFirstStore)'s),
/// in a [`RedisBuilder`] made by [`RedisStore::builder`]. See the [module docs](super).
#[derive(Clone, Debug)]
pub struct ForRedisStore {
    pub(super) policy: Policy,
    failure: FailurePolicy,
    negative_cache: usize,
    pub(super) readable_keys: bool,
    pub(super) max_bytes: usize,
    batching: bool,
    fleet_floor: u32,
}

impl OwnClock for ForRedisStore {}

impl RedisStore {
    /// Starts building the store named `name` for `policy`. The name is the limit's
    /// identity in Redis: stores share each key's state only when they have the same name
    /// (and namespace), as every instance of one limit does, whatever quotas a rolling
    /// deploy gives it meanwhile; two stores of one connection with the same name and
    /// different limits are refused by `build`. 1 to 64 ASCII letters, digits, `.`, `_`
    /// and `-` (`"api"`, `"login"`). See the
    /// [module docs](super#identity-which-stores-share-state).
    pub fn builder(name: &str, policy: impl Into<Policy>) -> RedisBuilder<ForRedisStore> {
        RedisBuilder::new(
            name,
            ForRedisStore {
                policy: policy.into(),
                failure: FailurePolicy::default(),
                negative_cache: 10_000,
                readable_keys: false,
                max_bytes: DEFAULT_MAX_BYTES,
                batching: true,
                fleet_floor: 1,
            },
        )
    }

    /// The store named `name` for `policy`, with the default settings, on `connection`.
    pub fn new(
        name: &str,
        policy: impl Into<Policy>,
        connection: impl Into<RedisConnection>,
    ) -> Result<Self, ConfigError> {
        Self::builder(name, policy).build(connection)
    }
}

/// A [`RedisStore`]'s own setters.
impl RedisBuilder<ForRedisStore> {
    /// What to decide when Redis fails (default [`FailurePolicy::FleetShare`]: a local
    /// fallback at `1 / N` of each quota, `N` the instances counted on Redis).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.own.failure = policy;
        self
    }

    /// How many refused keys the negative cache remembers (default 10 000); 0 turns it
    /// off.
    pub fn negative_cache(mut self, max_keys: usize) -> Self {
        self.own.negative_cache = max_keys;
        self
    }

    /// Writes short printable keys into Redis key names as they are (for debugging),
    /// instead of their SHA-1 (the default, which keeps API keys and addresses out of
    /// `SCAN` and `MONITOR` output). Instances sharing state must agree on this.
    pub fn readable_keys(mut self, readable: bool) -> Self {
        self.own.readable_keys = readable;
        self
    }

    /// Coalesces concurrent decisions into one script call (default on). A request that
    /// finds no call of its connection in flight goes out at once, alone, as without
    /// batching, so an idle caller never waits; requests made while a call is in flight
    /// queue and go out together, up to 128 in one call of a batch script that decides
    /// them in arrival order, each exactly as its own call would be; once 32 wait behind
    /// a batch call, they go out as a second one without waiting for it (at most two in
    /// flight, so client and server work at once under load). Each request keeps
    /// its own deadline, counts in the circuit breaker on its own and gets the failure
    /// policy on its own; a failed batch call fails each request in it. On a Redis
    /// Cluster connection calls are never batched (the keys of one call would have to
    /// share a slot). The batcher belongs to the [`RedisConnection`] and its clones:
    /// stores built on clones of one connection batch together. A
    /// [`LocalFirstStore`](super::LocalFirstStore), whose calls are off the request path,
    /// does not batch; the local fallback's background pushes after an outage go through
    /// the batcher either way. See the [module docs](super).
    pub fn batching(mut self, on: bool) -> Self {
        self.own.batching = on;
        self
    }

    /// Bounds the memory of the per-instance state, in bytes (default 32 MiB): the local
    /// fallback state of a [`RedisStore`], the local state of a
    /// [`LocalFirstStore`](super::LocalFirstStore).
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.own.max_bytes = bytes;
        self
    }

    /// The fewest instances [`FailurePolicy::FleetShare`] assumes (default 1): the
    /// fallback's share is `1 / max(N, floor)`, `N` the instances counted on Redis. Set
    /// it to the size your fleet never drops below, so that an instance that has not
    /// counted the fleet (started while Redis was unreachable, or under a Redis user
    /// that may not write the fleet's key) does not fall back at the whole quota.
    pub fn fleet_floor(mut self, instances: u32) -> Self {
        self.own.fleet_floor = instances;
        self
    }

    /// Refuses a bad namespace or name and a policy the scripts cannot decide exactly.
    pub(super) fn check_common(&self) -> Result<(), ConfigError> {
        self.common.check_names()?;
        script::limit_args(&self.own.policy).map(|_| ())
    }

    /// Claims the store's identity on `conn` for its own policy.
    pub(super) fn claim(&self, conn: &RedisConnection) -> Result<Claim, ConfigError> {
        let (fingerprint, applies) = policies_claim([&self.own.policy]);
        self.common.claim(conn, KEYS, fingerprint, applies)
    }

    /// Builds the store on `connection`. Refuses a policy the script cannot decide exactly
    /// (see the [module docs](super)), a bad namespace, a zero deadline, a fallback share
    /// outside `(0, 1]` and a memory budget too small for one key. With a local fallback,
    /// the instance joins the namespace's fleet (see the [module docs](super)); inside a
    /// tokio runtime its lease is taken at once, otherwise at the first decision.
    pub fn build(self, connection: impl Into<RedisConnection>) -> Result<RedisStore, ConfigError> {
        self.check_common()?;
        self.common.check_deadline()?;
        let common = &self.common;
        let clock = common.clock();
        let conn: RedisConnection = connection.into();
        let claim = self.claim(&conn)?;
        let names = common.key_names(KEYS, self.own.readable_keys);
        let (share, fleet) = match self.own.failure {
            FailurePolicy::LocalFallback { share } => {
                check_share(share)?;
                let fleet = Fleet::join(&conn, &common.namespace);
                (Some(Share::Fixed(share)), Some(fleet))
            }
            FailurePolicy::FleetShare => {
                let fleet = Fleet::join(&conn, &common.namespace);
                (
                    Some(Share::Fleet(fleet.clone(), self.own.fleet_floor)),
                    Some(fleet),
                )
            }
            _ => (None, None),
        };
        let fallback = match share {
            Some(share) => {
                // Its rounds are off the request path: batched whatever the decisions.
                let local = local_state::Shared::new(
                    conn.clone(),
                    names.clone(),
                    self.own.policy.clone(),
                    common.deadline,
                    self.own.max_bytes,
                    common,
                    "fallback",
                    share,
                )?
                .batched(conn.attached());
                Some(Arc::new(Fallback::new(local)))
            }
            None => None,
        };
        let limits = script::limit_args(&self.own.policy)?.into();
        let breaker = common.breaker(clock.clone(), &conn);
        Ok(RedisStore {
            inner: Arc::new(Shared {
                limits,
                claim,
                batcher: conn.attached(),
                conn,
                names,
                policy: self.own.policy,
                metrics: StoreMetrics::network(&common.namespace),
                deadline: common.deadline,
                breaker,
                failure: self.own.failure,
                fallback,
                fleet,
                negative: (self.own.negative_cache > 0)
                    .then(|| NegativeCache::new(self.own.negative_cache)),
                overrides: common.clock.is_some(),
                clock,
                batching: self.own.batching,
            }),
        })
    }
}
