//! [`RedisConnection`]: the one place redis-rs's connections meet tollgate's API.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ::redis::{
    aio::ConnectionManager, cluster_async::ClusterConnection, Cmd, FromRedisValue, Pipeline,
};

use super::script::{self, Invocation};
use crate::error::StoreError;

/// A connection to Redis or to a Redis Cluster: the only place redis-rs types meet
/// tollgate's API. Cheap to clone (one multiplexed connection is shared).
///
/// See the [`store::redis`](crate::store::redis) module docs.
#[derive(Clone)]
pub struct RedisConnection {
    conn: Conn,
    /// What the stores built on this connection and its clones share (the rate store's
    /// batcher).
    attached: Arc<Attached>,
}

/// The redis-rs connection inside a [`RedisConnection`].
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Values attached to a connection, at most one of each type.
#[derive(Default)]
struct Attached(Mutex<Vec<Arc<dyn Any + Send + Sync>>>);

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

fn backend(e: ::redis::RedisError) -> StoreError {
    StoreError::backend(e)
}

impl RedisConnection {
    /// Connects to one Redis server (`redis://host:port/db`) through a redis-rs
    /// `ConnectionManager`, which reconnects by itself after a failure.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let client = ::redis::Client::open(url).map_err(backend)?;
        let config = ::redis::aio::ConnectionManagerConfig::new()
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
        let client = ::redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(Duration::from_secs(1))
            .build()
            .map_err(backend)?;
        Ok(client.get_async_connection().await.map_err(backend)?.into())
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

impl From<ConnectionManager> for RedisConnection {
    fn from(cm: ConnectionManager) -> Self {
        RedisConnection {
            conn: Conn::Single(cm),
            attached: Arc::default(),
        }
    }
}

impl From<ClusterConnection> for RedisConnection {
    fn from(c: ClusterConnection) -> Self {
        RedisConnection {
            conn: Conn::Cluster(c),
            attached: Arc::default(),
        }
    }
}
