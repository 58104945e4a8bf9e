//! The fleet: how many instances share a namespace, counted on Redis, so that each one's
//! local fallback can take its part of a shared limit (`1 / N` of each quota).
//!
//! Each instance holds a lease in one sorted set per namespace, `{namespace}:fleet:{members}`
//! (one key, so one cluster slot): its member name scored by when the lease ends, on the
//! server's clock. A background task renews it every [`BEAT`] for [`LEASE_MS`] and, in the
//! same script, drops the expired leases and counts the rest: the count is the fleet's size
//! as of the last renewal that succeeded. The lease is given back when the instance goes
//! (its last store dropped); an instance that dies without giving it back stops being
//! counted when its lease runs out. An instance is one connection (with its clones) and one
//! namespace: the stores built on clones of one [`RedisConnection`] count once.

use std::{
    collections::HashMap,
    fmt,
    hash::{BuildHasher, RandomState},
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        Arc, LazyLock, Mutex, PoisonError, Weak,
    },
    time::Duration,
};

use ::redis::Script;

use super::connection::RedisConnection;
use super::deadline::within;
use super::keys;
use crate::error::StoreError;

/// How often an instance renews its lease (and counts the fleet).
pub(crate) const BEAT: Duration = Duration::from_secs(1);
/// How long a lease lasts without renewal: three beats, so that one lost renewal does not
/// drop a live instance from the count.
pub(crate) const LEASE_MS: u64 = 3_000;

/// Renews (or, with `ARGV[3] == '1'`, gives back) the lease `ARGV[1]` for `ARGV[2]` ms,
/// drops the expired leases and returns `{ instances }`.
static SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
if n > 0 then redis.call('PEXPIRE', KEYS[1], lease) end
return { n }
",
    )
});

/// The fleets of one connection, by namespace (attached to the connection).
#[derive(Default)]
struct Fleets(Mutex<HashMap<String, Weak<Fleet>>>);

/// This instance's membership of a namespace's fleet. See the [module docs](self).
pub(crate) struct Fleet {
    conn: RedisConnection,
    key: Vec<u8>,
    member: String,
    /// Instances counted at the last renewal that succeeded; 0 before the first.
    size: AtomicU32,
    started: AtomicBool,
}

impl fmt::Debug for Fleet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fleet")
            .field("member", &self.member)
            .field("size", &self.size())
            .finish_non_exhaustive()
    }
}

/// A name no other instance uses: random bits (the standard library's per-process random
/// hash keys), the process id and a sequence number.
fn member_name() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let random = RandomState::new().hash_one(seq);
    format!("{random:016x}-{}-{seq}", std::process::id())
}

impl Fleet {
    /// The fleet of `namespace` as seen through `conn`: one per connection (and its
    /// clones) and namespace. Its renewals start now inside a tokio runtime, otherwise on
    /// [`Fleet::start`].
    pub(crate) fn join(conn: &RedisConnection, namespace: &str) -> Arc<Fleet> {
        let fleets = conn.attached::<Fleets>();
        let mut all = fleets.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|_, f| f.strong_count() > 0);
        if let Some(f) = all.get(namespace).and_then(Weak::upgrade) {
            return f;
        }
        let mut key = keys::prefix(namespace, "fleet");
        key.extend_from_slice(b"members}");
        let fleet = Arc::new(Fleet {
            conn: conn.clone(),
            key,
            member: member_name(),
            size: AtomicU32::new(0),
            started: AtomicBool::new(false),
        });
        all.insert(namespace.to_owned(), Arc::downgrade(&fleet));
        fleet.start();
        fleet
    }

    /// Instances counted at the last renewal that succeeded (this one included); `None`
    /// before the first.
    pub(crate) fn size(&self) -> Option<u32> {
        match self.size.load(Ordering::Acquire) {
            0 => None,
            n => Some(n),
        }
    }

    /// Starts the renewals, once, when called inside a tokio runtime (a no-op otherwise,
    /// or when they run already). They end when the fleet is dropped.
    pub(crate) fn start(self: &Arc<Self>) {
        if self.started.load(Ordering::Relaxed) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        handle.spawn(renew(Arc::downgrade(self)));
    }

    /// One script call: the lease renewed (or given back) and the fleet counted.
    async fn call(
        conn: &RedisConnection,
        key: &[u8],
        member: &str,
        leave: bool,
    ) -> Result<u32, StoreError> {
        let lease = LEASE_MS.to_string();
        let leave: &[u8] = if leave { b"1" } else { b"0" };
        let reply = conn
            .eval_script(
                &SCRIPT,
                &[key],
                &[member.as_bytes(), lease.as_bytes(), leave],
            )
            .await?;
        match reply.first() {
            Some(&n) if n >= 0 => Ok(u32::try_from(n).unwrap_or(u32::MAX)),
            _ => Err(StoreError::backend(
                "unexpected reply from the fleet script",
            )),
        }
    }
}

/// Renews the lease every [`BEAT`] until the fleet is dropped.
async fn renew(weak: Weak<Fleet>) {
    let mut tick = tokio::time::interval(BEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(fleet) = weak.upgrade() else {
            return;
        };
        let call = Fleet::call(&fleet.conn, &fleet.key, &fleet.member, false);
        match within(BEAT, call).await {
            Ok(n) => fleet.size.store(n.max(1), Ordering::Release),
            Err(e) => {
                tracing::debug!(target: "tollgate::redis", error = %e, "fleet lease not renewed: the fleet's size stays as last counted");
            }
        }
    }
}

impl Drop for Fleet {
    /// Gives the lease back, in the background (inside a tokio runtime).
    fn drop(&mut self) {
        if !self.started.load(Ordering::Relaxed) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (conn, key, member) = (
            self.conn.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.member),
        );
        handle.spawn(async move {
            let _ = within(BEAT, Fleet::call(&conn, &key, &member, true)).await;
        });
    }
}
