//! [`Node`]: the connection to one Redis server (or to a Sentinel-managed master) that
//! rebuilds itself, finding its server again, when the one it has can no longer serve.
//!
//! One multiplexed connection serves every call. It is replaced, by a background task
//! that connects again (resolving the name or asking the sentinels anew, and checking
//! `ROLE`) until it gets a master, when:
//! - the connection broke (an I/O error, the server closed it);
//! - the server answers `READONLY` (a demoted master that kept its clients, behind a DNS
//!   name, a Kubernetes Service or a TCP proxy), `MASTERDOWN` (a replica that lost its
//!   master) or `LOADING` (a server still loading its data, perhaps not the one to use);
//! - no call has been answered for [`SILENCE`] while calls were made (a server that stopped
//!   answering, or a half-open TCP connection after a partition).
//!
//! Calls go to the old connection until the new one is ready, and fail as they would;
//! the stores' breakers and failure policies answer meanwhile. Each replacement moves the
//! connection's generation on, which tells an open breaker to probe at once rather than
//! wait out its cooldown.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::{
    Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};
use arc_swap::ArcSwap;
use tokio::time::Instant;

use super::target::Target;
use crate::error::StoreError;
use crate::observe::{RedisMetrics, Throttle};

/// How long calls may go unanswered before the connection is replaced.
pub(crate) const SILENCE: Duration = Duration::from_secs(1);
/// The first and the longest pause between two attempts to connect again.
const RETRY: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(250));

/// Why a connection is replaced (the metrics' `tollgate.reason`, in the order of
/// [`RedisMetrics`]'s counts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The connection broke.
    Lost,
    /// `READONLY`: the server is a replica now.
    ReadOnly,
    /// `MASTERDOWN`: a replica without its master.
    MasterDown,
    /// `LOADING`: the server is loading its data.
    Loading,
    /// No call answered for [`SILENCE`].
    Unresponsive,
}

impl Reason {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Reason::Lost => "connection_lost",
            Reason::ReadOnly => "readonly",
            Reason::MasterDown => "masterdown",
            Reason::Loading => "loading",
            Reason::Unresponsive => "unresponsive",
        }
    }

    /// Why `e` calls for a new connection, if it does.
    fn of(e: &RedisError) -> Option<Reason> {
        match e.kind() {
            ErrorKind::Server(ServerErrorKind::ReadOnly) => return Some(Reason::ReadOnly),
            ErrorKind::Server(ServerErrorKind::MasterDown) => return Some(Reason::MasterDown),
            ErrorKind::Server(ServerErrorKind::BusyLoading) => return Some(Reason::Loading),
            _ => {}
        }
        // A script's failed write comes back as the script's error, its code inside.
        let text = e.to_string();
        for (code, reason) in [
            ("READONLY", Reason::ReadOnly),
            ("MASTERDOWN", Reason::MasterDown),
            ("LOADING", Reason::Loading),
        ] {
            if e.code() == Some(code) || text.contains(code) {
                return Some(reason);
            }
        }
        if e.is_timeout() {
            return None; // counted as silence instead
        }
        (e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error())
            .then_some(Reason::Lost)
    }
}

/// The connection in use and where it goes.
struct Live {
    conn: MultiplexedConnection,
    addr: String,
    generation: u64,
}

/// A self-rebuilding connection. See the [module docs](self).
pub(crate) struct Node {
    target: Target,
    live: ArcSwap<Live>,
    rebuilding: AtomicBool,
    /// When the current run of unanswered calls began, in ms since `epoch` (+1; 0: none).
    silent_since: AtomicU64,
    epoch: Instant,
    metrics: RedisMetrics,
    /// Connection events logged at most once per interval.
    log: Throttle,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let live = self.live.load();
        f.debug_struct("Node")
            .field("target", &self.target)
            .field("addr", &live.addr)
            .field("generation", &live.generation)
            .finish()
    }
}

impl Node {
    /// Connects to `target` (once: an error if it cannot now).
    pub(crate) async fn connect(target: Target) -> Result<Arc<Node>, StoreError> {
        let (conn, addr) = target.connect().await?;
        Ok(Arc::new(Node {
            target,
            live: ArcSwap::from_pointee(Live {
                conn,
                addr,
                generation: 0,
            }),
            rebuilding: AtomicBool::new(false),
            silent_since: AtomicU64::new(0),
            epoch: Instant::now(),
            metrics: RedisMetrics::new(),
            log: Throttle::default(),
        }))
    }

    /// How many times the connection was replaced.
    pub(crate) fn generation(&self) -> u64 {
        self.live.load().generation
    }

    fn millis(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
    }

    /// Counts a call's outcome: an answer ends a silence; an error that calls for a new
    /// connection starts one; an unanswered call (timed out, or abandoned by its caller)
    /// starts or extends a silence, which past [`SILENCE`] does too.
    fn observe(self: &Arc<Self>, generation: u64, result: Option<&RedisResult<()>>) {
        match result {
            Some(Ok(())) => {
                if self.silent_since.load(Ordering::Relaxed) != 0 {
                    self.silent_since.store(0, Ordering::Relaxed);
                }
            }
            Some(Err(e)) => match Reason::of(e) {
                Some(reason) => self.rebuild(generation, reason, e),
                None if e.is_timeout() => self.unanswered(generation),
                // A server's error reply (a script's own error) is an answer.
                None => {}
            },
            None => self.unanswered(generation),
        }
    }

    fn unanswered(self: &Arc<Self>, generation: u64) {
        let now = self.millis();
        let since =
            match self
                .silent_since
                .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => now,
                Err(since) => since,
            };
        if now.saturating_sub(since) >= SILENCE.as_millis() as u64 {
            self.rebuild(generation, Reason::Unresponsive, &"no answer");
        }
    }

    /// Starts replacing the connection of `generation` (unless it was replaced already,
    /// or a replacement is under way), in a task of its own.
    fn rebuild(self: &Arc<Self>, generation: u64, reason: Reason, cause: &dyn fmt::Display) {
        if self.live.load().generation != generation || self.rebuilding.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.rebuilding.store(false, Ordering::Release);
            return;
        };
        self.metrics.reconnecting(reason as usize);
        if let Some(suppressed) = self.log.first(self.millis()) {
            tracing::warn!(
                target: "tollgate::redis",
                target_server = ?self.target,
                reason = reason.name(),
                error = %cause,
                suppressed,
                "Redis connection replaced: connecting again (logged at most once per 10 s; `suppressed`: events since the last line)"
            );
        }
        rt.spawn(reconnect(Arc::downgrade(self), generation));
    }
}

/// Connects again until a master answers, then puts the new connection in place; gives up
/// when the node is dropped.
async fn reconnect(node: Weak<Node>, generation: u64) {
    let mut pause = RETRY.0;
    loop {
        let Some(n) = node.upgrade() else { return };
        match n.target.connect().await {
            Ok((conn, addr)) => {
                n.live.store(Arc::new(Live {
                    conn,
                    addr,
                    generation: generation + 1,
                }));
                n.silent_since.store(0, Ordering::Relaxed);
                n.rebuilding.store(false, Ordering::Release);
                tracing::info!(
                    target: "tollgate::redis",
                    server = %n.live.load().addr,
                    "Redis connection in place again"
                );
                return;
            }
            Err(e) => {
                tracing::debug!(target: "tollgate::redis", error = %e, "Redis not reachable yet: trying again");
            }
        }
        drop(n);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RETRY.1);
    }
}

/// A call's outcome for [`Node::observe`]: its error, or the first error a server
/// replied with (an error reply is a value until the caller reads it).
fn outcome<T>(result: &RedisResult<T>, values: impl Fn(&T) -> &[Value]) -> RedisResult<()> {
    match result {
        Err(e) => Err(e.clone()),
        Ok(v) => match values(v).iter().find_map(|v| match v {
            Value::ServerError(e) => Some(e),
            _ => None,
        }) {
            Some(e) => Err(RedisError::from(e.clone())),
            None => Ok(()),
        },
    }
}

/// The connection as a redis-rs connection: each call on the live connection, its outcome
/// observed. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct NodeHandle(pub(crate) Arc<Node>);

/// Observes a call that never finished (its caller stopped waiting) as unanswered.
struct Pending<'a> {
    node: &'a Arc<Node>,
    generation: u64,
    done: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.node.observe(self.generation, None);
        }
    }
}

impl ConnectionLike for NodeHandle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let live = self.0.live.load_full();
            let mut pending = Pending {
                node: &self.0,
                generation: live.generation,
                done: false,
            };
            let result = live.conn.clone().send_packed_command(cmd).await;
            pending.done = true;
            self.0.observe(
                live.generation,
                Some(&outcome(&result, std::slice::from_ref)),
            );
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let live = self.0.live.load_full();
            let mut pending = Pending {
                node: &self.0,
                generation: live.generation,
                done: false,
            };
            let result = live
                .conn
                .clone()
                .send_packed_commands(cmd, offset, count)
                .await;
            pending.done = true;
            self.0
                .observe(live.generation, Some(&outcome(&result, Vec::as_slice)));
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.0.live.load().conn.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_that_call_for_a_new_connection() {
        let server = |kind, detail: &str| {
            RedisError::from((ErrorKind::Server(kind), "server", detail.to_owned()))
        };
        assert_eq!(
            Reason::of(&server(ServerErrorKind::ReadOnly, "replica")),
            Some(Reason::ReadOnly)
        );
        assert_eq!(
            Reason::of(&server(ServerErrorKind::MasterDown, "link down")),
            Some(Reason::MasterDown)
        );
        assert_eq!(
            Reason::of(&server(ServerErrorKind::BusyLoading, "loading")),
            Some(Reason::Loading)
        );
        // A script whose write a replica refused.
        let script = server(
            ServerErrorKind::ResponseError,
            "READONLY You can't write against a read only replica. script: abc",
        );
        assert_eq!(Reason::of(&script), Some(Reason::ReadOnly));
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(Reason::of(&io), Some(Reason::Lost));
        // A script's own error is an answer.
        let own = server(
            ServerErrorKind::ResponseError,
            "user_script:1: bad argument",
        );
        assert_eq!(Reason::of(&own), None);
    }
}
