//! The fleet: how many instances share a namespace, counted on Redis, so that each one's
//! local fallback can take its part of a shared limit (`1 / N` of each quota).
//!
//! Each instance holds a lease in one sorted set per namespace, `{namespace}:fleet:{members}`
//! (one key, so one cluster slot): its member name scored by when the lease ends, on the
//! server's clock (`TIME`). A background task renews it every [`BEAT`] for [`LEASE_MS`],
//! then drops the expired leases and those that cannot be leases (ending later than a
//! lease taken now would: written by something else), and counts the rest (plain commands,
//! one pipeline, so that no script call is added to what the stores send): the count is
//! the fleet's size as of the last renewal that succeeded. A renewal Redis refuses (a user
//! without `ZADD`, a key of another type) leaves that count as it was, and is logged at
//! `WARN` once per fleet. The lease is given back when the instance goes
//! (its last store dropped); an instance that dies without giving it back stops being
//! counted when its lease runs out. An instance is one connection (with its clones) and one
//! namespace: the stores built on clones of one [`RedisConnection`] count once.

use std::{
    collections::HashMap,
    fmt,
    hash::{BuildHasher, RandomState},
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        Arc, Mutex, PoisonError, Weak,
    },
    time::Duration,
};

use super::connection::RedisConnection;
use super::deadline::within;
use super::keys;
use crate::error::StoreError;

/// How often an instance renews its lease (and counts the fleet).
pub(crate) const BEAT: Duration = Duration::from_secs(1);
/// How long a lease lasts without renewal: three beats, so that one lost renewal does not
/// drop a live instance from the count.
pub(crate) const LEASE_MS: u64 = 3_000;
/// How far a lease may end beyond [`LEASE_MS`] from the server's time and still count (a
/// renewal's time read, then its pipeline sent).
const LEASE_SLACK_MS: u64 = 1_000;

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
    /// Whether a renewal refused by Redis was logged.
    warned: AtomicBool,
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
            warned: AtomicBool::new(false),
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

    /// The lease renewed (or given back) and the fleet counted: `TIME`, then one
    /// pipeline.
    async fn call(
        conn: &RedisConnection,
        key: &[u8],
        member: &str,
        leave: bool,
    ) -> Result<u32, StoreError> {
        let (secs, micros): (u64, u64) = conn.query(&::redis::cmd("TIME")).await?;
        let now_ms = secs * 1000 + micros / 1000;
        let mut pipe = ::redis::pipe();
        if leave {
            pipe.cmd("ZREM").arg(key).arg(member).ignore();
        } else {
            pipe.cmd("ZADD")
                .arg(key)
                .arg(now_ms + LEASE_MS)
                .arg(member)
                .ignore();
        }
        pipe.cmd("ZREMRANGEBYSCORE")
            .arg(key)
            .arg("-inf")
            .arg(now_ms)
            .ignore();
        // No lease ends that late: whatever is scored so is not an instance.
        pipe.cmd("ZREMRANGEBYSCORE")
            .arg(key)
            .arg(format!("({}", now_ms + LEASE_MS + LEASE_SLACK_MS))
            .arg("+inf")
            .ignore();
        pipe.cmd("PEXPIRE").arg(key).arg(LEASE_MS).ignore();
        pipe.cmd("ZCARD").arg(key);
        let (n,): (u32,) = conn.pipeline(&pipe).await?;
        Ok(n)
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
            // Redis refused the renewal (it did not fail to answer): the count stays wrong
            // until someone fixes the permissions or the key.
            Err(StoreError::Backend(e)) if !fleet.warned.swap(true, Ordering::Relaxed) => {
                tracing::warn!(
                    target: "tollgate::redis",
                    error = %e,
                    key = %String::from_utf8_lossy(&fleet.key),
                    counted = ?fleet.size(),
                    "the fleet cannot be counted: the local fallbacks assume the last count, or \
                     the store's fleet_floor, until Redis accepts the fleet's lease (ZADD on \
                     this key); logged once"
                );
            }
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
