//! The local fallback of a Redis store: from the state Redis last returned, at a share
//! sized to the fleet, and charged to the shared state when Redis answers again.

use std::time::{Duration, Instant};

use crate::support::redis::RedisServer;
use tollgate::clock::ManualClock;
use tollgate::decision::Source;
use tollgate::store::{FailurePolicy, RedisConnection, RedisStore};
use tollgate::{Limit, Quota};

fn limit() -> Limit {
    Limit::token_bucket(Quota::per_minute(20).unwrap()).unwrap()
}

/// Regression: the fallback started every key from a fresh bucket, whatever Redis had
/// counted for it, and Redis never heard of what it admitted: a key with 5 of 20 units left
/// got 20 more while Redis was stopped, and 5 more from Redis after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_goes_on_from_what_redis_last_said_and_tells_redis_after() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = ManualClock::at(Duration::from_secs(1_700_000_000));
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let store = RedisStore::builder("limit", limit())
        .clock(clock.clone())
        .failure_policy(FailurePolicy::LocalFallback { share: 1.0 })
        .build(conn)
        .unwrap();
    for _ in 0..15 {
        let d = store.check("k", 1).await.unwrap();
        assert!(d.is_allowed() && d.source() == Source::Store, "{d:?}");
    }
    server.stop();
    let mut admitted = 0;
    for _ in 0..30 {
        let d = store.check("k", 1).await.unwrap();
        assert_eq!(d.source(), Source::Fallback);
        admitted += u32::from(d.is_allowed());
    }
    assert_eq!(
        admitted, 5,
        "the 5 units Redis had left, not a fresh bucket"
    );
    server.cont();
    // Past the breaker's cooldown (on the store's clock), Redis decides again.
    clock.advance(Duration::from_secs(1));
    let start = Instant::now();
    let after = loop {
        let d = store.check("k", 1).await.unwrap();
        if d.source() == Source::Store {
            break d;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{d:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        !after.is_allowed(),
        "Redis counts the 5 units admitted meanwhile: {after:?}"
    );
    let peek = store.peek("k", 0).await.unwrap();
    assert_eq!(peek.source(), Source::Store);
    assert_eq!(peek.remaining(), 0);
}

/// Each instance counts the fleet on Redis: two instances (separate connections) fall back
/// at half of each quota; an explicit share wins; an instance that goes stops being
/// counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_share_is_one_over_the_instances_counted() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let build = |conn: RedisConnection, failure: Option<FailurePolicy>| {
        let b = RedisStore::builder("limit", limit()).namespace("fleet-test");
        match failure {
            Some(f) => b.failure_policy(f).build(conn).unwrap(),
            None => b.build(conn).unwrap(),
        }
    };
    let url = server.url();
    let connect = || RedisConnection::connect(&url);
    let a = build(connect().await.unwrap(), None);
    let b = build(connect().await.unwrap(), None);
    // Two stores on clones of one connection are one instance.
    let shared = connect().await.unwrap();
    let c = build(shared.clone(), None);
    let c2 = build(shared, Some(FailurePolicy::FleetShare));
    let explicit = build(
        connect().await.unwrap(),
        Some(FailurePolicy::LocalFallback { share: 0.3 }),
    );
    let start = Instant::now();
    loop {
        let got: Vec<f64> = [&a, &b, &c, &c2, &explicit]
            .iter()
            .map(|s| s.fallback_share().unwrap())
            .collect();
        if got[..4].iter().all(|&x| x == 0.25) && got[4] == 0.3 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{got:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Without a local fallback there is no share.
    let open = RedisStore::builder("limit", limit())
        .failure_policy(FailurePolicy::FailOpen)
        .build(connect().await.unwrap())
        .unwrap();
    assert_eq!(open.fallback_share(), None);
    // Three instances go; the one left counts itself alone within a lease renewal.
    drop((b, c, c2, explicit));
    let start = Instant::now();
    while a.fallback_share() != Some(1.0) {
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two limits, the second the tighter: 20 a minute under a wide 1 000.
pub(crate) fn two_limits() -> tollgate::Policy {
    tollgate::Policy::from_limits([
        Limit::token_bucket(Quota::per_minute(1000).unwrap()).unwrap(),
        limit(),
    ])
    .unwrap()
}

/// Regression: a look at a key under another policy (the upstream layer's look for a
/// pause, under the pause alone) converted the key's fallback state to that policy, so
/// the limits it lacks started again from full: while Redis was away, a key out of its
/// 20 a minute was admitted again after one look. A look changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_under_another_policy_leaves_the_fallback_state_as_it_was() {
    use tollgate::store::Store;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = ManualClock::at(Duration::from_secs(1_700_000_000));
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let policy = two_limits();
    let store = RedisStore::builder("two", policy.clone())
        .clock(clock.clone())
        .failure_policy(FailurePolicy::LocalFallback { share: 1.0 })
        .build(conn)
        .unwrap();
    server.stop();
    let mut admitted = 0;
    for _ in 0..21 {
        let d = store.check("k", 1).await.unwrap();
        assert_eq!(d.source(), Source::Fallback);
        admitted += u32::from(d.is_allowed());
    }
    assert_eq!(admitted, 20);
    let wide =
        tollgate::Policy::new(Limit::token_bucket(Quota::per_minute(1000).unwrap()).unwrap());
    let look = Store::<&str>::preview(&store, &"k", &wide, 1)
        .await
        .unwrap();
    assert!(look.is_allowed(), "{look:?}");
    let d = store.check("k", 1).await.unwrap();
    assert!(
        !d.is_allowed(),
        "out of its 20 a minute after a look: {d:?}"
    );
    server.cont();
}

/// Regression: a ban Redis could not take was lost (the upstream layer's pause while Redis
/// is away paused nothing): it holds this instance's fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_while_redis_is_away_holds_the_fallback() {
    use tollgate::store::Store;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = ManualClock::at(Duration::from_secs(1_700_000_000));
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let policy = two_limits();
    let store = RedisStore::builder("two", policy.clone())
        .clock(clock.clone())
        .failure_policy(FailurePolicy::LocalFallback { share: 1.0 })
        .build(conn)
        .unwrap();
    server.stop();
    Store::<&str>::ban(&store, &"k", &policy, Duration::from_secs(30))
        .await
        .unwrap();
    let d = store.check("k", 1).await.unwrap();
    assert_eq!(d.source(), Source::Fallback);
    assert!(!d.is_allowed(), "banned for 30 s: {d:?}");
    clock.advance(Duration::from_secs(31));
    let d = store.check("k", 1).await.unwrap();
    assert!(d.is_allowed(), "the ban is over: {d:?}");
    server.cont();
}
