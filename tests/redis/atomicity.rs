//! Two connections x 64 tasks on one key for 2 s admit no more than `burst + elapsed *
//! rate` (elapsed on the Redis server's clock) and at least 95% of it.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::support::redis::Target;
use tollgate::decision::Source;
use tollgate::store::{RedisConnection, RedisStore};
use tollgate::Limit;
use tollgate::Quota;

async fn server_us(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(con).await.unwrap();
    s * 1_000_000 + us
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_never_over_admit() {
    let Some(target) = Target::get() else { return };
    let (rate, burst) = (500u64, 50u64);
    let limit =
        Limit::token_bucket(Quota::per_second(rate).unwrap().with_burst(burst).unwrap()).unwrap();
    let mut stores = Vec::new();
    for _ in 0..2 {
        let conn = RedisConnection::connect(&target.url()).await.unwrap();
        // A generous deadline: this test is about the script's atomicity, not latency.
        let store = RedisStore::builder("limit", limit.clone())
            .namespace("atomicity")
            .deadline(Duration::from_secs(2))
            .build(conn)
            .unwrap();
        stores.push(store);
    }
    let mut admin = redis::Client::open(target.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = format!("hot-{}", std::process::id());
    let admitted = Arc::new(AtomicU64::new(0));
    let other = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let t_start = server_us(&mut admin).await;
    let end = Instant::now() + Duration::from_secs(2);
    let mut tasks = Vec::new();
    for store in &stores {
        for _ in 0..64 {
            let (store, key) = (store.clone(), key.clone());
            let (admitted, other, calls) = (admitted.clone(), other.clone(), calls.clone());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let d = store.check(&key, 1).await.unwrap();
                    calls.fetch_add(1, Ordering::Relaxed);
                    match d.source() {
                        Source::Store | Source::NegativeCache => {
                            if d.is_allowed() {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        _ => {
                            other.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if d.source() == Source::NegativeCache {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let t_end = server_us(&mut admin).await;
    let elapsed = (t_end - t_start) as f64 / 1e6;
    let bound = burst as f64 + elapsed * rate as f64;
    let admitted = admitted.load(Ordering::Relaxed);
    let ratio = admitted as f64 / bound;
    eprintln!(
        "atomicity: admitted {admitted} of bound {bound:.1} (ratio {ratio:.4}) over {elapsed:.3} s server time; \
         {} decisions, {} not from the store",
        calls.load(Ordering::Relaxed),
        other.load(Ordering::Relaxed)
    );
    assert_eq!(
        other.load(Ordering::Relaxed),
        0,
        "every decision came from Redis"
    );
    assert!(
        admitted as f64 <= bound,
        "over-admitted: {admitted} > {bound}"
    );
    assert!(ratio >= 0.95, "under-admitted: {admitted} < 95% of {bound}");
}
