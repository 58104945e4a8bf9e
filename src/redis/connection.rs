//! [`RedisConnection`]: the one place redis-rs's connections meet tollgate's API.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use ::redis::{cluster_async::ClusterConnection, Cmd, FromRedisValue, Pipeline};

use super::node::{Node, NodeHandle};
use super::script::{self, Invocation};
use super::target::{Target, CONNECT_TIMEOUT};
use crate::error::StoreError;

/// A connection to Redis (one server, or the master of a Sentinel-managed group) or to a
/// Redis Cluster: the only place redis-rs types meet tollgate's API. Cheap to clone (one
/// multiplexed connection is shared). A connection to one server rebuilds itself when it
/// breaks, when its server turns out to be a replica (`READONLY`: a failover), or when it
/// stops answering; see the [`store::redis`](crate::store::redis) module docs.
#[derive(Clone)]
pub struct RedisConnection {
    conn: Conn,
    /// What the stores built on this connection and its clones share (the rate store's
    /// batcher, the fleet, the names in use).
    attached: Arc<Attached>,
}

/// The redis-rs connection inside a [`RedisConnection`].
#[derive(Clone)]
pub(crate) enum Conn {
    Single(NodeHandle),
    Cluster(ClusterConnection),
}

/// Values attached to a connection, at most one of each type.
#[derive(Default)]
struct Attached(Mutex<Vec<Arc<dyn Any + Send + Sync>>>);

impl fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.conn {
            Conn::Single(node) => f.debug_tuple("RedisConnection").field(&node.0).finish(),
            Conn::Cluster(_) => f.write_str("RedisConnection(cluster)"),
        }
    }
}

fn backend(e: ::redis::RedisError) -> StoreError {
    StoreError::backend(e)
}

impl RedisConnection {
    /// Connects to one Redis server, or to the master of a Sentinel-managed group:
    ///
    /// - `redis://[user:pass@]host:port/db`, `rediss://…` (TLS; see the guide),
    ///   `redis+unix:///path.sock`: one server, its name resolved again each time the
    ///   connection is rebuilt (a DNS name or a proxy that follows the master works);
    /// - `redis+sentinel://[user:pass@]host:port[,host:port…]/master-name[/db]` (port
    ///   26379 by default; `rediss+sentinel://` for TLS to the sentinels and the master):
    ///   the master is asked of the sentinels, and asked again whenever the connection is
    ///   rebuilt. The credentials are sent to both.
    ///
    /// A new connection is used only once `ROLE` says its server is a master. Fails when no
    /// master can be reached now; once connected, the connection rebuilds itself in the
    /// background when it breaks, when a reply says its server is no longer the master
    /// (`READONLY`, `MASTERDOWN`, `LOADING`), or when no call is answered for a second.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let node = Node::connect(Target::parse(url)?).await?;
        Ok(RedisConnection {
            conn: Conn::Single(NodeHandle(node)),
            attached: Arc::default(),
        })
    }

    /// Connects to a Redis Cluster given some of its nodes' URLs.
    pub async fn connect_cluster<I, S>(nodes: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nodes: Vec<String> = nodes.into_iter().map(|s| s.as_ref().to_owned()).collect();
        let client = ::redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(backend)?;
        let conn = client.get_async_connection().await.map_err(backend)?;
        Ok(RedisConnection {
            conn: Conn::Cluster(conn),
            attached: Arc::default(),
        })
    }

    /// How many times the connection has been rebuilt (a cluster connection's own
    /// reconnections are not counted): a breaker opened before a rebuild probes at once.
    pub(crate) fn generation(&self) -> u64 {
        match &self.conn {
            Conn::Single(node) => node.0.generation(),
            Conn::Cluster(_) => 0,
        }
    }

    /// The redis-rs connection.
    pub(crate) fn conn(&self) -> &Conn {
        &self.conn
    }

    /// The value of type `T` attached to this connection and its clones, attached now
    /// (`T::default()`) if there is none yet: state that the stores built on clones of
    /// one connection share.
    pub(crate) fn attached<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut all = self
            .attached
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(t) = all.iter().find_map(|a| Arc::clone(a).downcast::<T>().ok()) {
            return t;
        }
        let t = Arc::new(T::default());
        all.push(t.clone());
        t
    }

    /// Sends one script call (see [`script::run`]).
    pub(crate) async fn invoke(&self, inv: &Invocation) -> Result<Vec<i64>, StoreError> {
        match &self.conn {
            Conn::Single(c) => script::run(inv, &mut c.clone()).await.map_err(backend),
            Conn::Cluster(c) => script::run(inv, &mut c.clone()).await.map_err(backend),
        }
    }

    /// Runs `script` (`EVALSHA`, loaded again after `NOSCRIPT`) on `keys` with `args`,
    /// replying with integers.
    pub(crate) async fn eval_script(
        &self,
        script: &'static ::redis::Script,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Vec<i64>, StoreError> {
        self.invoke(&Invocation::new(script, keys, args)).await
    }

    /// Sends one pipeline of plain commands (their keys in one slot on a cluster).
    pub(crate) async fn pipeline<T: FromRedisValue>(
        &self,
        pipe: &Pipeline,
    ) -> Result<T, StoreError> {
        match &self.conn {
            Conn::Single(c) => pipe.query_async(&mut c.clone()).await.map_err(backend),
            Conn::Cluster(c) => pipe.query_async(&mut c.clone()).await.map_err(backend),
        }
    }

    /// Sends one plain command.
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, StoreError> {
        match &self.conn {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await.map_err(backend),
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await.map_err(backend),
        }
    }
}
