//! Batching on one connection: requests made while a call is in flight go out together,
//! each caller gets its own reply, and a stalled call fails each request through the
//! failure policy. (Decisions through batches are compared with the in-memory store in
//! `semantics.rs`.)

use std::time::Duration;

use crate::support::redis::RedisServer;
use tokio::task::JoinSet;
use tollgate::clock::ManualClock;
use tollgate::decision::Source;
use tollgate::store::{FailurePolicy, RedisConnection, RedisStore};
use tollgate::Limit;
use tollgate::Quota;

fn limit() -> Limit {
    Limit::token_bucket(Quota::per_hour(1).unwrap().with_burst(100).unwrap()).unwrap()
}

/// Makes the checks at once, each decided by Redis, in fewer script calls than checks
/// (some shared a batch).
async fn check_together(server: &RedisServer, checks: Vec<(RedisStore, &'static str)>) {
    let n = checks.len() as u64;
    let before = server.calls("evalsha");
    let mut tasks = JoinSet::new();
    for (store, k) in checks {
        tasks.spawn(async move { store.check(k, 1).await.unwrap() });
    }
    while let Some(d) = tasks.join_next().await {
        assert_eq!(d.unwrap().source(), Source::Store);
    }
    let calls = server.calls("evalsha") - before;
    assert!(calls < n, "{n} checks at once took {calls} calls");
}

#[tokio::test]
async fn requests_made_during_a_call_share_one_call_and_get_their_own_replies() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let store = RedisStore::builder("limit", limit())
        .deadline(Duration::from_secs(5))
        .build(conn)
        .unwrap();
    // Loads the scripts.
    store.check("warm", 1).await.unwrap();
    let before = server.calls("evalsha");
    let mut tasks = JoinSet::new();
    for _ in 0..20 {
        let store = store.clone();
        tasks.spawn(async move { store.check("hot", 1).await.unwrap() });
    }
    let mut remaining = Vec::new();
    while let Some(d) = tasks.join_next().await {
        let d = d.unwrap();
        assert_eq!(d.source(), Source::Store);
        assert!(d.is_allowed());
        remaining.push(d.remaining());
    }
    // Each request charged once, in some order: every count from 99 down to 80 once.
    remaining.sort_unstable();
    assert_eq!(remaining, (80..100).collect::<Vec<_>>());
    let calls = server.calls("evalsha") - before;
    assert!(calls < 20, "20 concurrent requests took {calls} calls");
    // Off, every request is its own call.
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let unbatched = RedisStore::builder("limit", limit())
        .batching(false)
        .deadline(Duration::from_secs(5))
        .build(conn)
        .unwrap();
    let before = server.calls("evalsha");
    let mut tasks = JoinSet::new();
    for _ in 0..20 {
        let store = unbatched.clone();
        tasks.spawn(async move { store.check("other", 1).await.unwrap() });
    }
    while tasks.join_next().await.is_some() {}
    assert_eq!(server.calls("evalsha") - before, 20);
}

/// Requests at the server's own time (no test clock) leave each key a TTL of its time
/// until fresh, rounded up to the millisecond, and nothing more: `n` charges of an hour on
/// a key, some of them in one batch, expire after at most `n` hours.
#[tokio::test]
async fn a_batch_at_the_servers_time_writes_the_time_until_fresh_as_ttl() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let store = RedisStore::builder("limit", limit())
        .deadline(Duration::from_secs(5))
        .negative_cache(0)
        .build(conn)
        .unwrap();
    store.check("warm", 1).await.unwrap();
    let keys = ["a", "b", "a", "c", "a", "c"];
    check_together(&server, keys.map(|k| (store.clone(), k)).to_vec()).await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    for k in ["a", "b", "c"] {
        let n = keys.iter().filter(|x| **x == k).count() as u64;
        let pttl: u64 = redis::cmd("PTTL")
            .arg(store.redis_key(k))
            .query_async(&mut con)
            .await
            .unwrap();
        let most = n * 3_600_000;
        assert!(
            (most - 1_000..=most).contains(&pttl),
            "key {k}: PTTL {pttl} ms, expected at most {most} ms"
        );
    }
}

/// Keys charged at the server's own time under two policies in one batch, all to the same
/// fill: each key's value holds its own policy's limit (T and cap), as an unbatched call
/// of that policy writes it.
#[tokio::test]
async fn a_batch_writes_each_key_under_its_own_limits() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let narrow = Limit::token_bucket(Quota::per_hour(1).unwrap().with_burst(50).unwrap()).unwrap();
    let build = |name: &str, limit: Limit, batching: bool| {
        RedisStore::builder(name, limit)
            .deadline(Duration::from_secs(5))
            .negative_cache(0)
            .batching(batching)
            .build(conn.clone())
            .unwrap()
    };
    let (wide, other) = (
        build("wide", limit(), true),
        build("narrow", narrow.clone(), true),
    );
    wide.check("warm", 1).await.unwrap();
    let keys = [
        (true, "w1"),
        (false, "n1"),
        (true, "w2"),
        (false, "n2"),
        (true, "w3"),
    ];
    let checks = keys.map(|(w, k)| (if w { wide.clone() } else { other.clone() }, k));
    check_together(&server, checks.to_vec()).await;
    // Reference values, one call each.
    let (wide_1, narrow_1) = (
        build("wide", limit(), false),
        build("narrow", narrow, false),
    );
    wide_1.check("ref-w", 1).await.unwrap();
    narrow_1.check("ref-n", 1).await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let con = client.get_multiplexed_async_connection().await.unwrap();
    let limits = |key: Vec<u8>| {
        let mut con = con.clone();
        async move {
            let v: Vec<u8> = redis::cmd("GET")
                .arg(key)
                .query_async(&mut con)
                .await
                .unwrap();
            assert_eq!(v.len(), 32);
            // The words after the write time: T, cap and the fill.
            v[8..].to_vec()
        }
    };
    let want_wide = limits(wide.redis_key("ref-w")).await;
    let want_narrow = limits(other.redis_key("ref-n")).await;
    assert_ne!(want_wide, want_narrow);
    for (w, k) in keys {
        let (store, want) = if w {
            (&wide, &want_wide)
        } else {
            (&other, &want_narrow)
        };
        assert_eq!(&limits(store.redis_key(k)).await, want, "key {k}");
    }
}

/// Once 32 requests have queued behind a batch call in flight, they go out as a second
/// call without waiting for it, and no third goes out while two are in flight. With the
/// server stopped: a request's own call (given up after 50 ms), then a batch of the 100
/// requests queued behind it, then 70 more requests: the first 32 of them go out as a
/// second call and the other 38 wait for the batch, four calls in all (three without a
/// second call, five with a third); each request is charged once, the 100 before the 70.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_queued_behind_a_batch_go_out_as_a_second_call_and_no_third() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let limit = Limit::token_bucket(Quota::per_hour(1).unwrap().with_burst(200).unwrap()).unwrap();
    let store = RedisStore::builder("limit", limit.clone())
        .deadline(Duration::from_secs(30))
        .build(conn.clone())
        .unwrap();
    // Shares the connection, and so its batcher.
    let hasty = RedisStore::builder("limit", limit)
        .deadline(Duration::from_millis(50))
        .build(conn)
        .unwrap();
    // Loads both scripts: the plain one, then the batch one (requests behind a call).
    let mut tasks = JoinSet::new();
    for i in 0..20 {
        let store = store.clone();
        tasks.spawn(async move { store.check(&format!("warm{i}"), 1).await.unwrap() });
    }
    while tasks.join_next().await.is_some() {}
    let before = server.calls("evalsha");
    server.stop();
    let first = tokio::spawn(async move { hasty.check("other", 1).await });
    tokio::time::sleep(Duration::from_millis(5)).await;
    let spawn = |tasks: &mut JoinSet<_>, n, group| {
        for _ in 0..n {
            let store = store.clone();
            tasks.spawn(async move { (group, store.check("hot", 1).await.unwrap()) });
        }
    };
    let mut tasks = JoinSet::new();
    spawn(&mut tasks, 100, 0);
    // The first call is given up: the 100 go out as a batch, which stalls too.
    first.await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    spawn(&mut tasks, 70, 1);
    // The server runs again before the connection's own response timeout (500 ms).
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.cont();
    let mut remaining = [Vec::new(), Vec::new()];
    while let Some(r) = tasks.join_next().await {
        let (group, d) = r.unwrap();
        assert_eq!(d.source(), Source::Store);
        remaining[group].push(d.remaining());
    }
    for r in &mut remaining {
        r.sort_unstable();
    }
    // The first 100 charged first, then the 70 (in their two calls).
    assert_eq!(remaining[0], (100..200).collect::<Vec<_>>());
    assert_eq!(remaining[1], (30..100).collect::<Vec<_>>());
    assert_eq!(server.calls("evalsha") - before, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_call_fails_each_request_through_the_failure_policy() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let store = RedisStore::builder("limit", limit())
        .deadline(Duration::from_millis(100))
        .failure_policy(FailurePolicy::FailClosed {
            retry_after: Duration::from_secs(1),
        })
        // Kept closed, so that every request reaches the batcher.
        .breaker(1_000, Duration::from_millis(10))
        .build(conn)
        .unwrap();
    store.check("warm", 1).await.unwrap();
    server.stop();
    let mut tasks = JoinSet::new();
    for i in 0..20 {
        let store = store.clone();
        tasks.spawn(async move { store.check(&format!("k{}", i % 4), 1).await.unwrap() });
    }
    while let Some(d) = tasks.join_next().await {
        assert_eq!(d.unwrap().source(), Source::FailClosed);
    }
    server.cont();
    // The stalled calls complete once the server runs again; then decisions come from
    // Redis again (a bounded number of attempts, no timing asserted).
    let mut source = Source::FailClosed;
    for _ in 0..100 {
        source = store.check("after", 1).await.unwrap().source();
        if source == Source::Store {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(source, Source::Store);
}

/// A batch leaves each key what its requests' own calls would have left: the stored bytes
/// of an unbatched store deciding the same requests at the same (test clock's) time, and
/// a TTL of the time until fresh plus the test clock's slack (60 s).
#[tokio::test]
async fn a_batch_writes_what_separate_calls_write() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let clock = ManualClock::at(Duration::from_secs(1_750_000_000));
    let build = |namespace: &str, batching: bool| {
        RedisStore::builder("limit", limit())
            .namespace(namespace)
            .clock(clock.clone())
            .negative_cache(0)
            .deadline(Duration::from_secs(5))
            .batching(batching)
            .build(conn.clone())
            .unwrap()
    };
    let (batched, single) = (build("batched", true), build("single", false));
    batched.check("warm", 1).await.unwrap();
    let keys = ["a", "b", "a", "c", "a", "c", "d", "a"];
    check_together(&server, keys.map(|k| (batched.clone(), k)).to_vec()).await;
    let mut last = std::collections::HashMap::new();
    for k in keys {
        last.insert(k, single.check(k, 1).await.unwrap());
    }
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    for (k, d) in last {
        let get = |key: Vec<u8>| redis::cmd("GET").arg(key).clone();
        let got: Vec<u8> = get(batched.redis_key(k))
            .query_async(&mut con)
            .await
            .unwrap();
        let want: Vec<u8> = get(single.redis_key(k))
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(got, want, "key {k}");
        let pttl: u64 = redis::cmd("PTTL")
            .arg(batched.redis_key(k))
            .query_async(&mut con)
            .await
            .unwrap();
        let expect = d.reset_after().as_nanos().div_ceil(1_000_000) as u64 + 60_000;
        assert!(
            (expect - 1_000..=expect).contains(&pttl),
            "key {k}: PTTL {pttl} ms, expected {expect} ms"
        );
    }
}
