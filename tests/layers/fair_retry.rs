//! A fair-sharing refusal's wait is exact: the key asking again 1 ns before it is refused,
//! and at it admitted, when nothing else happened in between. Checked on random pools
//! (burst 1 included), shares, activity periods and demand through `FairLimitLayer` under
//! a manual clock, on `MemoryFair` and on `RedisFair` (which decides alike). Each
//! refusal's wait is read to the nanosecond from its gRPC `RetryInfo`. Beside it, what the
//! module docs say of pools of burst 1 and of which keys count as active.

use std::{convert::Infallible, time::Duration};

#[cfg(feature = "redis")]
use crate::support;
use axum::body::Body;
use http::{Request, Response};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::clock::ManualClock;
use tollgate::fair::{FairStore, MemoryFair, Share};
use tollgate::key::{Global, HeaderBytes, HeaderKey, KeyExtractor};
use tollgate::{FairLimitLayer, Quota};
use tonic_types::StatusExt as _;
use tower::{Service, ServiceBuilder, ServiceExt};

/// Start of the manual clock: a plausible time, in whole microseconds.
const T0: u64 = 1_700_000_000_000_000_000;
const MS: u64 = 1_000_000;

fn ns(n: u64) -> Duration {
    Duration::from_nanos(n)
}

/// A gRPC call of `key` (none: no key header).
fn call(key: Option<&str>) -> Request<Body> {
    let mut req = Request::builder().header("content-type", "application/grpc");
    if let Some(key) = key {
        req = req.header("x-api-key", key);
    }
    req.body(Body::empty()).unwrap()
}

/// The answer to one call: `None` when admitted, else the refusal's exact wait in ns.
async fn ask<S>(svc: &S, key: Option<&str>) -> Option<u64>
where
    S: Service<Request<Body>, Error = Infallible> + Clone,
    S::Response: HasHeaders,
{
    let res = svc.clone().oneshot(call(key)).await.unwrap();
    let status = tonic::Status::from_header_map(res.headers())?;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let info = status.get_details_retry_info().expect("a RetryInfo");
    let wait = info.retry_delay.expect("a retry delay");
    Some(u64::try_from(wait.as_nanos()).unwrap())
}

/// What [`ask`] reads of a response.
trait HasHeaders {
    fn headers(&self) -> &http::HeaderMap;
}

impl<B> HasHeaders for Response<B> {
    fn headers(&self) -> &http::HeaderMap {
        Response::headers(self)
    }
}

/// The layer `layer` in front of a handler that always answers.
fn service<X, St>(
    layer: FairLimitLayer<X, St>,
) -> impl Service<Request<Body>, Response = impl HasHeaders, Error = Infallible> + Clone
where
    X: KeyExtractor<Request<Body>> + Send + Sync + 'static,
    St: FairStore<X::Key>,
{
    ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) })
}

/// Regression: a pool of burst 1 never lends (it cannot keep half its burst), but a
/// refusal reported the wait until it could (149 ms here) when the share's own wait was
/// longer (199 ms), so a retry at the reported time was refused again.
#[tokio::test]
async fn a_pool_of_burst_1_reports_the_shares_wait_not_a_borrowing_that_never_comes() {
    let clock = ManualClock::at(ns(T0));
    let layer = FairLimitLayer::builder(
        Global::new(),
        Quota::per_second(10).unwrap().with_burst(1).unwrap(),
    )
    .share(
        Share::new(
            Quota::per_second(1).unwrap(),
            Quota::every(Duration::from_millis(200))
                .unwrap()
                .with_burst(10)
                .unwrap(),
        )
        .unwrap(),
    )
    .build_with(MemoryFair::new().with_clock(clock.clone()))
    .unwrap();
    let svc = service(layer);
    assert_eq!(ask(&svc, None).await, None);
    clock.advance(ns(MS));
    assert_eq!(ask(&svc, None).await, Some(199 * MS));
    clock.advance(ns(199 * MS - 1));
    assert_eq!(ask(&svc, None).await, Some(1));
    clock.advance(ns(1));
    assert_eq!(ask(&svc, None).await, None);
}

/// Greedy keys on a pool of 20 per second and burst 1, the keys named `small*` capped at
/// 5 per second, the others at 16: each key's rate over the last 10 of 12 s, per second.
/// They ask every 2.5 ms, a step that divides every interval here (with a burst of 1, a
/// request late on its interval loses the time).
async fn greedy_on_a_pool_of_burst_1(keys: &[&str]) -> Vec<f64> {
    let clock = ManualClock::at(ns(T0));
    let share = |ceiling| {
        Share::new(
            Quota::per_second(4).unwrap(),
            Quota::per_second(ceiling).unwrap(),
        )
        .unwrap()
    };
    let (small, big) = (share(5), share(16));
    let layer = FairLimitLayer::builder(
        HeaderKey::new("x-api-key").unwrap(),
        Quota::every(Duration::from_millis(50)).unwrap(),
    )
    .share_by(move |head| match head.headers().get("x-api-key") {
        Some(k) if k.as_bytes().starts_with(b"small") => small,
        _ => big,
    })
    .build_with(MemoryFair::new().with_clock(clock.clone()))
    .unwrap();
    let svc = service(layer);
    let mut admitted = vec![0u32; keys.len()];
    for tick in 0..12_000 * 2 / 5 {
        for (i, key) in keys.iter().enumerate() {
            if ask(&svc, Some(key)).await.is_none() && tick >= 2_000 * 2 / 5 {
                admitted[i] += 1;
            }
        }
        clock.advance(ns(5 * MS / 2));
    }
    admitted.iter().map(|&n| f64::from(n) / 10.0).collect()
}

/// A pool of burst 1 never lends: a key alone gets the pool up to its ceiling (16 of the
/// 20 per second), but beside a key held at its ceiling (5 per second) a greedy key
/// gets its share, half the pool, and the 5 per second the other leaves go to nobody
/// (on a pool of burst 20 it gets 15, see `fair.rs`).
#[tokio::test]
async fn a_pool_of_burst_1_gives_each_key_its_share_and_lends_nothing() {
    assert_eq!(greedy_on_a_pool_of_burst_1(&["big"]).await, [16.0]);
    assert_eq!(
        greedy_on_a_pool_of_burst_1(&["big", "small"]).await,
        [10.0, 5.0]
    );
}

/// A pool of `pool` with activity periods of `period` on a manual clock, every key
/// guaranteed 1 per second with no ceiling in the way (1000 per second).
fn guaranteed_1_per_second(
    pool: Quota,
    period: Duration,
) -> (
    ManualClock,
    impl Service<Request<Body>, Response = impl HasHeaders, Error = Infallible> + Clone,
) {
    let clock = ManualClock::at(ns(T0));
    let share = Share::new(
        Quota::per_second(1).unwrap(),
        Quota::per_second(1_000).unwrap(),
    )
    .unwrap();
    let layer = FairLimitLayer::builder(HeaderKey::new("x-api-key").unwrap(), pool)
        .share(share)
        .activity_period(period)
        .build_with(MemoryFair::new().with_clock(clock.clone()))
        .unwrap();
    (clock, service(layer))
}

/// A refusal's wait counts on the keys that stopped asking dropping out of the activity
/// count: four keys drain the pool in one activity period, a fifth asks in the next,
/// where the four still count; from the period after, it is alone and its share the
/// whole pool. Its share admits it again there (at 200 ms), before the pool has room
/// to lend (at 300 ms), and before its share of a fifth would (at 500 ms).
#[tokio::test]
async fn a_refusal_counts_on_keys_that_stopped_asking_dropping_out() {
    // 10 per second, burst 10 (1 s); 200 ms periods.
    let (clock, svc) =
        guaranteed_1_per_second(Quota::per_second(10).unwrap(), Duration::from_millis(200));
    // Alone, `b1` sends half the pool's burst at its share; then one each at their
    // share of 2, 3 and 4 keys: the pool is 800 ms full.
    for key in ["b1", "b1", "b1", "b1", "b1", "b2", "b3", "b4"] {
        assert_eq!(ask(&svc, Some(key)).await, None, "{key}");
    }
    assert!(ask(&svc, Some("b1")).await.is_some());
    clock.advance(ns(200 * MS));
    // The next period: `a`'s share is a fifth of the pool (one per 500 ms).
    assert_eq!(ask(&svc, Some("a")).await, None);
    assert_eq!(ask(&svc, Some("a")).await, Some(200 * MS));
    clock.advance(ns(200 * MS - 1));
    assert_eq!(ask(&svc, Some("a")).await, Some(1));
    clock.advance(ns(1));
    assert_eq!(ask(&svc, Some("a")).await, None);
}

/// Who counts as active, as the module docs say: a key that asked only in the previous
/// period is not counted once the keys asking in this one weigh more. On a pool of burst
/// 1 a key's wait is its share's fill, so its share shows in it: `a` asks in one period,
/// `c` and `b` in the next, and `b`'s share is half the pool (a wait of 200 ms), not a
/// third (300 ms).
#[tokio::test]
async fn a_key_seen_only_in_the_previous_period_drops_out_when_outweighed() {
    let (clock, svc) = guaranteed_1_per_second(
        Quota::per_second(10).unwrap().with_burst(1).unwrap(),
        Duration::from_secs(1),
    );
    assert_eq!(ask(&svc, Some("a")).await, None);
    clock.advance(ns(1_000 * MS));
    assert_eq!(ask(&svc, Some("c")).await, None);
    clock.advance(ns(100 * MS));
    assert_eq!(ask(&svc, Some("b")).await, None);
    assert_eq!(ask(&svc, Some("b")).await, Some(200 * MS));
}

/// A pool, the shares of its keys, its activity period, and the demand.
#[derive(Clone, Debug)]
struct Scenario {
    pool: Quota,
    /// Key `k{i}` has share `shares[i % shares.len()]`.
    shares: Vec<Share>,
    period: Duration,
    /// Each call: its key, the time since the call before (ns), and whether a refusal
    /// is checked by asking again 1 ns before its wait and at it.
    calls: Vec<(usize, u64, bool)>,
}

/// Random scenarios. With `grid`, every interval, wait and time falls on whole
/// microseconds, the resolution of the Redis store's clock: pool intervals are whole
/// multiples of 20 µs and guaranteed intervals divide 1 s into at most 20, so a share's
/// interval (the pool's scaled by the active weights over the key's) is whole too.
fn scenario(grid: bool) -> impl Strategy<Value = Scenario> {
    let pool_t = if grid {
        (1u64..=5_000).prop_map(|k| k * 20_000).boxed()
    } else {
        (1_000u64..=100 * MS).boxed()
    };
    let burst = prop_oneof![2 => Just(1u64), 3 => 2u64..=12];
    let pool =
        (pool_t, burst).prop_map(|(t, b)| Quota::every(ns(t)).unwrap().with_burst(b).unwrap());
    let guaranteed_t = if grid {
        prop::sample::select(vec![
            1_000 * MS,
            500 * MS,
            250 * MS,
            200 * MS,
            100 * MS,
            50 * MS,
        ])
        .boxed()
    } else {
        (MS..=1_000 * MS).boxed()
    };
    let share = (guaranteed_t, 1u64..=1_000, 1u64..=12).prop_map(move |(g, part, burst)| {
        // The ceiling's interval: a part of the guaranteed one (a rate at least as high).
        let mut c = (g * part / 1_000).max(1);
        if grid {
            c = (c / 1_000).max(1) * 1_000;
        }
        let ceiling = Quota::every(ns(c)).unwrap().with_burst(burst).unwrap();
        Share::new(Quota::every(ns(g)).unwrap(), ceiling).unwrap()
    });
    let shares = prop::collection::vec(share, 1..=3);
    let period = (1_000u64..=50_000).prop_map(Duration::from_micros);
    let gap = prop_oneof![
        3 => Just(0u64),
        4 => 0..2 * MS,
        2 => 0..200 * MS,
        1 => 0..3_000 * MS,
    ]
    .prop_map(move |g| if grid { g / 1_000 * 1_000 } else { g });
    let calls = (1usize..=5).prop_flat_map(move |keys| {
        prop::collection::vec((0..keys, gap.clone(), any::<bool>()), 1..150)
    });
    (pool, shares, period, calls).prop_map(|(pool, shares, period, calls)| Scenario {
        pool,
        shares,
        period,
        calls,
    })
}

/// Runs `s` on `store` under `clock`, checking every probed refusal; returns each call's
/// answer (the probes' not included).
async fn run<St: FairStore<HeaderBytes>>(
    s: &Scenario,
    store: St,
    clock: &ManualClock,
) -> Result<Vec<Option<u64>>, TestCaseError> {
    let shares = s.shares.clone();
    let layer = FairLimitLayer::builder(HeaderKey::new("x-api-key").unwrap(), s.pool)
        .share_by(move |head| {
            let name = head.headers()["x-api-key"].as_bytes();
            shares[usize::from(name[1] - b'0') % shares.len()]
        })
        .activity_period(s.period)
        .build_with(store)
        .unwrap();
    let svc = service(layer);
    let mut answers = Vec::new();
    for (i, &(key, gap, probe)) in s.calls.iter().enumerate() {
        clock.advance(ns(gap));
        let key = format!("k{key}");
        let answer = ask(&svc, Some(&key)).await;
        answers.push(answer);
        let Some(wait) = answer.filter(|_| probe) else {
            continue;
        };
        prop_assert!(wait > 0, "call {i}: refused with a wait of 0");
        clock.advance(ns(wait - 1));
        prop_assert!(
            ask(&svc, Some(&key)).await.is_some(),
            "call {i}: admitted 1 ns before its wait of {wait} ns"
        );
        clock.advance(ns(1));
        let again = ask(&svc, Some(&key)).await;
        prop_assert_eq!(
            again,
            None,
            "call {}: refused at its wait of {} ns",
            i,
            wait
        );
    }
    Ok(answers)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn every_refusal_reports_its_exact_wait_in_memory() {
    let rt = runtime();
    let mut runner = TestRunner::new(Config::with_cases(512));
    runner
        .run(&scenario(false), |s| {
            rt.block_on(async {
                let clock = ManualClock::at(ns(T0));
                run(&s, MemoryFair::new().with_clock(clock.clone()), &clock).await?;
                Ok(())
            })
        })
        .unwrap();
}

/// The same scenarios on Redis: the same answer to every call as in memory, and every
/// probed refusal exact there too.
#[cfg(feature = "redis")]
#[test]
fn every_refusal_reports_its_exact_wait_on_redis_as_in_memory() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use tollgate::fair::RedisFair;
    use tollgate::store::RedisConnection;

    let Some(target) = support::redis::Target::get() else {
        return;
    };
    let url = target.url();
    let rt = runtime();
    let conn = rt.block_on(RedisConnection::connect(&url)).unwrap();
    static N: AtomicU32 = AtomicU32::new(0);
    let mut runner = TestRunner::new(Config::with_cases(64));
    runner
        .run(&scenario(true), |s| {
            rt.block_on(async {
                let clock = ManualClock::at(ns(T0));
                let on_memory =
                    run(&s, MemoryFair::new().with_clock(clock.clone()), &clock).await?;
                let clock = ManualClock::at(ns(T0));
                let store = RedisFair::builder("limit")
                    .namespace(format!(
                        "fair-retry-{}-{}",
                        std::process::id(),
                        N.fetch_add(1, Ordering::Relaxed)
                    ))
                    .deadline(Duration::from_secs(5))
                    .clock(clock.clone())
                    .build(conn.clone())
                    .unwrap();
                let on_redis = run(&s, store, &clock).await?;
                prop_assert_eq!(on_memory, on_redis);
                Ok(())
            })
        })
        .unwrap();
}
