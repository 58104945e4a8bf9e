//! How a store's calls reach Redis: through the lane of the server that holds the key when
//! batching (see [`super::batch`] and [`super::cluster`]), as their own calls otherwise.

use std::sync::Arc;

use super::batch::{one, Call, Lane, Reply};
use super::cluster::ClusterLanes;
use crate::redis::{Conn, RedisConnection};

/// Sends `call` on `key` for a store on `conn`: through the lane of the server that holds
/// the key when `batching`, as its own call otherwise. Both are borrowed: a request copies
/// them only when it queues.
pub(super) async fn request(
    conn: &RedisConnection,
    batcher: &Batcher,
    key: &[u8],
    call: &Call,
    batching: bool,
) -> Reply {
    match conn.conn() {
        Conn::Single(c) if batching => batcher.lane.submit(c, key, call).await,
        Conn::Cluster(c) if batching => batcher.cluster.submit(c, key, call).await,
        Conn::Single(c) => one(&mut c.clone(), key, call).await,
        Conn::Cluster(c) => one(&mut c.clone(), key, call).await,
    }
}

/// A connection's lanes (attached to it, so shared by its clones and the stores built on
/// them): one for a single node, one per master node of a cluster.
#[derive(Default)]
pub(super) struct Batcher {
    lane: Arc<Lane>,
    cluster: Arc<ClusterLanes>,
}
