//! `RedisFair`: a pool and its keys' states shared by every instance through Redis.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ::redis::Script;

use super::share::{FairDecision, Pool, Share, MAX_SHARE_INTERVAL};
use super::store::{sealed::Backend, FairStore};
use crate::clock::Clock;
use crate::error::{ConfigError, StoreError};
use crate::redis::{
    key_prefix, push_sha1_hex, Breaker, BreakerState, OwnClock, RedisBuilder, RedisConnection,
};
use crate::store::{KeyBytes, StoreFuture};

static DECIDE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("redis.lua")));

/// Extra TTL under a clock override: Redis expires keys in real time, the override
/// runs in its own.
const OVERRIDE_SLACK_MS: u64 = 3_600_000;

/// A [`RedisFair`]'s own settings (none beyond what every Redis store has), in a
/// [`RedisBuilder`] made by [`RedisFair::builder`].
#[derive(Clone, Debug)]
pub struct ForRedisFair;

impl OwnClock for ForRedisFair {}

/// A [`RedisFair`]'s own setter.
impl RedisBuilder<ForRedisFair> {
    /// Builds the store on `connection`. Refuses a bad namespace and a zero deadline.
    pub fn build(self, connection: impl Into<RedisConnection>) -> Result<RedisFair, ConfigError> {
        let common = self.common;
        common.check_namespace()?;
        common.check_deadline()?;
        Ok(RedisFair {
            inner: Arc::new(Inner {
                conn: connection.into(),
                prefix: key_prefix(&common.namespace, "fair:v1"),
                deadline: common.deadline,
                // The breaker's cooldown runs on the store's clock, so tests drive it too.
                breaker: common.breaker(common.clock()),
                clock: common.clock,
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
    prefix: Vec<u8>,
    deadline: Duration,
    breaker: Breaker,
    clock: Option<Arc<dyn Clock>>,
}

impl fmt::Debug for RedisFair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFair")
            .field("prefix", &String::from_utf8_lossy(&self.inner.prefix))
            .field("deadline", &self.inner.deadline)
            .field("breaker", &self.inner.breaker.state())
            .finish_non_exhaustive()
    }
}

impl RedisFair {
    /// A builder: namespace `tollgate`, deadline 20 ms, breaker open after 3 failures
    /// for 500 ms, the server's clock.
    pub fn builder() -> RedisBuilder<ForRedisFair> {
        RedisBuilder::new(ForRedisFair)
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
        let mut pool_key = inner.prefix.clone();
        pool_key.extend_from_slice(pool.label.as_bytes());
        pool_key.push(b'}');
        let mut key_key = pool_key.clone();
        key_key.push(b':');
        match key {
            Some(k) => {
                // The key's bytes hashed: API keys and addresses stay out of SCAN output.
                let mut material = Vec::new();
                k.write_key(&mut material);
                push_sha1_hex(&mut key_key, &material);
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
                    inner.deadline,
                    || inner.conn.eval_script(script, &keys, &args),
                    |_| {},
                )
                .await?;
            match reply[..] {
                [admitted, retry, remaining, reset, next]
                    if retry >= 0 && remaining >= 0 && reset >= 0 && next >= 0 =>
                {
                    Ok(FairDecision {
                        admitted: admitted == 1,
                        retry_after: retry as u64,
                        remaining: remaining as u64,
                        reset_after: reset as u64,
                        next_after: next as u64,
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
