//! Batching on a Redis Cluster: one lane (a [`Lane`]) per master node, each request sent
//! through the lane of the node that owns its key's slot, so that a node's concurrent
//! requests go out as one call of the cluster batch script, as a single node's do.
//!
//! The slot map is asked of the cluster (`CLUSTER SLOTS`) when the first request comes,
//! every [`REFRESH`] after while requests come, and at once when a reply says the map has
//! changed (a key not served by the node, a moved slot): until a map is known, and for a
//! slot it does not place, a request goes out alone, routed by redis-rs. A lane outlives
//! a refresh that keeps its node, so no queued request is lost to one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::redis::cluster_async::ClusterConnection;
use ::redis::Value;
use arc_swap::ArcSwapOption;

use super::batch::{one, Call, Lane, Reply};
use crate::error::StoreError;

/// Slots in a Redis Cluster.
const SLOTS: usize = 16_384;
/// How often the slot map is asked again while requests come.
const REFRESH: Duration = Duration::from_secs(10);

/// Which master serves each slot, and its lane.
struct SlotMap {
    /// The lane index of each slot (`u16::MAX`: not served).
    slots: Box<[u16]>,
    lanes: Vec<Arc<Lane>>,
    addrs: Vec<String>,
    /// When it was asked, in ms since the Unix epoch.
    at_ms: u64,
}

/// A cluster connection's lanes (attached to the connection, shared by its stores).
#[derive(Default)]
pub(super) struct ClusterLanes {
    map: ArcSwapOption<SlotMap>,
    refreshing: AtomicBool,
}

/// The slot of a key: CRC16 (XMODEM) of its hash tag, or of the whole key without one.
pub(super) fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % SLOTS as u16
}

fn now_ms() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl ClusterLanes {
    /// Sends `call` on `key` through the lane of the node serving it, or alone when the
    /// map does not place it yet.
    pub(super) async fn submit(
        self: &Arc<Self>,
        conn: &ClusterConnection,
        key: &[u8],
        call: &Call,
    ) -> Reply {
        let map = self.map.load();
        let lane = match &*map {
            Some(m) => {
                if now_ms().saturating_sub(m.at_ms) >= REFRESH.as_millis() as u64 {
                    self.refresh(conn);
                }
                let i = m.slots[usize::from(slot(key))];
                m.lanes.get(usize::from(i)).cloned()
            }
            None => {
                self.refresh(conn);
                None
            }
        };
        drop(map);
        let reply = match lane {
            Some(lane) => lane.submit(conn, key, call).await,
            None => one(&mut conn.clone(), key, call).await,
        };
        if let Err(e) = &reply {
            if moved(e) {
                self.refresh(conn);
            }
        }
        reply
    }

    /// Asks the cluster for its slot map again, in the background (one at a time).
    fn refresh(self: &Arc<Self>, conn: &ClusterConnection) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.refreshing.store(false, Ordering::Release);
            return;
        };
        let (me, mut conn) = (Arc::clone(self), conn.clone());
        rt.spawn(async move {
            let mut cmd = ::redis::cmd("CLUSTER");
            cmd.arg("SLOTS");
            let asked = cmd.query_async::<Value>(&mut conn);
            match tokio::time::timeout(Duration::from_secs(1), asked).await {
                Ok(Ok(v)) => match parse(&v) {
                    Some(ranges) => me.install(ranges),
                    None => tracing::debug!(target: "tollgate::redis", "unexpected CLUSTER SLOTS reply: batching waits for the next"),
                },
                Ok(Err(e)) => tracing::debug!(target: "tollgate::redis", error = %e, "CLUSTER SLOTS failed: requests go out alone meanwhile"),
                Err(_) => tracing::debug!(target: "tollgate::redis", "CLUSTER SLOTS timed out"),
            }
            me.refreshing.store(false, Ordering::Release);
        });
    }

    /// Puts a map of `ranges` in place, keeping the lanes of the nodes it keeps.
    fn install(&self, ranges: Vec<(u16, u16, String)>) {
        let old = self.map.load();
        let mut by_addr: HashMap<&str, Arc<Lane>> = HashMap::new();
        if let Some(m) = &*old {
            for (a, l) in m.addrs.iter().zip(&m.lanes) {
                by_addr.insert(a, Arc::clone(l));
            }
        }
        let mut slots = vec![u16::MAX; SLOTS].into_boxed_slice();
        let (mut lanes, mut addrs): (Vec<Arc<Lane>>, Vec<String>) = (Vec::new(), Vec::new());
        for (start, end, addr) in ranges {
            let i = match addrs.iter().position(|a| *a == addr) {
                Some(i) => i,
                None => {
                    let lane = by_addr
                        .get(addr.as_str())
                        .cloned()
                        .unwrap_or_else(|| Arc::new(Lane::cluster()));
                    lanes.push(lane);
                    addrs.push(addr);
                    addrs.len() - 1
                }
            };
            for s in start..=end.min(SLOTS as u16 - 1) {
                slots[usize::from(s)] = i as u16;
            }
        }
        self.map.store(Some(Arc::new(SlotMap {
            slots,
            lanes,
            addrs,
            at_ms: now_ms(),
        })));
    }
}

/// Whether `e` says a key is not where the map put it.
fn moved(e: &StoreError) -> bool {
    let text = e.to_string();
    [
        "non local key",
        "MOVED",
        "ASK",
        "CROSSSLOT",
        "CLUSTERDOWN",
        "TRYAGAIN",
    ]
    .iter()
    .any(|w| text.contains(w))
}

/// `CLUSTER SLOTS`: per range, its first and last slot and its master's `host:port`.
fn parse(v: &Value) -> Option<Vec<(u16, u16, String)>> {
    let Value::Array(ranges) = v else { return None };
    let int = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    ranges
        .iter()
        .map(|r| {
            let Value::Array(parts) = r else { return None };
            let (start, end) = (int(parts.first()?)?, int(parts.get(1)?)?);
            let Value::Array(master) = parts.get(2)? else {
                return None;
            };
            let host = text(master.first()?)?;
            let port = int(master.get(1)?)?;
            Some((start, end, format!("{host}:{port}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slots Redis gives (`CLUSTER KEYSLOT` on Redis 7.0.15).
    #[test]
    fn slots_are_the_clusters() {
        assert_eq!(slot(b"a"), 15495);
        assert_eq!(slot(b"b"), 3300);
        assert_eq!(slot(b"ns:api:rate:v4:{#abc}"), 12612);
        assert_eq!(slot(b"foo{bar}"), 5061);
        assert_eq!(slot(b"bar"), 5061);
        // An empty tag: the whole key; only the first tag counts.
        assert_eq!(slot(b"{}x"), 10595);
        assert_eq!(slot(b"{a}{b}"), 15495);
    }

    #[test]
    fn a_slot_map_reply_is_read() {
        let node = |h: &str, p: i64| {
            Value::Array(vec![
                Value::BulkString(h.as_bytes().to_vec()),
                Value::Int(p),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let v = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7000),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node("127.0.0.1", 7001),
                node("127.0.0.1", 7002),
            ]),
        ]);
        assert_eq!(
            parse(&v),
            Some(vec![
                (0, 5460, "127.0.0.1:7000".into()),
                (5461, 16383, "127.0.0.1:7001".into())
            ])
        );
        assert_eq!(parse(&Value::Int(1)), None);
    }
}
