//! Local-first mode: two instances deciding locally and reconciling with Redis every
//! 100 ms stay within the documented overshoot bound; with Redis gone each keeps limiting
//! on its own.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::support::redis::RedisServer;
use tollgate::decision::Source;
use tollgate::store::{LocalFirstStore, RedisConnection, RedisStore, Store};
use tollgate::Limit;
use tollgate::Quota;

const RATE: u64 = 100;
const BURST: u64 = 20;
const INTERVAL: Duration = Duration::from_millis(100);

async fn hammer(stores: &[LocalFirstStore], key: &str, dur: Duration) -> Vec<u64> {
    let counts: Vec<Arc<AtomicU64>> = stores.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let end = Instant::now() + dur;
    let mut tasks = Vec::new();
    for (store, count) in stores.iter().zip(&counts) {
        for _ in 0..4 {
            let (store, count, key) = (store.clone(), count.clone(), key.to_string());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let d = store.check_local(&key, 1);
                    assert_eq!(d.source(), Source::Local);
                    if d.is_allowed() {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_micros(500)).await;
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_stay_within_the_bound_and_limit_alone_without_redis() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let limit =
        Limit::token_bucket(Quota::per_second(RATE).unwrap().with_burst(BURST).unwrap()).unwrap();
    let mut stores = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let conn = RedisConnection::connect(&server.url()).await.unwrap();
        let s = LocalFirstStore::new("limit", limit.clone(), conn, INTERVAL).unwrap();
        assert!(s.start(), "starts inside a runtime");
        assert!(!s.start(), "started once");
        tasks.push(s.clone());
        stores.push(s);
    }
    let calls_before = server.calls("evalsha");

    // Redis reachable: 5 s of both instances hammering one key.
    let d = Duration::from_secs(5);
    let start = Instant::now();
    let per = hammer(&stores, "shared", d).await;
    let elapsed = start.elapsed().as_secs_f64();
    let total: u64 = per.iter().sum();
    let n = stores.len() as f64;
    // Documented: b + r*D + N*(b + r*(interval + latency)); latency taken as one interval.
    let bound = BURST as f64
        + RATE as f64 * elapsed
        + n * (BURST as f64 + RATE as f64 * 2.0 * INTERVAL.as_secs_f64());
    let exact = BURST as f64 + RATE as f64 * elapsed;
    let syncs = server.calls("evalsha") - calls_before;
    eprintln!(
        "local-first: admitted {per:?} = {total} over {elapsed:.2} s; exact limit {exact:.0}, \
         overshoot {:.1} ({:.1}%), bound {bound:.0}; {syncs} sync calls",
        total as f64 - exact,
        100.0 * (total as f64 - exact) / exact
    );
    assert!((total as f64) <= bound, "{total} > bound {bound}");
    assert!(
        total as f64 >= 0.9 * RATE as f64 * elapsed,
        "limited far below the rate: {total}"
    );
    assert!(per.iter().all(|&c| c > 0));
    assert!(
        syncs > 0 && syncs < 2 * 60,
        "{syncs} sync calls: one per key per interval per instance"
    );

    // Redis gone: each instance keeps limiting on its own, at most its burst plus the rate.
    server.kill();
    let d = Duration::from_secs(1);
    let per = hammer(&stores, "alone", d).await;
    let cap = (BURST + RATE) as f64 * 1.1;
    eprintln!("local-first without Redis: admitted {per:?} in 1 s each (cap {cap:.0} each)");
    for &c in &per {
        assert!(c as f64 <= cap && c >= BURST, "{c}");
    }
    for s in &stores {
        let (rounds, failed) = s.sync_stats();
        assert!(rounds > 0 && failed > 0, "{rounds} rounds, {failed} failed");
    }
    for t in tasks {
        t.stop();
    }
}

/// A private server, a runtime that is not entered, and a connection made through it.
fn connected() -> Option<(RedisServer, tokio::runtime::Runtime, RedisConnection)> {
    let server = RedisServer::start()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let conn = rt
        .block_on(RedisConnection::connect(&server.url()))
        .unwrap();
    Some((server, rt, conn))
}

#[test]
fn no_runtime_no_panic() {
    // Built and used outside any runtime: decisions still work, nothing is spawned.
    let Some((server, rt, conn)) = connected() else {
        return;
    };
    let limit = Limit::token_bucket(Quota::per_second(2).unwrap()).unwrap();
    let store = LocalFirstStore::new("limit", limit, conn, INTERVAL).unwrap();
    assert!(!store.start());
    assert!(store.check_local("k", 1).is_allowed());
    assert!(store.check_local("k", 1).is_allowed());
    assert!(!store.check_local("k", 1).is_allowed());
    // One explicit round pushes the 2 units; a second instance then sees them.
    let n = rt.block_on(store.sync()).unwrap();
    assert_eq!(n, 1);
    let conn2 = rt
        .block_on(RedisConnection::connect(&server.url()))
        .unwrap();
    let other = LocalFirstStore::new("limit", store.policy().clone(), conn2, INTERVAL).unwrap();
    let _ = other.check_local("k", 0);
    rt.block_on(other.sync()).unwrap();
    assert!(
        !other.check_local("k", 1).is_allowed(),
        "the other instance pulled the shared state"
    );
}

#[test]
fn a_flood_of_distinct_keys_stays_within_the_memory_budget() {
    let Some((_server, _rt, conn)) = connected() else {
        return;
    };
    // An hour to refill: no key ever goes back to fresh, so only the cap bounds memory.
    let limit = Limit::token_bucket(Quota::per_hour(10).unwrap()).unwrap();
    let budget = 2 << 20;
    let store = RedisStore::builder("limit", limit)
        .max_bytes(budget)
        .build_local_first(conn, INTERVAL)
        .unwrap();
    for k in 0..200_000u64 {
        assert!(store.check_local(&k, 1).is_allowed());
    }
    assert!(store.bytes() <= budget, "{} bytes held", store.bytes());
    assert!(store.len() > 4_000, "{} keys held", store.len());
    // Nothing was synced, so every evicted key dropped its one unit, and that is counted.
    assert_eq!(store.evicted_units() as usize, 200_000 - store.len());
}

/// Regression: the local-first store read `Instant` itself. It now runs on the store's
/// clock: here a manual one, which the syncs also send to the script as the time.
#[test]
fn local_first_runs_on_the_store_clock() {
    use tollgate::clock::ManualClock;
    let Some((_server, rt, conn)) = connected() else {
        return;
    };
    let clock = ManualClock::at(Duration::from_secs(1_750_000_000));
    let limit = Limit::token_bucket(Quota::per_second(2).unwrap()).unwrap();
    let build = |conn| {
        RedisStore::builder("limit", limit.clone())
            .namespace("lf-clock")
            .clock(clock.clone())
            // Clocks, not latency: a loaded machine must not fail a sync.
            .deadline(Duration::from_secs(5))
            .build_local_first(conn, INTERVAL)
            .unwrap()
    };
    let a = build(conn.clone());
    assert!(a.check_local("k", 1).is_allowed());
    assert!(a.check_local("k", 1).is_allowed());
    let refused = a.check_local("k", 1);
    assert_eq!(refused.retry_after(), Some(Duration::from_millis(500)));
    // Pushed at the instant they were admitted: the shared state is exactly a's.
    rt.block_on(a.sync()).unwrap();
    clock.advance(Duration::from_millis(499));
    assert_eq!(
        a.check_local("k", 1).retry_after(),
        Some(Duration::from_millis(1))
    );
    // Another instance sees the shared state exactly, on the same clock.
    let b = build(conn);
    let _ = b.check_local("k", 0);
    rt.block_on(b.sync()).unwrap();
    assert_eq!(
        b.check_local("k", 1).retry_after(),
        Some(Duration::from_millis(1))
    );
    clock.advance(Duration::from_millis(1));
    assert!(b.check_local("k", 1).is_allowed());
}

#[test]
fn settles_bans_and_resets_apply_here_at_once_and_reach_redis() {
    let Some((server, rt, conn)) = connected() else {
        return;
    };
    let limit = Limit::token_bucket(Quota::per_hour(10).unwrap()).unwrap();
    let store = LocalFirstStore::new("limit", limit, conn, INTERVAL).unwrap();
    let policy = store.policy().clone();
    let key = "settled".to_string();
    let peek = |s: &LocalFirstStore, cost: u64| {
        rt.block_on(Store::preview(s, &key, &policy, cost)).unwrap()
    };
    let remaining = |s: &LocalFirstStore| peek(s, 0).limits()[0].remaining();
    // Reserved 5, used 1: 4 back. Reserved 1, used 4: 3 more.
    assert!(store.check_local(&key, 5).is_allowed());
    rt.block_on(Store::settle(&store, &key, &policy, 5, 1))
        .unwrap();
    assert_eq!(remaining(&store), 9);
    rt.block_on(Store::settle(&store, &key, &policy, 1, 4))
        .unwrap();
    assert_eq!(remaining(&store), 6);
    // Pushed to Redis with the next round: another instance sees 4 spent.
    rt.block_on(store.sync()).unwrap();
    let conn2 = rt
        .block_on(RedisConnection::connect(&server.url()))
        .unwrap();
    let other = LocalFirstStore::new("limit", policy.clone(), conn2, INTERVAL).unwrap();
    let _ = other.check_local(&key, 0);
    rt.block_on(other.sync()).unwrap();
    assert_eq!(remaining(&other), 6);
    // A ban: here at once, and in Redis for the other instance's next round.
    rt.block_on(Store::ban(&store, &key, &policy, Duration::from_secs(7200)))
        .unwrap();
    assert!(peek(&store, 1).retry_after() > Some(Duration::from_secs(7000)));
    let _ = other.check_local(&key, 0);
    rt.block_on(other.sync()).unwrap();
    assert!(peek(&other, 1).retry_after() > Some(Duration::from_secs(7000)));
    // A reset: gone here and in Redis.
    rt.block_on(Store::reset(&store, &key)).unwrap();
    assert_eq!(remaining(&store), 10);
    let _ = other.check_local(&key, 0);
    rt.block_on(other.sync()).unwrap();
    assert_eq!(remaining(&other), 10);
}

/// Regression: a look at a key under another policy converted the key's local state to
/// that policy (a key out of its 20 a minute, under a policy of two limits, was admitted
/// again after a look under the wide one alone), and a look at a key not held made it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_changes_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let policy = crate::fallback::two_limits();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let store = LocalFirstStore::new("look", policy.clone(), conn, INTERVAL).unwrap();
    let admitted = (0..21)
        .filter(|_| store.check_local("k", 1).is_allowed())
        .count();
    assert_eq!(admitted, 20);
    let wide = tollgate::Policy::new(policy.limits()[0].clone());
    let look = Store::<&str>::preview(&store, &"k", &wide, 1)
        .await
        .unwrap();
    assert!(look.is_allowed(), "{look:?}");
    let d = store.check_local("k", 1);
    assert!(
        !d.is_allowed(),
        "out of its 20 a minute after a look: {d:?}"
    );
    let held = store.len();
    Store::<&str>::preview(&store, &"other", &wide, 1)
        .await
        .unwrap();
    assert_eq!(store.len(), held, "a look at a key not held holds it");
}
