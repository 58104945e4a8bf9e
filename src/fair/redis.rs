//! `RedisFair`: a pool and its keys' states shared by every instance through Redis.

use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use ::redis::Script;

use super::share::{FairDecision, Pool, Share, MAX_SHARE_INTERVAL};
use super::store::{
    sealed::{Attach, Backend},
    FairStore,
};
use crate::clock::Clock;
use crate::error::{ConfigError, StoreError};
use crate::key::KeyBytes;
use crate::redis::{
    push_sha1_hex, store_prefix, Breaker, BreakerState, Claim, Common, OwnClock, RedisBuilder,
    RedisConnection,
};
use crate::store::{Budget, StoreFuture};

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
        common.check_names()?;
        common.check_deadline()?;
        let conn: RedisConnection = connection.into();
        Ok(RedisFair {
            inner: Arc::new(Inner {
                // The breaker's cooldown runs on the store's clock, so tests drive it too.
                breaker: common.breaker(common.clock(), &conn),
                conn,
                prefix: store_prefix(&common.namespace, &common.name, KIND),
                claims: Mutex::new(Vec::new()),
                deadline: common.deadline,
                clock: common.clock.clone(),
                common,
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

/// The kind part of the store's key names, with the layout's version.
const KIND: &str = "fair:v2";

struct Inner {
    conn: RedisConnection,
    /// `{namespace}:{name}:fair:v2:{`: the label and `}` follow (the pool's key), then `:`
    /// and the key's hash (the key's).
    prefix: Vec<u8>,
    /// The store's identity on its connection for each pool (label) a layer shares on it.
    claims: Mutex<Vec<(Arc<str>, Claim)>>,
    /// The builder's settings (for the claims).
    common: Common,
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
    /// Starts building the store named `name` (the pools' identity in Redis: stores share
    /// a pool's state only under the same name and label; see
    /// [`RedisStore::builder`](crate::store::RedisStore::builder)): namespace `tollgate`,
    /// deadline 20 ms, breaker open after 3 failures for 500 ms, the server's clock.
    pub fn builder(name: &str) -> RedisBuilder<ForRedisFair> {
        RedisBuilder::new(name, ForRedisFair)
    }

    /// The circuit breaker's state now.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.breaker.state()
    }

    /// The store named `name` with the default namespace (`tollgate`) and deadline
    /// (20 ms).
    pub fn new(name: &str, connection: impl Into<RedisConnection>) -> Result<Self, ConfigError> {
        Self::builder(name).build(connection)
    }
}

impl<K: KeyBytes + Send + Sync + 'static> Backend<K> for RedisFair {
    /// One script call, within what `budget` has left of the request's time for its
    /// stores (nothing left: failed at once, without a call).
    fn decide(
        &self,
        key: Option<&K>,
        pool: &Pool,
        share: &Share,
        budget: Option<&Budget>,
    ) -> StoreFuture<FairDecision> {
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
        let budget = budget.cloned();
        StoreFuture::boxed(async move {
            let deadline = budget
                .as_ref()
                .map_or(inner.deadline, |b| b.allow(inner.deadline));
            if deadline.is_zero() {
                return Err(StoreError::Timeout(inner.deadline));
            }
            let started = tokio::time::Instant::now();
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
                    deadline,
                    || inner.conn.eval_script(script, &keys, &args),
                    |_| {},
                )
                .await;
            if let Some(b) = &budget {
                b.spend(started.elapsed());
            }
            let reply = reply?;
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

impl Attach for RedisFair {
    /// Claims the store's name for the pool `pool.label` with its parameters: refused
    /// when another store of this connection with the same name shares that pool with
    /// other parameters.
    fn attach(&self, pool: &Pool) -> Result<(), ConfigError> {
        let inner = &*self.inner;
        let mut claims = inner.claims.lock().unwrap_or_else(PoisonError::into_inner);
        let fingerprint = [pool.t, pool.cap, pool.period]
            .iter()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, v| {
                (h ^ v).wrapping_mul(0x0100_0000_01b3)
            });
        let applies = format!(
            "the pool {:?} at one unit per {} ns, {} ns of burst",
            pool.label, pool.t, pool.cap
        );
        if let Some((_, c)) = claims.iter().find(|(l, _)| *l == pool.label) {
            return c.update(fingerprint, applies);
        }
        let kind = format!("{KIND}:{}", pool.label);
        let claim = inner
            .common
            .claim(&inner.conn, &kind, fingerprint, applies)?;
        claims.push((pool.label.clone(), claim));
        Ok(())
    }
}
