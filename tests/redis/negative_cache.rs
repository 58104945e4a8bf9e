//! A refused hot client makes no Redis call until its retry-after, on the store's clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::redis::RedisServer;
use tollgate::clock::ManualClock;
use tollgate::decision::Source;
use tollgate::store::{RedisConnection, RedisStore};
use tollgate::Limit;
use tollgate::Quota;

/// A manual clock at today's time, which the store decides on and runs its negative cache
/// on.
fn clock() -> ManualClock {
    ManualClock::at(SystemTime::now().duration_since(UNIX_EPOCH).unwrap())
}

#[tokio::test]
async fn refused_key_is_answered_locally_until_retry_after() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    // One unit every 400 ms, burst 2.
    let limit = Limit::token_bucket(
        Quota::new(1, Duration::from_millis(400))
            .unwrap()
            .with_burst(2)
            .unwrap(),
    )
    .unwrap();
    let clock = clock();
    let store = RedisStore::builder("limit", limit)
        .clock(clock.clone())
        .build(conn)
        .unwrap();
    let key = "hot-client";
    assert!(store.check(&key, 1).await.unwrap().is_allowed());
    assert!(store.check(&key, 1).await.unwrap().is_allowed());
    let refused = store.check(&key, 1).await.unwrap();
    assert_eq!(refused.source(), Source::Store);
    let retry = refused.retry_after().expect("refused");
    assert_eq!(retry, Duration::from_millis(400));
    let calls = server.calls("evalsha");
    assert!(calls >= 3);
    // A larger cost is refused locally too; a smaller one would still ask Redis.
    assert_eq!(
        store.check(&key, 2).await.unwrap().source(),
        Source::NegativeCache
    );

    // Every millisecond until 1 ns before the retry-after: no EVALSHA reaches Redis, and
    // each local answer counts the retry-after down exactly.
    for ms in 0..400u64 {
        let d = store.check(&key, 1).await.unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.source(), Source::NegativeCache);
        assert_eq!(
            d.retry_after(),
            Some(retry - Duration::from_millis(ms)),
            "at +{ms} ms"
        );
        clock.advance(Duration::from_millis(1));
    }
    assert_eq!(server.calls("evalsha"), calls, "400 refusals without Redis");

    // At the retry-after, Redis decides again and admits.
    let d = store.check(&key, 1).await.unwrap();
    assert_eq!(d.source(), Source::Store);
    assert!(d.is_allowed());
    assert_eq!(server.calls("evalsha"), calls + 1);
}

#[tokio::test]
async fn smaller_cost_and_refund_go_to_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let limit = Limit::token_bucket(
        Quota::new(1, Duration::from_secs(1))
            .unwrap()
            .with_burst(3)
            .unwrap(),
    )
    .unwrap();
    let store = RedisStore::builder("limit", limit)
        .clock(clock())
        .build(conn)
        .unwrap();
    let key = 7u32;
    assert!(store.check(&key, 2).await.unwrap().is_allowed());
    let refused = store.check(&key, 2).await.unwrap();
    assert!(!refused.is_allowed());
    // Cost 1 still fits: the cached refusal of cost 2 does not answer it.
    let d = store.check(&key, 1).await.unwrap();
    assert_eq!(d.source(), Source::Store);
    assert!(d.is_allowed());
    assert_eq!(
        store.check(&key, 2).await.unwrap().source(),
        Source::NegativeCache
    );
    // A refund forgets the cached refusal and gives the units back.
    store.refund_confirmed(&key, 3).await.unwrap();
    let d = store.check(&key, 2).await.unwrap();
    assert_eq!(d.source(), Source::Store);
    assert!(d.is_allowed());
}
