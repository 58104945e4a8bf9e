//! Batching: the script calls to one server coalesced into one call while a call is
//! already in flight. A single-node connection has one lane ([`Lane`]); a cluster
//! connection one per master node (see [`super::cluster`]).
//!
//! A request that finds its lane idle goes out at once, alone, as the
//! plain script call it would be without batching, made from the caller's own task, so an
//! idle caller never waits for a batch. Requests made while a call is in flight queue; when
//! it completes, the queue goes out as ONE call of the batch script (at most
//! [`MAX_BATCH`] requests; more wait for the next), which decides them in arrival order on
//! the server, and each caller gets its own reply.
//!
//! Once [`SECOND_CALL_AT`] requests have queued behind a batch call, they go out as a
//! second call without waiting for the first: while Redis decides one batch, the callers of
//! the other are answered and ask again, so client and server work at once instead of
//! taking turns. At most two calls are in flight, each one command of the batch script
//! (never beside a request's own call, which may take two), and the commands of one
//! connection reach Redis in the order they are sent: requests are decided in the order
//! they were made. One exception: when Redis has lost the script (a restart, `SCRIPT
//! FLUSH`), two calls in flight are both refused and sent again, in either order; their
//! requests were all made before either was answered, so either order is one they could
//! have run in.
//!
//! Queued requests are sent by tasks spawned for their batch; a queued caller waits for
//! its reply under its own deadline, and a request whose caller stopped waiting before its
//! batch left is not sent.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use ::redis::aio::ConnectionLike;
use tokio::sync::oneshot;

use super::script::{self, Args, Ints};
use crate::error::StoreError;
use crate::redis::{run, Invocation};

/// Most requests in one batch call.
const MAX_BATCH: usize = 128;
// A batch names each request's key and list of limits by an index below 256.
const _: () = assert!(MAX_BATCH < 256);

/// Requests queued behind a call in flight that go out as a second call without waiting
/// for it: enough that the second call is still a batch worth its overhead.
const SECOND_CALL_AT: usize = 32;

/// What one request asks of Redis.
#[derive(Clone)]
pub(super) enum Call {
    /// A script call.
    Script(Args),
    /// `DEL` of the key.
    Delete,
}

/// One request: its key and its call.
pub(super) struct Request {
    pub(super) key: Vec<u8>,
    pub(super) call: Call,
}

pub(super) type Reply = Result<Vec<i64>, StoreError>;

struct Pending {
    request: Request,
    reply: oneshot::Sender<Reply>,
}

#[derive(Default)]
struct State {
    /// Calls in flight (0 to 2); while there is one, new requests queue.
    calls: u8,
    /// Whether the call in flight is a request's own, made at once: it may take two
    /// commands (the plain script, then the general one), so nothing goes out beside it.
    alone: bool,
    queue: VecDeque<Pending>,
}

impl State {
    /// Whether the queue goes out as a call now: when nothing is in flight, or (`second`)
    /// as the second call once it is long enough, beside a batch call.
    fn may_launch(&self, second: bool) -> bool {
        !self.queue.is_empty()
            && (self.calls == 0
                || (second && self.calls == 1 && !self.alone && self.queue.len() >= SECOND_CALL_AT))
    }
}

/// The queue of one server: a single node, or one master of a cluster.
#[derive(Default)]
pub(super) struct Lane {
    state: Mutex<State>,
    /// Whether the server is a cluster's node: its batch script differs, and no second
    /// call goes out beside a batch (the cluster's other nodes work meanwhile, and on a
    /// cluster a second call measured slower: 1.22x unbatched against 1.47x without).
    cluster: bool,
}

/// What a lane sends its calls on: a single node's connection, or a cluster's (routed by
/// the first key of each call).
pub(super) trait Sender: ConnectionLike + Clone + Send + Sync + 'static {}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Sender for C {}

impl Lane {
    /// A cluster node's lane.
    pub(super) fn cluster() -> Self {
        Lane {
            state: Mutex::default(),
            cluster: true,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `call` on `key` at once, from the caller's task, when nothing is in flight;
    /// otherwise queues a copy of both for the next batch.
    pub(super) async fn submit<C: Sender>(
        self: &Arc<Self>,
        conn: &C,
        key: &[u8],
        call: &Call,
    ) -> Reply {
        let queued = {
            let mut state = self.state();
            if state.calls > 0 {
                // A stalled call keeps the queue growing: requests whose callers gave up
                // are dropped now and then rather than at the next batch only.
                if state.queue.len() >= 8 * MAX_BATCH {
                    state.queue.retain(|p| !p.reply.is_closed());
                }
                let (tx, rx) = oneshot::channel();
                let request = Request {
                    key: key.to_vec(),
                    call: call.clone(),
                };
                state.queue.push_back(Pending { request, reply: tx });
                if state.may_launch(!self.cluster) {
                    self.launch(&mut state, conn);
                }
                Some(rx)
            } else {
                state.calls = 1;
                state.alone = true;
                None
            }
        };
        if let Some(rx) = queued {
            return rx
                .await
                .unwrap_or_else(|_| Err(StoreError::backend("the batching task stopped")));
        }
        let mut hand_off = HandOff {
            batcher: self,
            conn,
            done: false,
        };
        let reply = one(&mut conn.clone(), key, call).await;
        hand_off.done = true;
        self.finished(conn);
        reply
    }

    /// After a call: the queue goes out as the next call if nothing else is in flight, or
    /// as a second one once it is long enough; idle again when nothing is left.
    fn finished<C: Sender>(self: &Arc<Self>, conn: &C) {
        let mut state = self.state();
        state.calls -= 1;
        state.alone = false;
        while state.may_launch(!self.cluster) {
            if !self.launch(&mut state, conn) {
                return;
            }
        }
    }

    /// Sends the head of the queue as one call, from a task of its own; `false` (and the
    /// queue dropped, its callers getting an error) when no runtime is left to run it:
    /// the caller's future was dropped during shutdown.
    fn launch<C: Sender>(self: &Arc<Self>, state: &mut State, conn: &C) -> bool {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            if state.calls == 0 {
                state.queue.clear();
            }
            return false;
        };
        let n = state.queue.len().min(MAX_BATCH);
        let items: Vec<Pending> = state.queue.drain(..n).collect();
        state.calls += 1;
        rt.spawn(send(self.clone(), conn.clone(), items));
        true
    }
}

/// Hands the queue on when the caller making a call at once stops waiting for it (its
/// deadline passed, or its future was dropped).
struct HandOff<'a, C: Sender> {
    batcher: &'a Arc<Lane>,
    conn: &'a C,
    done: bool,
}

impl<C: Sender> Drop for HandOff<'_, C> {
    fn drop(&mut self) {
        if !self.done {
            self.batcher.finished(self.conn);
        }
    }
}

/// Counts a batch task's call as ended if the task is dropped mid-call (its runtime
/// shutting down); with no call left in flight, the queued requests are dropped with it,
/// and their callers get an error.
struct Ended<'a> {
    batcher: &'a Lane,
    done: bool,
}

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut state = self.batcher.state();
            state.calls -= 1;
            if state.calls == 0 {
                state.queue.clear();
            }
        }
    }
}

/// Makes one call for `items` and answers their callers.
async fn send<C: Sender>(batcher: Arc<Lane>, mut conn: C, mut items: Vec<Pending>) {
    let mut ended = Ended {
        batcher: &batcher,
        done: false,
    };
    // A caller that stopped waiting (its deadline passed) has had the failure policy's
    // decision: its request is not sent. Even a lone request goes as a batch: one command,
    // so that a second call may go out behind it.
    items.retain(|p| !p.reply.is_closed());
    if !items.is_empty() {
        let replies = batch(&mut conn, &items, batcher.cluster).await;
        for (i, p) in items.drain(..).enumerate() {
            let reply = match &replies {
                Ok(r) => r.get(i).cloned().unwrap_or_else(|| Err(short())),
                Err(e) => Err(e.clone()),
            };
            let _ = p.reply.send(reply);
        }
        // The callers just answered usually ask again at once: let them queue before
        // looking, so that the next batch takes them all rather than leaving them behind
        // a call made for the first one alone.
        tokio::task::yield_now().await;
    }
    ended.done = true;
    batcher.finished(&conn);
}

fn short() -> StoreError {
    StoreError::backend("unexpected reply from the batch script: too short")
}

/// A request on its own: the plain script call (and, when the fast script finds a state
/// written under other limits, the general one right after it), or a `DEL`. Also how an
/// unbatched store sends every request.
pub(super) async fn one<C: ConnectionLike>(conn: &mut C, key: &[u8], call: &Call) -> Reply {
    let backend = StoreError::backend;
    match call {
        Call::Script(args) => {
            let Ints(reply) = run(&args.invocation(key, args.general), conn)
                .await
                .map_err(backend)?;
            if reply == [3] && !args.general {
                // Boxed: rare (a state written under other limits), and every call's
                // future would carry a second invocation.
                return Box::pin(async { run(&args.invocation(key, true), conn).await })
                    .await
                    .map_err(backend);
            }
            Ok(reply)
        }
        Call::Delete => {
            let mut cmd = ::redis::cmd("DEL");
            cmd.arg(key);
            cmd.query_async::<i64>(conn).await.map_err(backend)?;
            Ok(Vec::new())
        }
    }
}

/// Several requests in one call of the batch script (on a cluster's node, its cluster
/// variant); one reply per request, or the call's error for all.
async fn batch<C: ConnectionLike>(
    conn: &mut C,
    items: &[Pending],
    cluster: bool,
) -> Result<Vec<Reply>, StoreError> {
    let script: &'static ::redis::Script = if cluster {
        &script::CLUSTER_BATCH_SCRIPT
    } else {
        &script::BATCH_SCRIPT
    };
    // Every distinct key once, and every distinct list of limits once (a store's requests
    // share one); each request names both by their index.
    let mut keys: HashMap<&[u8], usize, foldhash::fast::RandomState> =
        HashMap::with_capacity_and_hasher(items.len(), Default::default());
    let mut order: Vec<&[u8]> = Vec::with_capacity(items.len());
    let mut lists: Vec<&[u64]> = Vec::new();
    let mut records = Vec::with_capacity(16 * items.len());
    for p in items {
        let key = p.request.key.as_slice();
        let k = *keys.entry(key).or_insert_with(|| {
            order.push(key);
            order.len()
        });
        match &p.request.call {
            Call::Script(args) => {
                let l = list_index(&mut lists, &args.limits);
                args.batch_item(&mut records, k, l)
            }
            Call::Delete => script::batch_delete(&mut records, k, list_index(&mut lists, &[])),
        }
    }
    let bytes: usize = order.iter().map(|k| k.len() + 4).sum();
    let mut cmd = ::redis::Cmd::with_capacity(
        5 + order.len() + 8 * lists.len(),
        128 + bytes + records.len(),
    );
    cmd.arg("EVALSHA").arg(script.get_hash());
    if cluster {
        // The first key routes the call to its node; all of them travel as arguments.
        cmd.arg(1).arg(order[0]).arg(order.len());
    } else {
        cmd.arg(order.len());
    }
    for k in &order {
        cmd.arg(*k);
    }
    cmd.arg(lists.len());
    for l in &lists {
        cmd.arg(l.len());
        for a in *l {
            cmd.arg(*a);
        }
    }
    cmd.arg(records);
    let flat: Vec<i64> = run(&Invocation { script, cmd }, conn)
        .await
        .map_err(StoreError::backend)?;
    Ok(split(&flat, items.len()))
}

/// The 1-based index of `list` among a batch's lists of limits, added if new.
fn list_index<'a>(lists: &mut Vec<&'a [u64]>, list: &'a [u64]) -> usize {
    match lists.iter().position(|l| *l == list) {
        Some(i) => i + 1,
        None => {
            lists.push(list);
            lists.len()
        }
    }
}

/// Splits the batch script's flat reply into one reply per request: a fast reply is one
/// value, `4 * fill + code` (never negative), given back as `[code, fill]`; any other is
/// `-1 - n`, then its `n` values (a fast reply with a fill of 2^51 or more: `-3`, code,
/// fill). Requests past a malformed part get an error.
fn split(flat: &[i64], n: usize) -> Vec<Reply> {
    let mut out = Vec::with_capacity(n);
    let mut rest = flat;
    for _ in 0..n {
        let part = rest.split_first().and_then(|(&head, tail)| {
            if head >= 0 {
                Some((vec![head & 3, head >> 2], tail))
            } else {
                let len = usize::try_from(-1 - head).ok()?;
                (len <= tail.len()).then(|| {
                    let (reply, tail) = tail.split_at(len);
                    (reply.to_vec(), tail)
                })
            }
        });
        match part {
            Some((reply, tail)) => {
                out.push(Ok(reply));
                rest = tail;
            }
            None => {
                out.push(Err(short()));
                rest = &[];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_gives_each_request_its_reply() {
        let r = split(&[20, -1, -2, 9, 1, 4 * 7 + 2, -3, 1, 1 << 52], 6);
        assert_eq!(r[0], Ok(vec![0, 5]));
        assert_eq!(r[1], Ok(vec![]));
        assert_eq!(r[2], Ok(vec![9]));
        assert_eq!(r[3], Ok(vec![1, 0]));
        assert_eq!(r[4], Ok(vec![2, 7]));
        assert_eq!(r[5], Ok(vec![1, 1 << 52]));
    }

    #[test]
    fn split_refuses_a_malformed_reply_without_panicking() {
        assert!(split(&[-4, 0, 5], 1)[0].is_err());
        assert!(split(&[], 1)[0].is_err());
        let r = split(&[-2, 7], 2);
        assert_eq!(r[0], Ok(vec![7]));
        assert!(r[1].is_err());
    }
}
