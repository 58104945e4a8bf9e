//! `RedisFair`: a pool and its keys' states shared by every instance through Redis.

use std::{
    fmt,
    sync::{Arc, LazyLock},
    time::Duration,
};

use redis::Script;

use super::{
    share::{FairDecision, Pool, Share, MAX_SHARE_INTERVAL},
    store::{sealed::Backend, FairStore},
};
use crate::{
    clock::{Clock, TokioClock},
    error::{ConfigError, StoreError},
    store::{
        redis::{keys, Breaker, BreakerState},
        KeyBytes, RedisConnection, StoreFuture,
    },
};

static DECIDE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("redis.lua")));

/// Extra TTL under a clock override: Redis expires keys in real time, the override
/// runs in its own.
const OVERRIDE_SLACK_MS: u64 = 3_600_000;

/// Builds a [`RedisFair`]. Made by [`RedisFair::builder`].
#[derive(Clone)]
pub struct RedisFairBuilder {
    namespace: String,
    deadline: Duration,
    breaker: (u32, Duration),
    clock: Option<Arc<dyn Clock>>,
}

impl fmt::Debug for RedisFairBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFairBuilder")
            .field("namespace", &self.namespace)
            .field("deadline", &self.deadline)
            .field("breaker", &self.breaker)
            .field("clock_override", &self.clock.is_some())
            .finish()
    }
}

impl RedisFairBuilder {
    /// The first part of every key (default `tollgate`). Printable ASCII, no spaces or
    /// braces. Layers and instances share a pool when they share a namespace and a label.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The most one Redis call may take (default 20 ms). A call that misses it counts as
    /// a failure, which the layer's `OnStoreError` answers.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The circuit breaker opens after `failures` consecutive failed or timed-out calls
    /// (default 3) and stays open for `cooldown` (default 500 ms, on the store's clock):
    /// meanwhile requests get the layer's `OnStoreError` answer at once instead of each
    /// waiting out the deadline. Then one probe call goes through and closes it again on
    /// success.
    pub fn breaker(mut self, failures: u32, cooldown: Duration) -> Self {
        self.breaker = (failures, cooldown);
        self
    }

    /// Decides on `clock` instead of the Redis server's `TIME`: for tests and simulations
    /// under a [`ManualClock`](crate::clock::ManualClock), where every instance must share
    /// the clock (state gets an hour of extra TTL, since Redis expires keys in real time).
    /// In production keep the server's clock, so that instances with drifting clocks agree.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Builds the store on `connection`. Refuses a bad namespace and a zero deadline.
    pub fn build(self, connection: impl Into<RedisConnection>) -> Result<RedisFair, ConfigError> {
        keys::check_namespace(&self.namespace)?;
        keys::check_deadline(self.deadline)?;
        // The breaker's cooldown runs on the store's clock, so tests drive it too.
        let breaker_clock: Arc<dyn Clock> = match &self.clock {
            Some(c) => Arc::clone(c),
            None => Arc::new(TokioClock::new()),
        };
        Ok(RedisFair {
            inner: Arc::new(Inner {
                conn: connection.into(),
                prefix: format!("{}:fair:v1:{{", self.namespace),
                deadline: self.deadline,
                breaker: Breaker::new(self.breaker.0, self.breaker.1, breaker_clock),
                clock: self.clock,
            }),
        })
    }
}

/// A fair-sharing pool shared by every instance through Redis (feature `redis`): each
/// decision is one script call that reads and writes the pool and the key together,
/// atomically, on the server's clock. Cheap to clone. See the [module docs](super).
#[derive(Clone)]
pub struct RedisFair {
    inner: Arc<Inner>,
}

struct Inner {
    conn: RedisConnection,
    /// `{namespace}:fair:v1:{`: the label and `}` follow (the pool's key), then `:` and
    /// the key's hash (the key's).
    prefix: String,
    deadline: Duration,
    breaker: Breaker,
    clock: Option<Arc<dyn Clock>>,
}

impl fmt::Debug for RedisFair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFair")
            .field("prefix", &self.inner.prefix)
            .field("deadline", &self.inner.deadline)
            .field("breaker", &self.inner.breaker.state())
            .finish_non_exhaustive()
    }
}

impl RedisFair {
    /// A builder: namespace `tollgate`, deadline 20 ms, breaker open after 3 failures
    /// for 500 ms, the server's clock.
    pub fn builder() -> RedisFairBuilder {
        RedisFairBuilder {
            namespace: "tollgate".into(),
            deadline: Duration::from_millis(20),
            breaker: (3, Duration::from_millis(500)),
            clock: None,
        }
    }

    /// The circuit breaker's state now.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.breaker.state()
    }

    /// A store with the default namespace (`tollgate`) and deadline (20 ms).
    pub fn new(connection: impl Into<RedisConnection>) -> Result<Self, ConfigError> {
        Self::builder().build(connection)
    }
}

impl<K: KeyBytes + Send + Sync + 'static> Backend<K> for RedisFair {
    fn decide(&self, key: Option<&K>, pool: &Pool, share: &Share) -> StoreFuture<FairDecision> {
        let inner = &*self.inner;
        let mut pool_key = inner.prefix.clone().into_bytes();
        pool_key.extend_from_slice(pool.label.as_bytes());
        pool_key.push(b'}');
        let mut key_key = pool_key.clone();
        key_key.push(b':');
        match key {
            Some(k) => {
                // The key's bytes hashed: API keys and addresses stay out of SCAN output.
                let mut material = Vec::new();
                k.write_key(&mut material);
                keys::push_sha1_hex(&mut key_key, &material);
            }
            None => key_key.extend_from_slice(b"-"),
        }
        let mut args: Vec<u64> = vec![
            pool.t,
            pool.cap,
            pool.period / 1_000,
            share.weight,
            share.ceil_t,
            share.ceil_cap,
            ((1u64 << 53) - 1) / pool.t,
            MAX_SHARE_INTERVAL,
        ];
        if let Some(clock) = &inner.clock {
            args.push(clock.now() / 1_000);
            args.push(OVERRIDE_SLACK_MS);
        }
        let inner = Arc::clone(&self.inner);
        StoreFuture::boxed(async move {
            let args: Vec<Vec<u8>> = args
                .iter()
                .map(|a| itoa::Buffer::new().format(*a).as_bytes().to_vec())
                .collect();
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let script: &'static Script = &DECIDE;
            let keys: [&[u8]; 2] = [&pool_key, &key_key];
            let reply = inner
                .breaker
                .call(
                    inner.deadline,
                    || inner.conn.eval_script(script, &keys, &args),
                    |_| {},
                )
                .await?;
            match reply[..] {
                [admitted, retry, remaining, reset]
                    if retry >= 0 && remaining >= 0 && reset >= 0 =>
                {
                    Ok(FairDecision {
                        admitted: admitted == 1,
                        retry_after: retry as u64,
                        remaining: remaining as u64,
                        reset_after: reset as u64,
                    })
                }
                _ => Err(StoreError::backend(format!(
                    "unexpected fair-share script reply {reply:?}"
                ))),
            }
        })
    }
}

impl<K: KeyBytes + Send + Sync + 'static> FairStore<K> for RedisFair {}
