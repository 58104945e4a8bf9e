//! [`RedisInFlight`]: in-flight counts shared by every instance, as leases in Redis that
//! expire unless the instance holding them renews them.

use std::{
    collections::HashMap,
    fmt,
    hash::{BuildHasher, Hasher},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, LazyLock, Mutex, MutexGuard, OnceLock, PoisonError, Weak,
    },
    time::Duration,
};

use ::redis::Script;
use tokio::{runtime::Handle, task::JoinHandle, time::Instant};

use super::store::sealed::{Attach, Backend};
use super::store::Acquired;
use super::store::Acquiring;
use super::store::Attempt;
use super::store::InFlightStore;
use super::store::Limits;
use super::store::Permit;
use super::store::Release;
use crate::error::{ConfigError, StoreError};
use crate::key::KeyBytes;
use crate::observe::outage;
use crate::observe::OncePerSecond;
use crate::redis::{
    within, Breaker, BreakerState, Claim, Common, KeyNames, RedisBuilder, RedisConnection,
};
use crate::store::Budget;

/// Takes a lease when fewer than `max` live ones remain. KEYS[1]: the key's sorted set;
/// ARGV: max, TTL in ms, lease id. Replies `{admitted, leases held}`.
const ACQUIRE_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = KEYS[1]
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
local held = redis.call('ZCARD', key)
if held >= tonumber(ARGV[1]) then
  return {0, held}
end
local expiry = now + tonumber(ARGV[2])
redis.call('ZADD', key, string.format('%d', expiry), ARGV[3])
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local latest = math.max(tonumber(last[2]), expiry)
redis.call('PEXPIRE', key, string.format('%d', latest - now + 1000))
return {1, held + 1}
";

/// Gives a lease back. KEYS[1]: the set; ARGV[1]: the lease id.
const RELEASE_LUA: &str = r"
return {redis.call('ZREM', KEYS[1], ARGV[1])}
";

/// Extends the live leases among ARGV[2..] by ARGV[1] ms from now; an expired lease stays
/// expired (its slot may have been taken since). Replies `{leases renewed}`.
const RENEW_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = KEYS[1]
local expiry = now + tonumber(ARGV[1])
local renewed = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', key, ARGV[i])
  if score and tonumber(score) > now then
    redis.call('ZADD', key, 'XX', string.format('%d', expiry), ARGV[i])
    renewed = renewed + 1
  end
end
if renewed > 0 then
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local latest = math.max(tonumber(last[2]), expiry)
  redis.call('PEXPIRE', key, string.format('%d', latest - now + 1000))
end
return {renewed}
";

/// Counts the live leases. KEYS[1]: the set.
const COUNT_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', now), '+inf')}
";

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));
static COUNT: LazyLock<Script> = LazyLock::new(|| Script::new(COUNT_LUA));

/// The first and the longest pause between two tries of a queued request.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_millis(100));

/// A [`RedisInFlight`]'s own settings, in a [`RedisBuilder`] made by
/// [`RedisInFlight::builder`]. See the [module docs](super).
#[derive(Clone, Debug)]
pub struct ForRedisInFlight {
    ttl: Duration,
}

/// A [`RedisInFlight`]'s own setters.
impl RedisBuilder<ForRedisInFlight> {
    /// How long a lease lives unless renewed (default 30 s); held leases are renewed every
    /// third of it. An instance that dies holding leases has them back in Redis within
    /// this time. Whole milliseconds, at least 30 ms.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.own.ttl = ttl;
        self
    }

    /// Builds the store on `connection`. Refuses a bad namespace, a lease TTL under 30 ms
    /// or over a year, and a zero deadline.
    pub fn build(
        self,
        connection: impl Into<RedisConnection>,
    ) -> Result<RedisInFlight, ConfigError> {
        let common = &self.common;
        common.check_names()?;
        if self.own.ttl < Duration::from_millis(30)
            || self.own.ttl > Duration::from_secs(366 * 86_400)
        {
            return Err(ConfigError::Store(format!(
                "the lease TTL must be between 30 ms and a year; it is {:?}",
                self.own.ttl
            )));
        }
        common.check_deadline()?;
        let ttl_ms = self.own.ttl.as_millis() as u64;
        let conn: RedisConnection = connection.into();
        Ok(RedisInFlight {
            leases: Arc::new(Leases {
                breaker: common.breaker(common.clock(), &conn),
                conn,
                names: common.key_names(KIND, false),
                claim: Mutex::new(None),
                common: common.clone(),
                ttl_ms: itoa::Buffer::new().format(ttl_ms).as_bytes().into(),
                period: Duration::from_millis(ttl_ms / 3),
                deadline: common.deadline,
                instance: format!("{:016x}", random_u64()),
                counter: AtomicU64::new(0),
                held: Mutex::new(Held::default()),
                waiting: Mutex::new(HashMap::new()),
                runtime: OnceLock::new(),
                warned: OncePerSecond::default(),
            }),
        })
    }
}

/// In-flight counts shared by every instance through Redis (feature `redis`): each
/// request in flight holds a lease, which its response's end gives back and which expires
/// if its instance dies. Cheap to clone. See the [module docs](super).
#[derive(Clone)]
pub struct RedisInFlight {
    leases: Arc<Leases>,
}

impl fmt::Debug for RedisInFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.leases;
        f.debug_struct("RedisInFlight")
            .field("prefix", &String::from_utf8_lossy(l.names.prefix()))
            .field("lease_ttl", &String::from_utf8_lossy(&l.ttl_ms))
            .field("deadline", &l.deadline)
            .field("breaker", &l.breaker.state())
            .field("instance", &l.instance)
            .field("held", &lock(&l.held).live)
            .finish()
    }
}

impl RedisInFlight {
    /// Starts building the store named `name` (the limit's identity in Redis: stores
    /// share each key's count only under the same name; see
    /// [`RedisStore::builder`](crate::store::RedisStore::builder)): namespace `tollgate`,
    /// lease TTL 30 s, deadline 20 ms, breaker open after 3 failures for 500 ms.
    pub fn builder(name: &str) -> RedisBuilder<ForRedisInFlight> {
        RedisBuilder::new(
            name,
            ForRedisInFlight {
                ttl: Duration::from_secs(30),
            },
        )
    }

    /// The store named `name` with the defaults of [`RedisInFlight::builder`].
    pub fn new(name: &str, connection: impl Into<RedisConnection>) -> Result<Self, ConfigError> {
        Self::builder(name).build(connection)
    }

    /// How many requests of `key` are in flight now, across every instance (live leases).
    pub async fn in_flight<K: KeyBytes + ?Sized>(&self, key: &K) -> Result<u32, StoreError> {
        // The layer's keys are `Option<K>`: `Some(k)` writes `+` and then `k`.
        let rkey = self.leases.names.key(|out| {
            out.push(b'+');
            key.write_key(out);
        });
        let reply = self.leases.call(&COUNT, &rkey, &[]).await?;
        match reply.as_slice() {
            [n] => Ok(u32::try_from(*n).unwrap_or(u32::MAX)),
            _ => Err(StoreError::backend("unexpected reply to the lease count")),
        }
    }

    /// How many leases this instance holds now.
    pub fn held(&self) -> usize {
        lock(&self.leases.held).live
    }

    /// The circuit breaker's state now.
    pub fn breaker_state(&self) -> BreakerState {
        self.leases.breaker.state()
    }
}

impl<K: KeyBytes + Send + Sync + 'static> Backend<K> for RedisInFlight {
    fn acquire(&self, key: Option<K>, limits: &Limits, budget: Option<&Budget>) -> Attempt {
        let rkey: Arc<[u8]> = self.leases.names.key(|out| key.write_key(out)).into();
        let (leases, limits, budget) = (Arc::clone(&self.leases), *limits, budget.cloned());
        Attempt::Later(Acquiring::new(async move {
            leases.acquire(rkey, limits, budget).await
        }))
    }
}

impl<K: KeyBytes + Send + Sync + 'static> InFlightStore<K> for RedisInFlight {}

impl Attach for RedisInFlight {
    /// Claims the store's name for `limits.max` leases per key: refused when another store
    /// of this connection with the same name allows another number.
    fn attach(&self, limits: &Limits) -> Result<(), ConfigError> {
        let l = &self.leases;
        let mut claim = lock(&l.claim);
        let applies = format!("at most {} in flight per key", limits.max);
        match &*claim {
            Some(c) => c.update(u64::from(limits.max), applies),
            None => {
                *claim = Some(
                    l.common
                        .claim(&l.conn, KIND, u64::from(limits.max), applies)?,
                );
                Ok(())
            }
        }
    }
}

/// The kind part of the store's key names, with the layout's version.
const KIND: &str = "inflight:v2";

struct Leases {
    conn: RedisConnection,
    names: KeyNames,
    /// The store's identity on its connection, once a layer is built on it.
    claim: Mutex<Option<Claim>>,
    /// The builder's settings (for the claim).
    common: Common,
    /// The TTL in ms, as the scripts' argument.
    ttl_ms: Box<[u8]>,
    /// Between two renewals.
    period: Duration,
    deadline: Duration,
    /// Gates every call but the giving back of leases.
    breaker: Breaker,
    /// This store's part of every lease id.
    instance: String,
    counter: AtomicU64,
    held: Mutex<Held>,
    /// Queued requests of each key on this instance.
    waiting: Mutex<HashMap<Arc<[u8]>, u32>>,
    /// A runtime to give leases back on when a body is dropped outside one.
    runtime: OnceLock<Handle>,
    /// Failures logged as a warning: the first of each second.
    warned: OncePerSecond,
}

/// The leases this instance holds, by slot, and the task renewing them.
#[derive(Default)]
struct Held {
    slots: Vec<Option<Lease>>,
    free: Vec<u64>,
    live: usize,
    renewal: Option<JoinHandle<()>>,
}

struct Lease {
    key: Arc<[u8]>,
    id: Box<[u8]>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// 64 random bits, from the standard library's randomly keyed hasher.
fn random_u64() -> u64 {
    let mut h = std::hash::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

impl Leases {
    /// One script call under the breaker and the store's deadline.
    async fn call(
        &self,
        script: &'static LazyLock<Script>,
        key: &[u8],
        args: &[&[u8]],
    ) -> Result<Vec<i64>, StoreError> {
        self.call_within(script, key, args, self.deadline).await
    }

    /// One script call under the breaker and `deadline`.
    async fn call_within(
        &self,
        script: &'static LazyLock<Script>,
        key: &[u8],
        args: &[&[u8]],
        deadline: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        let script: &'static Script = script;
        let keys = [key];
        let result = self
            .breaker
            .call(
                deadline,
                || self.conn.eval_script(script, &keys, args),
                |_| {},
            )
            .await;
        if let Err(e) = &result {
            self.log_failure(e);
        }
        result
    }

    /// A warning for the first failure of each second, `DEBUG` for the others.
    fn log_failure(&self, e: &StoreError) {
        outage!(self.warned, "tollgate::redis", error = %e, "in-flight lease call to Redis failed");
    }

    fn next_id(&self) -> Box<[u8]> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("{}:{n:x}", self.instance).into_bytes().into()
    }

    /// A slot for `key`: the first try within what `budget` has left of the request's
    /// time for its stores (nothing left: failed at once, without a call); a queued
    /// request's later tries each within the store's own deadline.
    async fn acquire(
        self: Arc<Self>,
        key: Arc<[u8]>,
        limits: Limits,
        budget: Option<Budget>,
    ) -> Acquired {
        if let Ok(h) = Handle::try_current() {
            self.runtime.get_or_init(|| h);
        }
        if limits.max == 0 {
            return Acquired::Full;
        }
        let deadline = budget
            .as_ref()
            .map_or(self.deadline, |b| b.allow(self.deadline));
        if deadline.is_zero() {
            return Acquired::Failed(StoreError::Timeout(self.deadline));
        }
        let started = Instant::now();
        let first = self.try_once(&key, limits.max, deadline).await;
        if let Some(b) = &budget {
            b.spend(started.elapsed());
        }
        match first {
            Ok(Some(admitted)) => return admitted,
            Ok(None) => {}
            Err(e) => return Acquired::Failed(e),
        }
        if limits.queue == 0 || limits.max_wait.is_zero() {
            return Acquired::Full;
        }
        let Some(_place) = Place::take(&self, &key, limits.queue) else {
            return Acquired::Full;
        };
        let until = Instant::now() + limits.max_wait;
        let mut backoff = BACKOFF.0;
        loop {
            let now = Instant::now();
            if now >= until {
                return Acquired::Full;
            }
            tokio::time::sleep(backoff.min(until - now)).await;
            backoff = (backoff * 2).min(BACKOFF.1);
            match self.try_once(&key, limits.max, self.deadline).await {
                Ok(Some(admitted)) => return admitted,
                Ok(None) => {}
                Err(e) => return Acquired::Failed(e),
            }
        }
    }

    /// One try: admitted, full (`None`), or failed.
    async fn try_once(
        self: &Arc<Self>,
        key: &Arc<[u8]>,
        max: u32,
        deadline: Duration,
    ) -> Result<Option<Acquired>, StoreError> {
        let id = self.next_id();
        // Until Redis answers, the lease may or may not exist: if this future is dropped
        // or the call fails, it is removed in the background.
        let mut unsure = Unsure {
            leases: self,
            key,
            id: &id,
            armed: true,
        };
        let max_arg = itoa::Buffer::new().format(max).as_bytes().to_vec();
        let reply = self
            .call_within(&ACQUIRE, key, &[&max_arg, &self.ttl_ms, &id], deadline)
            .await;
        // A call the open breaker refused never reached Redis: no lease to remove.
        unsure.armed = matches!(&reply, Err(e) if !matches!(e, StoreError::CircuitOpen));
        drop(unsure);
        let reply = reply?;
        match reply.as_slice() {
            [1, held] => {
                let remaining = u32::try_from(i64::from(max) - held).unwrap_or(0);
                Ok(Some(self.hold(key, id, remaining)))
            }
            [0, _] => Ok(None),
            _ => Err(StoreError::backend(
                "unexpected reply to a lease acquisition",
            )),
        }
    }

    /// Records a lease taken, and makes sure a task renews it.
    fn hold(self: &Arc<Self>, key: &Arc<[u8]>, id: Box<[u8]>, remaining: u32) -> Acquired {
        let lease = Lease {
            key: Arc::clone(key),
            id,
        };
        let mut held = lock(&self.held);
        let slot = match held.free.pop() {
            Some(i) => {
                held.slots[i as usize] = Some(lease);
                i
            }
            None => {
                held.slots.push(Some(lease));
                held.slots.len() as u64 - 1
            }
        };
        held.live += 1;
        if held.renewal.as_ref().is_none_or(JoinHandle::is_finished) {
            if let Ok(rt) = Handle::try_current() {
                held.renewal = Some(rt.spawn(renew(Arc::downgrade(self), self.period)));
            }
        }
        drop(held);
        let owner: Arc<dyn Release> = self.clone();
        Acquired::Admitted {
            permit: Permit::new(owner, slot),
            remaining,
        }
    }

    /// Removes a lease in the background (on the current runtime, or the one the store
    /// first ran on); without a runtime it expires after its TTL.
    fn remove_later(&self, key: Arc<[u8]>, id: Box<[u8]>) {
        let Some(rt) = Handle::try_current()
            .ok()
            .or_else(|| self.runtime.get().cloned())
        else {
            return;
        };
        let (conn, deadline) = (self.conn.clone(), self.deadline);
        rt.spawn(async move {
            let (keys, args): ([&[u8]; 1], [&[u8]; 1]) = ([&key], [&id]);
            let call = conn.eval_script(&RELEASE, &keys, &args);
            if let Err(e) = within(deadline * 4, call).await {
                tracing::debug!(target: "tollgate::redis", error = %e, "in-flight lease not given back; it expires with its TTL");
            }
        });
    }
}

impl Release for Leases {
    fn release(&self, slot: u64) {
        let lease = {
            let mut held = lock(&self.held);
            let lease = held.slots.get_mut(slot as usize).and_then(Option::take);
            if lease.is_some() {
                held.free.push(slot);
                held.live -= 1;
            }
            lease
        };
        if let Some(l) = lease {
            self.remove_later(l.key, l.id);
        }
    }
}

/// A lease whose acquisition has no answer yet.
struct Unsure<'a> {
    leases: &'a Leases,
    key: &'a Arc<[u8]>,
    id: &'a [u8],
    armed: bool,
}

impl Drop for Unsure<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.leases
                .remove_later(Arc::clone(self.key), self.id.into());
        }
    }
}

/// A place in a key's queue on this instance.
struct Place {
    leases: Arc<Leases>,
    key: Arc<[u8]>,
}

impl Place {
    fn take(leases: &Arc<Leases>, key: &Arc<[u8]>, queue: u32) -> Option<Place> {
        let mut waiting = lock(&leases.waiting);
        let n = waiting.entry(Arc::clone(key)).or_insert(0);
        if *n >= queue {
            if *n == 0 {
                waiting.remove(key);
            }
            return None;
        }
        *n += 1;
        Some(Place {
            leases: Arc::clone(leases),
            key: Arc::clone(key),
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut waiting = lock(&self.leases.waiting);
        if let Some(n) = waiting.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                waiting.remove(&self.key);
            }
        }
    }
}

/// Renews this instance's leases every `period` while it holds any; ends when it holds
/// none (the next lease starts it again) or the store is gone.
async fn renew(leases: Weak<Leases>, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let Some(leases) = leases.upgrade() else {
            return;
        };
        let by_key = {
            let mut held = lock(&leases.held);
            if held.live == 0 {
                held.renewal = None;
                return;
            }
            let mut by_key: HashMap<Arc<[u8]>, Vec<Box<[u8]>>> = HashMap::new();
            for lease in held.slots.iter().flatten() {
                by_key
                    .entry(Arc::clone(&lease.key))
                    .or_default()
                    .push(lease.id.clone());
            }
            by_key
        };
        for (key, ids) in by_key {
            let mut args: Vec<&[u8]> = Vec::with_capacity(ids.len() + 1);
            args.push(&leases.ttl_ms);
            args.extend(ids.iter().map(|id| &**id));
            if let Ok(reply) = leases.call(&RENEW, &key, &args).await {
                let renewed = reply.first().copied().unwrap_or(0);
                if renewed < ids.len() as i64 {
                    // Given back meanwhile, or expired (Redis unreachable for a TTL).
                    tracing::debug!(
                        target: "tollgate::redis",
                        not_renewed = ids.len() as i64 - renewed,
                        "in-flight leases not renewed: given back meanwhile, or expired"
                    );
                }
            }
        }
    }
}
