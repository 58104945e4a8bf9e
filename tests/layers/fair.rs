//! Fair sharing with borrowing (`FairLimitLayer`), under a manual clock: greedy keys
//! alone, within the pool's guarantees and oversubscribing it, on the memory store and
//! on Redis, through the layer's public API.

use std::{convert::Infallible, time::Duration};

use axum::body::Body;
use http::{Request, Response};
use tollgate::clock::ManualClock;
use tollgate::fair::{FairStore, MemoryFair, Share};
use tollgate::key::{HeaderBytes, HeaderKey};
use tollgate::FairLimitLayer;
use tollgate::Quota;
use tower::{Service, ServiceBuilder, ServiceExt};

const SEC: u64 = 1_000_000_000;
/// The greedy keys ask every 5 ms: 200 per second each, above any ceiling here.
const TICK: u64 = 5_000_000;
/// Decisions are counted from 2 s on (after the first bursts) for 10 s.
const FROM: u64 = 2 * SEC;
const SECS: u64 = 10;
/// Start of the manual clock: a plausible time, in whole microseconds.
const T0: u64 = 1_700_000_000 * SEC;

fn share(guaranteed: u64, ceiling: u64) -> Share {
    Share::new(
        Quota::per_second(guaranteed).unwrap(),
        Quota::per_second(ceiling).unwrap(),
    )
    .unwrap()
}

/// The demo's pool: 20 per second, burst 20; keys named `big*` get `big`, the others
/// `small`.
fn layer<St: FairStore<HeaderBytes>>(
    store: St,
    small: Share,
    big: Share,
) -> FairLimitLayer<HeaderKey, St> {
    FairLimitLayer::builder(
        HeaderKey::new("x-api-key").unwrap(),
        Quota::per_second(20).unwrap().with_burst(20).unwrap(),
    )
    .share_by(move |head| match head.headers().get("x-api-key") {
        Some(k) if k.as_bytes().starts_with(b"big") => big,
        _ => small,
    })
    .build_with(store)
    .unwrap()
}

fn service<St: FairStore<HeaderBytes>>(
    layer: FairLimitLayer<HeaderKey, St>,
) -> impl Service<
    Request<Body>,
    Response = Response<tollgate::response::RateLimitBody<Body>>,
    Error = Infallible,
> + Clone {
    ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) })
}

fn request(key: &str) -> Request<Body> {
    Request::builder()
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap()
}

/// What a run admitted: (time since start in ns, key index), in order.
struct Run {
    admitted: Vec<(u64, usize)>,
    statuses: Vec<u16>,
}

impl Run {
    /// Admissions of key `i` in the measured window, per second.
    fn rate(&self, i: usize) -> f64 {
        let n = self
            .admitted
            .iter()
            .filter(|&&(t, k)| k == i && (FROM..FROM + SECS * SEC).contains(&t))
            .count();
        n as f64 / SECS as f64
    }

    /// The pool's bound, checked from outside: every admission conforms to a token bucket
    /// of 20 per second and burst 20 (a GCRA meter fed every admission).
    fn assert_pool_never_exceeded(&self) {
        let (t, cap) = (SEC / 20, 20 * (SEC / 20));
        let mut tat = 0u64;
        for &(at, _) in &self.admitted {
            tat = tat.max(at) + t;
            assert!(
                tat - at <= cap,
                "the pool admitted past its rate plus burst at {at} ns"
            );
        }
    }
}

/// Every key asks once per tick, in an order rotated every tick, for 2 s + 10 s + 1 tick.
async fn greedy<St: FairStore<HeaderBytes>>(
    keys: &[&str],
    store: St,
    clock: &ManualClock,
    small: Share,
    big: Share,
) -> Run {
    let svc = service(layer(store, small, big));
    let mut run = Run {
        admitted: Vec::new(),
        statuses: Vec::new(),
    };
    let mut elapsed = 0;
    let mut turn = 0;
    while elapsed <= FROM + SECS * SEC {
        for j in 0..keys.len() {
            let i = (turn + j) % keys.len();
            let res = svc.clone().oneshot(request(keys[i])).await.unwrap();
            let status = res.status().as_u16();
            if status == 200 {
                run.admitted.push((elapsed, i));
            }
            run.statuses.push(status);
        }
        turn += 1;
        clock.advance(Duration::from_nanos(TICK));
        elapsed += TICK;
    }
    run
}

fn memory(clock: &ManualClock) -> MemoryFair<HeaderBytes, ManualClock> {
    MemoryFair::new().with_clock(clock.clone())
}

fn clock() -> ManualClock {
    ManualClock::at(Duration::from_nanos(T0))
}

/// Whether `got` (per second over the measured 10 s) is within the measured tolerance
/// of `want`: one request over the window, which is what counting whole requests
/// allows (5/3 per second is 16.7 requests in 10 s); every run here lands within it.
fn near(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1.0 / SECS as f64 + 1e-9
}

#[tokio::test]
async fn one_greedy_key_alone_reaches_its_ceiling() {
    let c = clock();
    let run = greedy(&["a"], memory(&c), &c, share(4, 16), share(4, 16)).await;
    eprintln!("alone: {:.2}/s", run.rate(0));
    assert!(near(run.rate(0), 16.0), "{}", run.rate(0));
    run.assert_pool_never_exceeded();
}

#[tokio::test]
async fn keys_whose_guarantees_fit_get_at_least_their_guarantee() {
    for n in [2usize, 5] {
        let c = clock();
        let names: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
        let keys: Vec<&str> = names.iter().map(String::as_str).collect();
        let run = greedy(&keys, memory(&c), &c, share(4, 16), share(4, 16)).await;
        let rates: Vec<f64> = (0..n).map(|i| run.rate(i)).collect();
        eprintln!("{n} greedy: {rates:.2?}");
        for r in &rates {
            // Each gets at least its guarantee, and the pool is split evenly.
            assert!(*r >= 4.0, "{rates:?}");
            assert!(near(*r, 20.0 / n as f64), "{rates:?}");
        }
        run.assert_pool_never_exceeded();
    }
}

#[tokio::test]
async fn an_oversubscribed_pool_is_shared_in_proportion_to_the_guarantees() {
    // Ten keys guaranteed 4/s on a 20/s pool: 2/s each.
    let c = clock();
    let names: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
    let run = greedy(&keys, memory(&c), &c, share(4, 16), share(4, 16)).await;
    let rates: Vec<f64> = (0..10).map(|i| run.rate(i)).collect();
    eprintln!("10 greedy: {rates:.2?}");
    for r in &rates {
        assert!(near(*r, 2.0), "{rates:?}");
    }
    run.assert_pool_never_exceeded();

    // Unequal guarantees, oversubscribed: 3 keys at 6/s and 3 at 2/s (24/s on 20/s):
    // 5/s and 5/3 per second.
    let c = clock();
    let keys = ["big0", "big1", "big2", "s0", "s1", "s2"];
    let run = greedy(&keys, memory(&c), &c, share(2, 20), share(6, 20)).await;
    let rates: Vec<f64> = (0..6).map(|i| run.rate(i)).collect();
    eprintln!("3 x 6/s + 3 x 2/s: {rates:.2?}");
    for (i, r) in rates.iter().enumerate() {
        let want = if i < 3 { 5.0 } else { 5.0 / 3.0 };
        assert!(near(*r, want), "{rates:?}");
    }
    run.assert_pool_never_exceeded();
}

#[tokio::test]
async fn spare_capacity_is_shared_by_guaranteed_rate() {
    // 6/s and 2/s guaranteed on 20/s: the 12/s spare goes 3:1, so 15/s and 5/s.
    let c = clock();
    let run = greedy(
        &["big", "small"],
        memory(&c),
        &c,
        share(2, 20),
        share(6, 20),
    )
    .await;
    let (big, small) = (run.rate(0), run.rate(1));
    eprintln!("6/s + 2/s: {big:.2}/s, {small:.2}/s");
    assert!(near(big, 15.0), "{big}");
    assert!(near(small, 5.0), "{small}");
    run.assert_pool_never_exceeded();
}

/// A key held at its ceiling leaves its share of the pool spare, and the others borrow
/// it: 4/s (ceiling 5/s) beside a greedy 4/s (ceiling 16/s) gets 5/s, the other 15/s.
#[tokio::test]
async fn what_a_key_leaves_at_its_ceiling_is_borrowed_by_the_others() {
    let c = clock();
    let run = greedy(&["big", "small"], memory(&c), &c, share(4, 5), share(4, 16)).await;
    let (big, small) = (run.rate(0), run.rate(1));
    eprintln!("ceiling 16 + ceiling 5: {big:.2}/s, {small:.2}/s");
    assert!(near(small, 5.0), "{small}");
    assert!(near(big, 15.0), "{big}");
    run.assert_pool_never_exceeded();
}

/// A key asking at its guaranteed rate among greedy ones is never refused.
#[tokio::test]
async fn a_key_under_its_guarantee_is_always_admitted() {
    let c = clock();
    let svc = service(layer(memory(&c), share(4, 16), share(4, 16)));
    let mut refused_light = 0;
    let mut elapsed = 0;
    while elapsed <= 12 * SEC {
        for key in ["g1", "g2", "g3"] {
            svc.clone().oneshot(request(key)).await.unwrap();
        }
        // 4 per second, evenly.
        if elapsed % (SEC / 4) == 0 {
            let res = svc.clone().oneshot(request("light")).await.unwrap();
            refused_light += usize::from(res.status() != 200);
        }
        c.advance(Duration::from_nanos(TICK));
        elapsed += TICK;
    }
    assert_eq!(refused_light, 0);
}

/// Spare capacity follows who is asking: when one of two greedy keys stops, the other
/// borrows what it leaves at once (the pool's 20/s while its ceiling's banked burst
/// lasts, then the ceiling's 16/s); when it starts again, both are back to half at once.
#[tokio::test]
async fn shares_follow_who_is_asking() {
    let c = clock();
    let svc = service(layer(memory(&c), share(4, 16), share(4, 16)));
    // `a`'s admissions in each second; `b` asks except in seconds 4 to 9.
    let mut admitted_a = vec![0u32; 14];
    let mut elapsed = 0;
    while elapsed < 14 * SEC {
        let second = (elapsed / SEC) as usize;
        if svc.clone().oneshot(request("a")).await.unwrap().status() == 200 {
            admitted_a[second] += 1;
        }
        if !(4..10).contains(&second) {
            svc.clone().oneshot(request("b")).await.unwrap();
        }
        c.advance(Duration::from_nanos(TICK));
        elapsed += TICK;
    }
    assert_eq!(admitted_a[2..4], [10, 10], "{admitted_a:?}");
    // At 10/s, `a` banked its ceiling's burst of 16: 4 more per second than 16 for 4 s.
    assert_eq!(admitted_a[4], 20, "{admitted_a:?}");
    assert_eq!(admitted_a[8..10], [16, 16], "{admitted_a:?}");
    assert_eq!(admitted_a[11..14], [10, 10, 10], "{admitted_a:?}");
}

#[tokio::test]
async fn fields_report_the_ceiling_what_may_be_borrowed_and_an_exact_retry_after() {
    let c = clock();
    let svc = service(layer(memory(&c), share(4, 16), share(4, 16)));
    let res = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(res.status(), 200);
    // The most the key may have (its ceiling, 16/s), of which it borrows 12: `r` never
    // exceeds `q`.
    assert_eq!(
        res.headers()["ratelimit-policy"],
        "\"fair\";q=16;w=1;borrow=12"
    );
    // Alone, after its first request: the ceiling's burst leaves 15, the pool 19, the
    // key's share (half the pool's burst at 16/s: 8) 7, and borrowing while the pool
    // keeps half its burst 9: it may send 9 more at once.
    assert_eq!(res.headers()["ratelimit"], "\"fair\";r=9;t=1");
    let mut last = res;
    while last.status() == 200 {
        last = svc.clone().oneshot(request("a")).await.unwrap();
    }
    assert_eq!(last.status(), 429);
    // The pool is back at half its burst in 50 ms: `Retry-After` and `t` say 1 s, the
    // problem body the milliseconds.
    assert_eq!(last.headers()["retry-after"], "1");
    assert_eq!(last.headers()["content-type"], "application/problem+json");
    assert_eq!(last.headers()["ratelimit"], "\"fair\";r=0;t=1");
    let body = http_body_util::BodyExt::collect(last.into_body())
        .await
        .unwrap()
        .to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["retry_after_ms"], 50);
    assert_eq!(body["violated-policies"], serde_json::json!(["fair"]));
}

#[test]
fn bad_shares_and_pools_are_refused_naming_the_part() {
    let e = Share::new(
        Quota::per_second(10).unwrap(),
        Quota::per_second(5).unwrap(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("ceiling"), "{e}");
    let e = FairLimitLayer::builder(HeaderKey::new("x").unwrap(), Quota::per_second(5).unwrap())
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("share"), "{e}");
    let e = FairLimitLayer::builder(HeaderKey::new("x").unwrap(), Quota::per_second(5).unwrap())
        .share(share(1, 2))
        .label("a{b}")
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("a{b}"), "{e}");
    let e = FairLimitLayer::builder(HeaderKey::new("x").unwrap(), Quota::per_second(5).unwrap())
        .share(share(1, 2))
        .activity_period(Duration::from_nanos(1_500))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("activity period"), "{e}");
}

#[cfg(feature = "redis")]
mod on_redis {
    use std::sync::atomic::{AtomicU32, Ordering};

    use tollgate::fair::RedisFair;
    use tollgate::store::{BreakerState, RedisConnection};

    use super::*;
    use crate::support::redis::{RedisServer, Target};

    fn namespace() -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        format!(
            "fair-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
    }

    async fn redis(url: &str, clock: &ManualClock) -> RedisFair {
        RedisFair::builder("limit")
            .namespace(namespace())
            .deadline(Duration::from_secs(5))
            .clock(clock.clone())
            .build(RedisConnection::connect(url).await.unwrap())
            .unwrap()
    }

    /// The same greedy runs on Redis make the same decisions as in memory, request by
    /// request, so every property shown above on memory holds on Redis.
    #[tokio::test]
    async fn redis_decides_exactly_as_memory() {
        let Some(target) = Target::get() else { return };
        let url = target.url();
        let scenarios: [(&[&str], Share, Share); 4] = [
            (&["a"], share(4, 16), share(4, 16)),
            (&["k0", "k1", "k2", "k3", "k4"], share(4, 16), share(4, 16)),
            (
                &["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9"],
                share(4, 16),
                share(4, 16),
            ),
            (&["big", "small"], share(2, 20), share(6, 20)),
        ];
        for (keys, small, big) in scenarios {
            let c = clock();
            let on_memory = greedy(keys, memory(&c), &c, small, big).await;
            let c = clock();
            let on_redis = greedy(keys, redis(&url, &c).await, &c, small, big).await;
            assert_eq!(on_memory.statuses, on_redis.statuses, "{keys:?}");
            on_redis.assert_pool_never_exceeded();
            let rates: Vec<f64> = (0..keys.len()).map(|i| on_redis.rate(i)).collect();
            eprintln!("redis, {} keys: {rates:.2?}", keys.len());
        }
    }

    /// A stalled Redis opens the breaker after its failures: the requests after it get the
    /// failure policy's answer without a call (none reaches Redis when it resumes), and
    /// once the cooldown has passed on the store's clock a probe closes it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_redis_opens_the_breaker_and_a_probe_closes_it() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let c = clock();
        let store = RedisFair::builder("limit")
            .namespace(namespace())
            .deadline(Duration::from_millis(100))
            .breaker(2, Duration::from_secs(1))
            .clock(c.clone())
            .build(RedisConnection::connect(&server.url()).await.unwrap())
            .unwrap();
        let svc = service(layer(store.clone(), share(4, 16), share(4, 16)));
        assert_eq!(
            svc.clone().oneshot(request("x")).await.unwrap().status(),
            200
        );
        let before = server.settled_script_calls();
        server.stop();
        for _ in 0..2 {
            // Fails open (the default): admitted, after the deadline.
            assert_eq!(
                svc.clone().oneshot(request("x")).await.unwrap().status(),
                200
            );
        }
        assert_eq!(store.breaker_state(), BreakerState::Open);
        for _ in 0..5 {
            assert_eq!(
                svc.clone().oneshot(request("x")).await.unwrap().status(),
                200
            );
        }
        server.cont();
        let sent = server.settled_script_calls() - before;
        assert!(
            sent <= 2,
            "{sent} calls reached Redis after the breaker opened"
        );
        c.advance(Duration::from_secs(1));
        assert_eq!(store.breaker_state(), BreakerState::HalfOpen);
        assert_eq!(
            svc.clone().oneshot(request("x")).await.unwrap().status(),
            200
        );
        assert_eq!(store.breaker_state(), BreakerState::Closed);
    }

    /// Two instances (two stores, two layers) on one Redis share one pool.
    #[tokio::test]
    async fn instances_share_the_pool() {
        let Some(target) = Target::get() else { return };
        let url = target.url();
        let c = clock();
        let ns = namespace();
        let store = |c: ManualClock| {
            let url = url.clone();
            let ns = ns.clone();
            async move {
                RedisFair::builder("limit")
                    .namespace(ns)
                    .deadline(Duration::from_secs(5))
                    .clock(c)
                    .build(RedisConnection::connect(&url).await.unwrap())
                    .unwrap()
            }
        };
        let a = service(layer(store(c.clone()).await, share(4, 16), share(4, 16)));
        let b = service(layer(store(c.clone()).await, share(4, 16), share(4, 16)));
        // Two keys, one on each instance, greedy: 10/s each, 20/s in all.
        let mut admitted = [0u32; 2];
        let mut elapsed = 0;
        while elapsed < 4 * SEC {
            if a.clone().oneshot(request("x")).await.unwrap().status() == 200 && elapsed >= SEC {
                admitted[0] += 1;
            }
            if b.clone().oneshot(request("y")).await.unwrap().status() == 200 && elapsed >= SEC {
                admitted[1] += 1;
            }
            c.advance(Duration::from_nanos(TICK));
            elapsed += TICK;
        }
        eprintln!("two instances: {admitted:?} in 3 s");
        assert!(
            admitted.iter().all(|&n| (29..=31).contains(&n)),
            "{admitted:?}"
        );
    }

    /// Random interleavings of keys, shares and gaps (whole microseconds, as Redis
    /// counts time): every response's status, `RateLimit` and `Retry-After` are the same
    /// on Redis as in memory.
    #[test]
    fn random_sequences_decide_alike() {
        use proptest::prelude::*;

        let Some(target) = Target::get() else { return };
        let url = target.url();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // Mostly short gaps on the 1 ms grid (where the boundaries between outcomes fall,
        // the intervals here being whole milliseconds), so keys contend; sometimes a gap
        // anywhere up to 3 s, across activity periods.
        let gap = prop_oneof![
            8 => (0u64..20).prop_map(|k| k * 1_000),
            1 => 0u64..3_000_000,
        ];
        let ops = proptest::collection::vec((0usize..5, gap), 1..400);
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 24,
            ..ProptestConfig::default()
        });
        runner
            .run(&ops, |ops| {
                rt.block_on(async {
                    let answers = |store_is_redis: bool| {
                        let ops = ops.clone();
                        let url = url.clone();
                        async move {
                            let c = clock();
                            let svc = if store_is_redis {
                                let store: std::sync::Arc<dyn FairStore<HeaderBytes>> =
                                    std::sync::Arc::new(redis(&url, &c).await);
                                service(layer(store, share(2, 8), share(6, 20)))
                            } else {
                                let store: std::sync::Arc<dyn FairStore<HeaderBytes>> =
                                    std::sync::Arc::new(memory(&c));
                                service(layer(store, share(2, 8), share(6, 20)))
                            };
                            let mut out = Vec::new();
                            for (key, gap_us) in ops {
                                c.advance(Duration::from_micros(gap_us));
                                let name = ["big0", "big1", "s0", "s1", "s2"][key];
                                let res = svc.clone().oneshot(request(name)).await.unwrap();
                                let h = |n: &str| {
                                    res.headers().get(n).map(|v| v.to_str().unwrap().to_owned())
                                };
                                out.push((res.status().as_u16(), h("ratelimit"), h("retry-after")));
                            }
                            out
                        }
                    };
                    let on_memory = answers(false).await;
                    let on_redis = answers(true).await;
                    prop_assert_eq!(on_memory, on_redis);
                    Ok(())
                })
            })
            .unwrap();
    }
}
