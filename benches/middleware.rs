//! Per-request cost of the HTTP middleware: tollgate's [`RateLimitLayer`] against
//! `tower_governor`'s `GovernorLayer`, both keyed by the peer IP (`ConnectInfo`), both
//! through `tower::ServiceBuilder` around the same inner `service_fn`, which alone is the
//! baseline. The figure is the cost a layer *adds* to a request: its time minus the
//! baseline's, measured in the same round.
//!
//! - `cargo bench -p tollgate-benches --bench middleware`: criterion, one group per row with `baseline`,
//!   `tollgate` and `tower_governor`.
//! - `TOLLGATE_RATIOS=<filter> cargo bench -p tollgate-benches --bench middleware`: the interleaved table of
//!   `BENCHMARKS.md`. Every round times one batch of each of the three (rotating the order),
//!   with the thread's CPU time; a row gives the medians, the added costs and the median of
//!   the per-round ratios of added costs (tollgate / tower_governor), with its 25th..75th
//!   percentile.
//!
//! Rows: `allowed` (a quota nothing exhausts; 256 peer addresses in turn) without and with
//! the rate-limit headers (tollgate: IETF `RateLimit` / `RateLimit-Policy`, its default;
//! tower_governor: its `x-ratelimit-*` headers), and `refused` (each address spent its one
//! request per hour during setup; tollgate answers with its defaults, `Retry-After`, the
//! IETF fields and a problem+json body). `allowed/selected` picks one of two named
//! policies per request from the key; `allowed/shadow` runs a limit in shadow that would
//! refuse every request (each is let through, marked and counted); `allowed/metrics` is
//! `allowed` with a Prometheus recorder behind the layer's metric handles (in `allowed`
//! they are the no-op recorder's). Their tower_governor column is its `allowed`.
//! `allowed/tsc-store` (feature `tsc`) is tollgate on
//! a [`MemoryStore`] with the opt-in TSC clock instead of the default store, which follows
//! tokio's clock (so paused-time tests drive it). `headers-floor` has no limiter
//! on the tollgate side: only the two IETF fields added to every response, the cheapest
//! way `http` allows, to show what sending them costs by itself. `exempt/skip` and
//! `exempt/allow-ips` never limit a request (a skip predicate matches every request; every
//! peer is on the allow list); `allowed/counted` counts a request only by its response
//! (`count_when`, never true here: each request is charged, then refunded). Their
//! tower_governor column is its `allowed`.
//!
//! `TOLLGATE_PROFILE=<row> [TOLLGATE_PROFILE_WHO=baseline|tollgate|tower_governor]
//! [TOLLGATE_PROFILE_N=1000000]` runs one contender's batch of that row only, for
//! profilers (`valgrind --tool=callgrind`, `perf`).

use std::convert::Infallible;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use axum::{body::Body, extract::ConnectInfo};
use criterion::{criterion_group, Criterion};
use http::{Request, Response, StatusCode};
use tollgate::key::{PeerIp, RequestHead};
#[cfg(feature = "tsc")]
use tollgate::store::MemoryStore;
use tollgate::Limit;
use tollgate::Quota;
use tollgate::RateLimitLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_governor::{governor::GovernorConfigBuilder, GovernorLayer};

/// Set when profiling: valgrind cannot run rustix's vDSO lookup, so wall time is used.
static PROFILING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// This thread's CPU time (see `benches/core.rs`); wall time since the first call when
/// profiling.
fn cpu() -> Duration {
    if PROFILING.load(std::sync::atomic::Ordering::Relaxed) {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        return START.get_or_init(std::time::Instant::now).elapsed();
    }
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Peer addresses the requests come from, in turn.
const PEERS: u32 = 256;

fn request(i: u32) -> Request<Body> {
    let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + (i % PEERS)));
    Request::builder()
        .uri("/")
        .extension(ConnectInfo(SocketAddr::new(ip, 4000)))
        .body(Body::empty())
        .unwrap()
}

/// The inner service: what an axum handler returning `"hello"` answers (its
/// `content-type` included, so the response's header map is allocated before any layer
/// adds to it, as in a real app).
async fn hello(_: Request<Body>) -> Result<Response<Body>, Infallible> {
    let mut r = Response::new(Body::from("hello"));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Ok(r)
}

/// The `headers-floor` row's "tollgate" side: no limiter at all, only the two IETF fields
/// of an admitted request added to every response, formatted and inserted the cheapest
/// way `http` allows (`RateLimit` needs one allocation per response; the policy is a
/// static value). What any limiter that sends these headers pays at least.
fn headers_floor() -> Batch {
    static POLICY: http::HeaderValue =
        http::HeaderValue::from_static("\"default\";q=100000000;w=1");
    static RATELIMIT: http::HeaderName = http::HeaderName::from_static("ratelimit");
    static RATELIMIT_POLICY: http::HeaderName = http::HeaderName::from_static("ratelimit-policy");
    let mut remaining = 1u64 << 36;
    let add = move |mut r: Response<Body>| {
        remaining -= 1;
        let mut buf = [0u8; 64];
        let prefix = b"\"default\";r=";
        buf[..prefix.len()].copy_from_slice(prefix);
        let mut n = prefix.len();
        for part in [itoa::Buffer::new().format(remaining).as_bytes(), b";t=0"] {
            buf[n..n + part.len()].copy_from_slice(part);
            n += part.len();
        }
        let h = r.headers_mut();
        h.insert(&RATELIMIT_POLICY, POLICY.clone());
        h.insert(
            &RATELIMIT,
            http::HeaderValue::from_bytes(&buf[..n]).unwrap(),
        );
        r
    };
    batch(
        ServiceBuilder::new().map_response(add).service_fn(hello),
        StatusCode::OK,
    )
}

/// A batch of `n` requests; returns the CPU time it took.
type Batch = Box<dyn FnMut(u64) -> Duration>;

/// Sends `n` requests through `svc` on a current-thread runtime; every response must have
/// `status`.
fn batch<S, B>(mut svc: S, status: StatusCode) -> Batch
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible> + 'static,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut i = 0u32;
    // Setup: one request per peer (spends the refused rows' quota), then a check.
    rt.block_on(async {
        for p in 0..PEERS {
            let _ = svc.ready().await.unwrap().call(request(p)).await;
        }
        let r = svc.ready().await.unwrap().call(request(0)).await.unwrap();
        assert_eq!(r.status(), status);
    });
    Box::new(move |n| {
        let svc = &mut svc;
        let i = &mut i;
        let start = cpu();
        rt.block_on(async move {
            for _ in 0..n {
                *i = i.wrapping_add(1);
                let r = svc.ready().await.unwrap().call(request(*i)).await;
                black_box(r.unwrap());
            }
        });
        cpu() - start
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Row {
    Allowed,
    AllowedSelected,
    AllowedShadow,
    AllowedMetrics,
    AllowedHeaders,
    #[cfg(feature = "tsc")]
    AllowedTscStore,
    Refused,
    HeadersFloor,
    ExemptSkip,
    ExemptIps,
    AllowedCounted,
}

fn baseline() -> Batch {
    batch(ServiceBuilder::new().service_fn(hello), StatusCode::OK)
}

fn tollgate(row: Row) -> Batch {
    if row == Row::HeadersFloor {
        return headers_floor();
    }
    let quota = if row == Row::Refused {
        Quota::per_hour(1).unwrap()
    } else {
        Quota::per_second(100_000_000)
            .unwrap()
            .with_burst(1 << 36)
            .unwrap()
    };
    let headers = matches!(row, Row::AllowedHeaders | Row::Refused);
    let builder = RateLimitLayer::builder()
        .key(PeerIp::new())
        .ietf_headers(headers);
    match row {
        Row::AllowedSelected => {
            // Two plans, picked per request from the key (half the addresses are "pro").
            let free = Limit::token_bucket(quota).unwrap();
            let pro = Limit::token_bucket(quota.with_burst(1 << 37).unwrap()).unwrap();
            let layer = builder
                .named_policy("free", free)
                .named_policy("pro", pro)
                .select(|_: &RequestHead<'_>, ip: Option<&IpAddr>| match ip {
                    Some(IpAddr::V4(v4)) if v4.octets()[3] % 2 == 0 => "pro",
                    _ => "free",
                })
                .build()
                .unwrap();
            return batch(
                ServiceBuilder::new().layer(layer).service_fn(hello),
                StatusCode::OK,
            );
        }
        Row::AllowedShadow => {
            // A limit in shadow that would refuse every request: each one is let through,
            // marked, counted and put in the extensions.
            let limit = Limit::token_bucket(Quota::per_hour(1).unwrap())
                .unwrap()
                .shadow();
            let layer = builder.limit(limit).build().unwrap();
            let mut b = batch(
                ServiceBuilder::new().layer(layer).service_fn(hello),
                StatusCode::OK,
            );
            b(256); // every address spends its unit
            return b;
        }
        Row::ExemptSkip | Row::ExemptIps => {
            // Never limited: every request skipped by a predicate, or every peer on the
            // allow list (256 addresses in 10.0.0.0/24).
            let builder = builder.token_bucket(quota);
            let builder = if row == Row::ExemptSkip {
                builder.skip(|head| head.uri().path() == "/")
            } else {
                builder.allow_ips(["10.0.0.0/8"])
            };
            return batch(
                ServiceBuilder::new()
                    .layer(builder.build().unwrap())
                    .service_fn(hello),
                StatusCode::OK,
            );
        }
        Row::AllowedCounted => {
            // Counted only when the response says so (never here): each request is charged
            // when admitted and refunded from its response.
            let layer = builder
                .token_bucket(quota)
                .count_when(|res| res.status() == StatusCode::UNAUTHORIZED)
                .build()
                .unwrap();
            return batch(
                ServiceBuilder::new().layer(layer).service_fn(hello),
                StatusCode::OK,
            );
        }
        #[cfg(feature = "metrics")]
        Row::AllowedMetrics => {
            // The `allowed` row with a Prometheus recorder bound to the layer's handles
            // (the `allowed` row's handles go to the no-op recorder).
            let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
            let layer = metrics::with_local_recorder(&recorder, || {
                builder.token_bucket(quota).build().unwrap()
            });
            // The recorder's storage lives as long as the handles.
            std::mem::forget(recorder);
            return batch(
                ServiceBuilder::new().layer(layer).service_fn(hello),
                StatusCode::OK,
            );
        }
        _ => {}
    }
    let status = if row == Row::Refused {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    #[cfg(feature = "tsc")]
    if row == Row::AllowedTscStore {
        let store = MemoryStore::new(Limit::token_bucket(quota).unwrap())
            .with_clock(tollgate::clock::TscClock::new());
        let layer = builder.build_with(store).unwrap();
        return batch(ServiceBuilder::new().layer(layer).service_fn(hello), status);
    }
    {
        let layer = builder.token_bucket(quota).build().unwrap();
        batch(ServiceBuilder::new().layer(layer).service_fn(hello), status)
    }
}

fn tower_governor(row: Row) -> Batch {
    let mut config = GovernorConfigBuilder::default();
    if row == Row::Refused {
        config.per_second(3600).burst_size(1);
    } else {
        config.period(Duration::from_nanos(10)).burst_size(u32::MAX);
    }
    if row == Row::AllowedHeaders {
        let layer = GovernorLayer::new(config.use_headers().finish().unwrap());
        batch(
            ServiceBuilder::new().layer(layer).service_fn(hello),
            StatusCode::OK,
        )
    } else {
        let status = if row == Row::Refused {
            StatusCode::TOO_MANY_REQUESTS
        } else {
            StatusCode::OK
        };
        let layer = GovernorLayer::new(config.finish().unwrap());
        batch(ServiceBuilder::new().layer(layer).service_fn(hello), status)
    }
}

const ROWS: &[(&str, Row)] = &[
    ("allowed", Row::Allowed),
    ("allowed/selected", Row::AllowedSelected),
    ("allowed/shadow", Row::AllowedShadow),
    #[cfg(feature = "metrics")]
    ("allowed/metrics", Row::AllowedMetrics),
    ("allowed/headers", Row::AllowedHeaders),
    ("refused", Row::Refused),
    #[cfg(feature = "tsc")]
    ("allowed/tsc-store", Row::AllowedTscStore),
    ("headers-floor", Row::HeadersFloor),
    ("exempt/skip", Row::ExemptSkip),
    ("exempt/allow-ips", Row::ExemptIps),
    ("allowed/counted", Row::AllowedCounted),
];

const LABELS: [&str; 3] = ["baseline", "tollgate", "tower_governor"];

fn build(filter: &str) -> impl Iterator<Item = (&'static str, [Batch; 3])> + '_ {
    ROWS.iter()
        .copied()
        .filter(move |(name, _)| name.contains(filter))
        .map(|(name, row)| (name, [baseline(), tollgate(row), tower_governor(row)]))
}

fn criterion_benches(c: &mut Criterion) {
    for (name, mut batches) in build("") {
        let mut g = c.benchmark_group(format!("middleware/{name}"));
        for (label, batch) in LABELS.iter().zip(batches.iter_mut()) {
            g.bench_function(*label, |b| b.iter_custom(&mut *batch));
        }
        g.finish();
    }
}

criterion_group!(benches, criterion_benches);

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(v, 0.5)
}

/// The interleaved table (see the module docs).
fn ratios(filter: &str) {
    const ROUNDS: usize = 61;
    const SAMPLE: Duration = Duration::from_millis(5);
    println!("| figure | baseline ns | tollgate ns | tower_governor ns | tollgate added ns | tower_governor added ns | added ratio (median of rounds) | p25..p75 |");
    println!("|---|---|---|---|---|---|---|---|");
    for (name, mut b) in build(filter) {
        // Calibrate on the slowest contender, warming all three up.
        let mut n = 100u64;
        loop {
            let slowest = b.iter_mut().map(|f| f(n)).max().unwrap();
            if slowest >= SAMPLE / 4 {
                n = (n as f64 * SAMPLE.as_secs_f64() / slowest.as_secs_f64()).max(1.0) as u64;
                break;
            }
            n *= 4;
        }
        let mut per = [Vec::new(), Vec::new(), Vec::new()];
        let mut rs = Vec::new();
        for round in 0..ROUNDS {
            let mut t = [0.0; 3];
            for j in 0..3 {
                let k = (round + j) % 3;
                t[k] = b[k](n).as_nanos() as f64 / n as f64;
            }
            for k in 0..3 {
                per[k].push(t[k]);
            }
            rs.push((t[1] - t[0]) / (t[2] - t[0]));
        }
        let [base, ours, theirs] = per.map(|mut v| median(&mut v));
        let r = median(&mut rs);
        println!(
            "| {name} | {base:.0} | {ours:.0} | {theirs:.0} | {:.0} | {:.0} | {r:.2} | {:.2}..{:.2} |",
            ours - base,
            theirs - base,
            percentile(&rs, 0.25),
            percentile(&rs, 0.75),
        );
    }
}

fn main() {
    // For profilers (`perf`, `valgrind --tool=callgrind`): one contender's batch
    // (`TOLLGATE_PROFILE_WHO`, default tollgate) of the row named exactly.
    if let Ok(filter) = std::env::var("TOLLGATE_PROFILE") {
        PROFILING.store(true, std::sync::atomic::Ordering::Relaxed);
        let n = std::env::var("TOLLGATE_PROFILE_N").map_or(1_000_000, |n| n.parse().unwrap());
        let who = std::env::var("TOLLGATE_PROFILE_WHO").unwrap_or_else(|_| "tollgate".into());
        let k = LABELS
            .iter()
            .position(|l| *l == who)
            .expect("baseline|tollgate|tower_governor");
        let rows = ROWS.iter().copied().filter(|(name, _)| *name == filter);
        for (name, row) in rows {
            let mut batches = [baseline(), tollgate(row), tower_governor(row)];
            println!("{name} {who}: {:?} per request", batches[k](n) / n as u32);
        }
        return;
    }
    if let Ok(filter) = std::env::var("TOLLGATE_RATIOS") {
        ratios(&filter);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
