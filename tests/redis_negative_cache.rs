//! A refused hot client makes no Redis call until its retry-after.
#![cfg(feature = "redis")]

#[path = "support/redis.rs"]
mod redis_support;

use std::time::{Duration, Instant};

use redis_support::RedisServer;
use tollgate::{
    store::{RedisConnection, RedisStore, Store},
    Limit, Quota, Source,
};

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
    let store = RedisStore::new(limit, conn).unwrap();
    let key = "hot-client";
    assert!(store.check(&key, 1).await.unwrap().is_allowed());
    assert!(store.check(&key, 1).await.unwrap().is_allowed());
    let refused = store.check(&key, 1).await.unwrap();
    assert_eq!(refused.source(), Source::Store);
    let retry = refused.retry_after().expect("refused");
    let refused_at = Instant::now();
    let calls = server.calls("evalsha");
    assert!(calls >= 3);

    // Hammer it until just before the retry-after: no EVALSHA reaches Redis.
    let mut local = 0;
    while refused_at.elapsed() + Duration::from_millis(30) < retry {
        let d = store.check(&key, 1).await.unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.source(), Source::NegativeCache);
        let left = d.retry_after().unwrap();
        assert!(left <= retry && left + refused_at.elapsed() >= retry - Duration::from_millis(5));
        local += 1;
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    assert_eq!(
        server.calls("evalsha"),
        calls,
        "the cache answered {local} refusals without Redis"
    );
    // A larger cost is refused locally too; a smaller one would still ask Redis.
    assert_eq!(
        store.check(&key, 2).await.unwrap().source(),
        Source::NegativeCache
    );
    eprintln!("negative cache: {local} refusals answered locally, 0 Redis calls");

    // Past the retry-after, Redis decides again and admits.
    tokio::time::sleep(retry.saturating_sub(refused_at.elapsed()) + Duration::from_millis(5)).await;
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
    let store = RedisStore::new(limit, conn).unwrap();
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
    Store::refund(&store, &key, 3);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let d = store.check(&key, 2).await.unwrap();
    assert_eq!(d.source(), Source::Store);
    assert!(d.is_allowed());
}
