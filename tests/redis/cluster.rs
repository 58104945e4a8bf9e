//! The same semantics through a 3-node Redis Cluster: equivalence with the in-memory
//! store, TTL, several limits in one slot-safe key, clients spread over the shards.

use std::{collections::HashSet, time::Duration};

use crate::support::equiv;
use crate::support::redis::{stored_words, RedisCluster};
use equiv::{compare, compare_concurrent, ops_strategy, policies_strategy};
use proptest::test_runner::{Config, TestRunner};
use redis::AsyncCommands;
use tollgate::decision::Source;
use tollgate::store::{RedisConnection, RedisStore};
use tollgate::Limit;
use tollgate::Policy;
use tollgate::Quota;

#[test]
fn semantics_through_a_cluster() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let conn = rt
        .block_on(RedisConnection::connect_cluster(cluster.urls()))
        .unwrap();

    // Equivalence on random sequences.
    let mut runner = TestRunner::new(Config {
        cases: 24,
        ..Config::default()
    });
    runner
        .run(
            &(
                policies_strategy(),
                ops_strategy(),
                1_750_000_000_000_000u64..1_760_000_000_000_000u64,
            ),
            |(policies, ops, start)| rt.block_on(compare(&conn, &policies, start, &ops)),
        )
        .unwrap();
    // Requests in flight together, batched per node, decide as they would one by one.
    runner
        .run(
            &(
                policies_strategy(),
                ops_strategy(),
                1_750_000_000_000_000u64..1_760_000_000_000_000u64,
            ),
            |(policies, ops, start)| {
                rt.block_on(compare_concurrent(&conn, &policies, start, &ops, 16))
            },
        )
        .unwrap();

    rt.block_on(async {
        let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
        let mut admin = client.get_async_connection().await.unwrap();

        // Several limits, one key, TTL = time to fresh.
        let policy = Policy::new(
            Limit::token_bucket(Quota::per_second(10).unwrap().with_burst(5).unwrap()).unwrap(),
        )
        .and(Limit::fixed_window(Quota::per_minute(100).unwrap()).unwrap())
        .unwrap();
        let store = RedisStore::builder("limit", policy)
            .build(conn.clone())
            .unwrap();
        let mut slots = HashSet::new();
        for i in 0..40 {
            let key = format!("cluster-client-{i}");
            let d = store.check(&key, 2).await.unwrap();
            assert_eq!(d.source(), Source::Store);
            assert!(d.is_allowed());
            let rkey = store.redis_key(key.as_str());
            let raw: Vec<u8> = admin.get(&rkey).await.unwrap();
            let words = stored_words(&raw);
            // Write time; the bucket's descriptor (T, cap) and fill; the window's descriptor
            // (kind and length, limit), end and count.
            assert_eq!(words.len(), 8, "{raw:?}");
            assert_eq!(words[1], 100_000_000, "T");
            assert_eq!(words[3], 200_000_000, "fill of 2 units at 100 ms each");
            assert_eq!(words[7], 2);
            let pttl: i64 = admin.pttl(&rkey).await.unwrap();
            let expect = d.reset_after().as_nanos().div_ceil(1_000_000) as i64;
            assert!(
                (expect - 50..=expect).contains(&pttl),
                "PTTL {pttl} vs {expect}"
            );
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&rkey)
                .query_async(&mut admin)
                .await
                .unwrap();
            slots.insert(slot);
        }
        assert!(
            slots.len() > 30,
            "clients spread over slots: {}",
            slots.len()
        );

        // Exhaust one client through the cluster; a refusal writes nothing.
        let key = "cluster-hot";
        while store.check(&key, 1).await.unwrap().is_allowed() {}
        let d = store.peek(&key, 1).await.unwrap();
        assert!(!d.is_allowed());
        assert!(d.retry_after().unwrap() <= Duration::from_millis(100));

        // Fair sharing through the cluster: the pool and its keys carry one hash tag, so
        // one script call decides both on one shard, exactly as in memory.
        fair_through_the_cluster(&conn).await;
    });
}

async fn fair_through_the_cluster(conn: &RedisConnection) {
    use std::convert::Infallible;

    use axum::body::Body;
    use http::{Request, Response};
    use tollgate::clock::ManualClock;
    use tollgate::fair::{FairStore, MemoryFair, RedisFair, Share};
    use tollgate::key::{HeaderBytes, HeaderKey};
    use tollgate::FairLimitLayer;
    use tower::{ServiceBuilder, ServiceExt};

    async fn statuses<St: FairStore<HeaderBytes>>(store: St, clock: &ManualClock) -> Vec<u16> {
        let layer = FairLimitLayer::builder(
            HeaderKey::new("x-api-key").unwrap(),
            Quota::per_second(20).unwrap(),
        )
        .share(
            Share::new(
                Quota::per_second(4).unwrap(),
                Quota::per_second(16).unwrap(),
            )
            .unwrap(),
        )
        .build_with(store)
        .unwrap();
        let svc = ServiceBuilder::new()
            .layer(layer)
            .service_fn(|_: Request<Body>| async {
                Ok::<_, Infallible>(Response::new(Body::empty()))
            });
        let mut out = Vec::new();
        for _ in 0..400 {
            for key in ["a", "b", "c"] {
                let req = Request::builder()
                    .header("x-api-key", key)
                    .body(Body::empty())
                    .unwrap();
                out.push(svc.clone().oneshot(req).await.unwrap().status().as_u16());
            }
            clock.advance(Duration::from_millis(5));
        }
        out
    }

    let start = Duration::from_secs(1_750_000_000);
    let clock = ManualClock::at(start);
    let on_memory = statuses(MemoryFair::new().with_clock(clock.clone()), &clock).await;
    let clock = ManualClock::at(start);
    let store = RedisFair::builder("limit")
        .namespace("cluster-fair")
        .deadline(Duration::from_secs(5))
        .clock(clock.clone())
        .build(conn.clone())
        .unwrap();
    let on_cluster = statuses(store, &clock).await;
    assert_eq!(on_memory, on_cluster);
    assert!(on_cluster.contains(&429) && on_cluster.contains(&200));
}

/// Regression: a cluster connection never batched (batching was for single nodes), so a
/// fleet that outgrew one Redis was decided one call per request. Concurrent requests on
/// keys all over the slots now go out as one call per node and batch, each key decided
/// exactly (a burst of 2: two of its three requests admitted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_batch_per_node() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let conn = RedisConnection::connect_cluster(cluster.urls())
        .await
        .unwrap();
    let limit = Limit::token_bucket(Quota::per_minute(2).unwrap()).unwrap();
    let store = RedisStore::builder("batched", limit).build(conn).unwrap();
    let calls = |c: &RedisCluster| c.nodes.iter().map(|n| n.calls("evalsha")).sum::<u64>();
    // The first request has no slot map yet: it goes alone, and asks for the map.
    store.check("warm", 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = calls(&cluster);
    let keys = 600;
    let mut tasks = Vec::new();
    for t in 0..64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut admitted = std::collections::HashMap::new();
            for round in 0..3 {
                for k in (t..keys).step_by(64) {
                    let d = store.check(&format!("k{k}"), 1).await.unwrap();
                    assert_eq!(d.source(), Source::Store, "round {round}");
                    *admitted.entry(k).or_insert(0) += u32::from(d.is_allowed());
                }
            }
            admitted
        }));
    }
    let mut per_key = std::collections::HashMap::new();
    for t in tasks {
        per_key.extend(t.await.unwrap());
    }
    let sent = calls(&cluster) - before;
    eprintln!("cluster: {} requests in {sent} script calls", keys * 3);
    assert_eq!(per_key.len(), keys);
    assert!(
        per_key.values().all(|&n| n == 2),
        "each key's burst exactly"
    );
    assert!(
        sent < (keys * 3) as u64 / 2,
        "{sent} script calls for {} requests",
        keys * 3
    );
}
