//! `RedisStore`: the shared store, its builder and its connection.

use std::{fmt, sync::Arc, time::Duration};

use redis::{aio::ConnectionManager, cluster_async::ClusterConnection};

use super::{
    batch::{self, Batcher, Call, Request},
    breaker::{within, Breaker, BreakerState},
    failure::{scaled_policy, FailurePolicy},
    keys,
    negative::NegativeCache,
    script::{self, run, Mode},
};
use crate::{
    clock::{Clock, TokioClock},
    decision::{Decision, Outcome, Source},
    error::{ConfigError, StoreError},
    observe::StoreMetrics,
    policy::Policy,
    store::{CheckFuture, KeyBytes, MemoryStore, Store, StoreFuture, DEFAULT_MAX_BYTES},
};

/// A connection to Redis or to a Redis Cluster: the only place redis-rs types meet
/// tollgate's API. Cheap to clone (one multiplexed connection is shared).
///
/// See the [module docs](super).
#[derive(Clone)]
pub struct RedisConnection {
    conn: Conn,
    /// Coalesces concurrent script calls on a single-node connection (see
    /// [`RedisStoreBuilder::batching`]).
    batch: Arc<Batcher>,
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.conn {
            Conn::Single(_) => "single",
            Conn::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisConnection")
            .field("kind", &kind)
            .finish()
    }
}

fn backend(e: redis::RedisError) -> StoreError {
    StoreError::backend(e)
}

impl RedisConnection {
    /// Connects to one Redis server (`redis://host:port/db`) through a redis-rs
    /// `ConnectionManager`, which reconnects by itself after a failure.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(backend)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_max_delay(Duration::from_millis(200));
        let cm = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(backend)?;
        Ok(cm.into())
    }

    /// Connects to a Redis Cluster given some of its nodes' URLs.
    pub async fn connect_cluster<I, S>(nodes: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nodes: Vec<String> = nodes.into_iter().map(|s| s.as_ref().to_owned()).collect();
        let client = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(Duration::from_secs(1))
            .build()
            .map_err(backend)?;
        Ok(client.get_async_connection().await.map_err(backend)?.into())
    }

    /// Sends one script call; a server that lost its scripts (`NOSCRIPT`: restarted, or
    /// `SCRIPT FLUSH`) gets the script loaded again and the call repeated once.
    pub(super) async fn invoke(&self, inv: &script::Invocation) -> Result<Vec<i64>, StoreError> {
        match &self.conn {
            Conn::Single(c) => run(inv, &mut c.clone()).await.map_err(backend),
            Conn::Cluster(c) => run(inv, &mut c.clone()).await.map_err(backend),
        }
    }
}

impl RedisConnection {
    /// Runs `script` (`EVALSHA`, loaded again after `NOSCRIPT`) on `keys` with `args`, for
    /// the crate's other Redis-backed parts (the in-flight leases), replying with integers.
    pub(crate) async fn eval_script(
        &self,
        script: &'static redis::Script,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Vec<i64>, StoreError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len());
        for k in keys {
            cmd.arg(*k);
        }
        for a in args {
            cmd.arg(*a);
        }
        self.invoke(&script::Invocation { script, cmd }).await
    }
}

impl RedisConnection {
    /// Sends one request of a store: through the connection's batcher when `batching`
    /// and the connection is to a single node, as its own call otherwise.
    pub(super) async fn request(
        &self,
        request: Request,
        batching: bool,
    ) -> Result<Vec<i64>, StoreError> {
        match &self.conn {
            Conn::Single(c) if batching => self.batch.submit(c, request).await,
            Conn::Single(c) => batch::one(&mut c.clone(), &request).await,
            Conn::Cluster(c) => batch::one(&mut c.clone(), &request).await,
        }
    }

    /// Sends one plain command.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        match &self.conn {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await.map_err(backend),
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await.map_err(backend),
        }
    }
}

impl From<ConnectionManager> for RedisConnection {
    fn from(cm: ConnectionManager) -> Self {
        RedisConnection {
            conn: Conn::Single(cm),
            batch: Arc::default(),
        }
    }
}

impl From<ClusterConnection> for RedisConnection {
    fn from(c: ClusterConnection) -> Self {
        RedisConnection {
            conn: Conn::Cluster(c),
            batch: Arc::default(),
        }
    }
}

/// Builds a [`RedisStore`] or a [`LocalFirstStore`](super::LocalFirstStore); made by
/// [`RedisStore::builder`]. See the [module docs](super).
#[derive(Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    pub(super) policy: Policy,
    pub(super) namespace: String,
    deadline: Duration,
    breaker_failures: u32,
    breaker_cooldown: Duration,
    failure: FailurePolicy,
    negative_cache: usize,
    pub(super) clock: Option<Arc<dyn Clock>>,
    pub(super) readable_keys: bool,
    pub(super) max_bytes: usize,
    batching: bool,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("policy", &self.policy)
            .field("namespace", &self.namespace)
            .field("deadline", &self.deadline)
            .field("failure", &self.failure)
            .field("own_clock", &self.clock.is_some())
            .field("readable_keys", &self.readable_keys)
            .field("batching", &self.batching)
            .finish_non_exhaustive()
    }
}

impl RedisStoreBuilder {
    /// The first part of every key (default `tollgate`). Printable ASCII, no spaces or
    /// braces.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The most a decision may wait for Redis (default 20 ms). A call that misses it
    /// counts as a failure.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The circuit breaker opens after `failures` consecutive failed or timed-out calls
    /// (default 3) and stays open for `cooldown` (default 500 ms); then one probe call
    /// goes through and closes it again on success.
    pub fn breaker(mut self, failures: u32, cooldown: Duration) -> Self {
        self.breaker_failures = failures;
        self.breaker_cooldown = cooldown;
        self
    }

    /// What to decide when Redis fails (default
    /// [`FailurePolicy::LocalFallback`] with `share` 1.0).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// How many refused keys the negative cache remembers (default 10 000); 0 turns it
    /// off.
    pub fn negative_cache(mut self, max_keys: usize) -> Self {
        self.negative_cache = max_keys;
        self
    }

    /// Decides on `clock` instead of the Redis server's `TIME`, and runs the circuit
    /// breaker's cooldown and the negative cache on it too (by default they follow tokio's
    /// clock). For tests and simulations under a [`ManualClock`](crate::clock::ManualClock):
    /// every instance must then share the clock, and state gets 60 s of extra TTL since
    /// Redis expires keys in real time. In production keep the server's clock, so that
    /// instances with drifting clocks agree.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Writes short printable keys into Redis key names as they are (for debugging),
    /// instead of their SHA-1 (the default, which keeps API keys and addresses out of
    /// `SCAN` and `MONITOR` output). Instances sharing state must agree on this.
    pub fn readable_keys(mut self, readable: bool) -> Self {
        self.readable_keys = readable;
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
    /// does not batch. See the [module docs](super).
    pub fn batching(mut self, on: bool) -> Self {
        self.batching = on;
        self
    }

    /// Bounds the memory of the per-instance state, in bytes (default 32 MiB): the local
    /// fallback limiter of a [`RedisStore`], the local state of a
    /// [`LocalFirstStore`](super::LocalFirstStore).
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    pub(super) fn check_common(&self) -> Result<Vec<u64>, ConfigError> {
        keys::check_namespace(&self.namespace)?;
        script::limit_args(&self.policy)
    }

    /// Builds the store on `connection`. Refuses a policy the script cannot decide exactly
    /// (see the [module docs](super)), a bad namespace, a zero deadline, a fallback share
    /// outside `(0, 1]` and a memory budget too small for one key.
    pub fn build(self, connection: impl Into<RedisConnection>) -> Result<RedisStore, ConfigError> {
        self.check_common()?;
        keys::check_deadline(self.deadline)?;
        let overrides = self.clock.is_some();
        let clock: Arc<dyn Clock> = self.clock.unwrap_or_else(|| Arc::new(TokioClock::new()));
        let fallback = match self.failure {
            FailurePolicy::LocalFallback { share } => Some((
                MemoryStore::new(scaled_policy(&self.policy, share)?)
                    .with_clock(clock.clone())
                    .with_max_bytes(self.max_bytes)?
                    .with_label(&format!("{}-fallback", self.namespace)),
                share,
            )),
            _ => None,
        };
        Ok(RedisStore {
            inner: Arc::new(Shared {
                conn: connection.into(),
                prefix: keys::prefix(&self.namespace),
                policy: self.policy,
                metrics: StoreMetrics::new(&self.namespace),
                deadline: self.deadline,
                breaker: Breaker::new(self.breaker_failures, self.breaker_cooldown, clock.clone()),
                failure: self.failure,
                fallback,
                negative: (self.negative_cache > 0)
                    .then(|| NegativeCache::new(self.negative_cache)),
                overrides,
                clock,
                readable: self.readable_keys,
                batching: self.batching,
            }),
        })
    }
}

/// The shared store: every instance decides through one Lua script on Redis, so a limit
/// holds across the fleet. Cheap to clone. See the [module docs](super).
#[derive(Clone)]
pub struct RedisStore {
    pub(super) inner: Arc<Shared>,
}

pub(super) struct Shared {
    pub(super) conn: RedisConnection,
    /// The policy of the store's own methods.
    pub(super) policy: Policy,
    pub(super) prefix: Vec<u8>,
    deadline: Duration,
    breaker: Breaker,
    failure: FailurePolicy,
    /// The local fallback and the share of each quota it applies.
    fallback: Option<(Fallback, f64)>,
    metrics: StoreMetrics,
    negative: Option<NegativeCache>,
    /// Whether decisions take their time from `clock` instead of the server's `TIME`.
    overrides: bool,
    clock: Arc<dyn Clock>,
    readable: bool,
    /// Whether calls go through the connection's batcher.
    batching: bool,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.inner;
        f.debug_struct("RedisStore")
            .field("policy", &s.policy)
            .field("prefix", &String::from_utf8_lossy(&s.prefix))
            .field("deadline", &s.deadline)
            .field("failure", &s.failure)
            .field("breaker", &s.breaker.state())
            .finish_non_exhaustive()
    }
}

/// The local limiter a store falls back to.
type Fallback = MemoryStore<Vec<u8>, Arc<dyn Clock>>;

impl Shared {
    /// One script call under the deadline and the breaker.
    pub(super) async fn guarded_call(
        &self,
        key: &[u8],
        mode: Mode,
        cost: u64,
        limits: &[u64],
        general: bool,
    ) -> Result<Vec<i64>, StoreError> {
        let started = std::time::Instant::now();
        let result = self
            .breaker
            .call(
                self.deadline,
                || {
                    let request = Request {
                        key: key.to_vec(),
                        call: Call::Script {
                            mode,
                            cost,
                            now_ns: self.overrides.then(|| self.clock.now()),
                            limits: limits.to_vec(),
                            general,
                        },
                    };
                    self.conn.request(request, self.batching)
                },
                |state| self.metrics.breaker(state.gauge()),
            )
            .await;
        // A refusal of the open breaker took no time.
        let elapsed = match &result {
            Err(StoreError::CircuitOpen) => 0.0,
            _ => started.elapsed().as_secs_f64(),
        };
        self.metrics.operation(elapsed, result.as_ref().err());
        result
    }

    /// Deletes one key, under the deadline.
    pub(super) async fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        let request = Request {
            key: key.to_vec(),
            call: Call::Delete,
        };
        within(self.deadline, self.conn.request(request, self.batching))
            .await
            .map(|_| ())
    }

    /// One decision: the fast script for a single GCRA limit, the general one otherwise
    /// (or when the fast one finds a state written under other limits: `batch::one` and
    /// the batch script send it then, within the same call's deadline).
    async fn ask(
        &self,
        key: &[u8],
        policy: &Policy,
        mode: Mode,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let limits = script::limit_args(policy).map_err(StoreError::backend)?;
        let reply = self.guarded_call(key, mode, cost, &limits, false).await?;
        script::decode_decision(&reply, policy, cost)
    }

    async fn decide(
        &self,
        key: Vec<u8>,
        policy: Policy,
        mode: Mode,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        // A refusal is remembered from when the call was sent (the conservative end);
        // only checks with the negative cache on can need that time.
        let cache = self.negative.as_ref().filter(|_| mode == Mode::Check);
        let sent = cache.map(|_| self.clock.now());
        match self.ask(&key, &policy, mode, cost).await {
            Ok(d) => {
                if let (Some(n), Some(sent), Outcome::Denied { .. }) = (cache, sent, d.outcome) {
                    n.insert(key, policy.fingerprint(), cost, sent, self.clock.now(), d);
                }
                Ok(d)
            }
            Err(e) => Ok(self.on_failure(&key, &policy, mode, cost, &e)),
        }
    }

    fn on_failure(
        &self,
        key: &Vec<u8>,
        policy: &Policy,
        mode: Mode,
        cost: u64,
        e: &StoreError,
    ) -> Decision {
        if matches!(e, StoreError::CircuitOpen) {
            tracing::trace!(target: "tollgate::redis", "circuit open: failure policy decides");
        } else {
            tracing::debug!(target: "tollgate::redis", error = %e, policy = ?self.failure, "Redis call failed: failure policy decides");
        }
        let n = policy.limits().len();
        let open = || {
            Decision::without_state(
                Outcome::Allowed {
                    wait: Duration::ZERO,
                },
                Source::FailOpen,
                n,
            )
        };
        match self.failure {
            FailurePolicy::FailOpen => open(),
            FailurePolicy::FailClosed { retry_after } => {
                Decision::without_state(Outcome::Denied { retry_after }, Source::FailClosed, n)
            }
            FailurePolicy::LocalFallback { .. } => match &self.fallback {
                Some((fb, share)) => {
                    let Ok(local) = scaled_policy(policy, *share) else {
                        return open();
                    };
                    let d = if mode == Mode::Peek {
                        Store::preview(fb, key, &local, cost)
                    } else {
                        Store::decide(fb, key, &local, cost)
                    };
                    let mut d = d.take_ready_now().unwrap_or_else(open);
                    d.source = Source::Fallback;
                    d
                }
                None => open(),
            },
        }
    }
}

impl RedisStore {
    /// Starts building a store for `policy`.
    pub fn builder(policy: impl Into<Policy>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            policy: policy.into(),
            namespace: "tollgate".into(),
            deadline: Duration::from_millis(20),
            breaker_failures: 3,
            breaker_cooldown: Duration::from_millis(500),
            failure: FailurePolicy::default(),
            negative_cache: 10_000,
            clock: None,
            readable_keys: false,
            max_bytes: DEFAULT_MAX_BYTES,
            batching: true,
        }
    }

    /// A store with the default settings on `connection`.
    pub fn new(
        policy: impl Into<Policy>,
        connection: impl Into<RedisConnection>,
    ) -> Result<Self, ConfigError> {
        Self::builder(policy).build(connection)
    }

    /// The policy of the store's own [`check`](Self::check) and [`peek`](Self::peek).
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// Decides for `key` under the store's policy and charges `cost` when admitted, as a
    /// layer would (deadline, breaker, negative cache and failure policy included).
    pub async fn check<K: KeyBytes + ?Sized>(
        &self,
        key: &K,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let policy = self.inner.policy.clone();
        self.call(self.redis_key(key), &policy, Mode::Check, cost)
            .await
    }

    /// [`RedisStore::check`] without charging anything.
    pub async fn peek<K: KeyBytes + ?Sized>(
        &self,
        key: &K,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let policy = self.inner.policy.clone();
        self.call(self.redis_key(key), &policy, Mode::Peek, cost)
            .await
    }

    /// The circuit breaker's state now.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.breaker.state()
    }

    /// The Redis key holding `key`'s state, under every policy: `{namespace}:v3:{{#sha1}}`
    /// where `sha1` is the SHA-1 of the key's [`KeyBytes`] in hex. With
    /// [`RedisStoreBuilder::readable_keys`], the material is the key's bytes themselves when
    /// they are at most 64 printable ASCII bytes (without `{`, `}`, `#`, space).
    pub fn redis_key<K: KeyBytes + ?Sized>(&self, key: &K) -> Vec<u8> {
        keys::redis_key(&self.inner.prefix, key, self.inner.readable)
    }

    /// Gives back `cost` units charged to `key` and waits for Redis to confirm.
    /// ([`Store::refund`] sends the same call in the background and does not wait.) Errors
    /// are returned as they are: no failure policy applies.
    pub async fn refund_confirmed<K: KeyBytes + ?Sized>(
        &self,
        key: &K,
        cost: u64,
    ) -> Result<(), StoreError> {
        let policy = self.inner.policy.clone();
        self.update(key, &policy, Mode::Refund, cost).await
    }

    /// One call that changes a key's state without deciding (refund, sync, ban), after
    /// forgetting the key's remembered refusals, which it may make stale.
    fn update<K: KeyBytes + ?Sized>(
        &self,
        key: &K,
        policy: &Policy,
        mode: Mode,
        units: u64,
    ) -> StoreFuture<()> {
        let k = self.redis_key(key);
        if let Some(n) = &self.inner.negative {
            n.remove(&k);
        }
        let limits = match script::limit_args(policy) {
            Ok(l) => l,
            Err(e) => return StoreFuture::ready(Err(StoreError::backend(e))),
        };
        let shared = self.inner.clone();
        StoreFuture::boxed(async move {
            shared
                .guarded_call(&k, mode, units, &limits, true)
                .await
                .map(|_| ())
        })
    }

    fn call(&self, key: Vec<u8>, policy: &Policy, mode: Mode, cost: u64) -> CheckFuture {
        if mode == Mode::Check {
            if let Some(n) = &self.inner.negative {
                if let Some(d) = n.lookup(&key, policy.fingerprint(), cost, self.inner.clock.now())
                {
                    return CheckFuture::ready(Ok(d));
                }
            }
        }
        let (shared, policy) = (self.inner.clone(), policy.clone());
        CheckFuture::boxed(async move { shared.decide(key, policy, mode, cost).await })
    }
}

impl<K: KeyBytes + 'static> Store<K> for RedisStore {
    fn supports(&self, policy: &Policy) -> Result<(), ConfigError> {
        script::limit_args(policy).map(|_| ())
    }

    fn default_policy(&self) -> Option<Policy> {
        Some(self.inner.policy.clone())
    }

    fn decide(&self, key: &K, policy: &Policy, cost: u64) -> CheckFuture {
        self.call(self.redis_key(key), policy, Mode::Check, cost)
    }

    fn preview(&self, key: &K, policy: &Policy, cost: u64) -> CheckFuture {
        self.call(self.redis_key(key), policy, Mode::Peek, cost)
    }

    /// One script call: a charge whatever the limits (the script's sync mode) or a
    /// refund. No failure policy applies: an error is returned as it is.
    fn settle(&self, key: &K, policy: &Policy, reserved: u64, actual: u64) -> StoreFuture<()> {
        match actual.cmp(&reserved) {
            std::cmp::Ordering::Equal => StoreFuture::ready(Ok(())),
            std::cmp::Ordering::Greater => self.update(key, policy, Mode::Sync, actual - reserved),
            std::cmp::Ordering::Less => self.update(key, policy, Mode::Refund, reserved - actual),
        }
    }

    /// One script call (Lua numbers are exact below 2^53 ns, about 104 days).
    fn ban(&self, key: &K, policy: &Policy, ban: Duration) -> StoreFuture<()> {
        let ns = u64::try_from(ban.as_nanos())
            .unwrap_or(u64::MAX)
            .min(1 << 52);
        self.update(key, policy, Mode::Ban, ns)
    }

    /// Deletes the key's state (one `DEL`) and forgets its remembered refusals.
    fn reset(&self, key: &K) -> StoreFuture<()> {
        let k = self.redis_key(key);
        if let Some(n) = &self.inner.negative {
            n.remove(&k);
        }
        let shared = self.inner.clone();
        StoreFuture::boxed(async move { shared.delete(&k).await })
    }

    /// Sends the refund in the background (when called inside a tokio runtime; otherwise
    /// it is dropped).
    fn refund(&self, key: &K, policy: &Policy, cost: u64) {
        self.update(key, policy, Mode::Refund, cost)
            .detach("a refund");
    }
}
