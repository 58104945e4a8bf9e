//! Per-request cost of an in-flight limit: the bare service against the same service
//! behind `InFlightLimitLayer` (memory store, keyed by the peer IP), each request taking
//! its slot in `call` and giving it back when its response body is read to the end. The
//! figure is the ratio of the two times, and the time the layer adds.
//!
//! - `cargo bench -p tollgate-benches --bench inflight`: criterion, `baseline` and `inflight` in one group,
//!   then the interleaved ratio table below.
//! - `TOLLGATE_RATIOS=1 cargo bench -p tollgate-benches --bench inflight`: the table only. Every round times
//!   one batch of each (alternating the order), with the thread's CPU time; the row gives
//!   the medians and the median of the per-round ratios with its 25th..75th percentile.

use std::convert::Infallible;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use axum::{body::Body, extract::ConnectInfo};
use criterion::{criterion_group, Criterion};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tollgate::{key::PeerIp, InFlightLimitLayer};
use tower::{Service, ServiceBuilder, ServiceExt};

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

/// The inner service: what an axum handler returning `"hello"` answers.
async fn hello(_: Request<Body>) -> Result<Response<Body>, Infallible> {
    let mut r = Response::new(Body::from("hello"));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Ok(r)
}

/// A batch of `n` requests; returns the CPU time it took.
type Batch = Box<dyn FnMut(u64) -> Duration>;

/// Sends `n` requests through `svc` on a current-thread runtime, reading every response
/// body to its end (which gives an in-flight slot back); every response must be `200`.
fn batch<S, B>(mut svc: S) -> Batch
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible> + 'static,
    B: http_body::Body<Data = bytes::Bytes>,
    B::Error: std::fmt::Debug,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut i = 0u32;
    Box::new(move |n| {
        let svc = &mut svc;
        let i = &mut i;
        let start = cpu();
        rt.block_on(async move {
            for _ in 0..n {
                *i = i.wrapping_add(1);
                let r = svc.ready().await.unwrap().call(request(*i)).await.unwrap();
                assert_eq!(r.status(), StatusCode::OK);
                let body = r.into_body().collect().await.unwrap();
                black_box(body);
            }
        });
        cpu() - start
    })
}

fn baseline() -> Batch {
    batch(ServiceBuilder::new().service_fn(hello))
}

fn inflight() -> Batch {
    // Far above what one sequential client holds: every request is admitted.
    let layer = InFlightLimitLayer::new(PeerIp::new(), 8);
    batch(ServiceBuilder::new().layer(layer).service_fn(hello))
}

fn criterion_benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("inflight/acquire-release");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    for (label, mut b) in [("baseline", baseline()), ("inflight", inflight())] {
        g.bench_function(label, |bench| bench.iter_custom(&mut b));
    }
    g.finish();
}

criterion_group!(benches, criterion_benches);

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(v, 0.5)
}

/// The interleaved ratio (see the module docs).
fn ratios() {
    const ROUNDS: usize = 41;
    const SAMPLE: Duration = Duration::from_millis(5);
    let mut b = [baseline(), inflight()];
    let mut n = 100u64;
    loop {
        let slowest = b.iter_mut().map(|f| f(n)).max().unwrap();
        if slowest >= SAMPLE / 4 {
            n = (n as f64 * SAMPLE.as_secs_f64() / slowest.as_secs_f64()).max(1.0) as u64;
            break;
        }
        n *= 4;
    }
    let (mut base, mut ours, mut rs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let mut t = [0.0; 2];
        for j in 0..2 {
            let k = (round + j) % 2;
            t[k] = b[k](n).as_nanos() as f64 / n as f64;
        }
        base.push(t[0]);
        ours.push(t[1]);
        rs.push(t[1] / t[0]);
    }
    let (base, ours, r) = (median(&mut base), median(&mut ours), median(&mut rs));
    println!(
        "| figure | baseline ns | inflight ns | added ns | ratio (median of rounds) | p25..p75 |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| acquire + release | {base:.0} | {ours:.0} | {:.0} | {r:.2} | {:.2}..{:.2} |",
        ours - base,
        percentile(&rs, 0.25),
        percentile(&rs, 0.75),
    );
}

fn main() {
    // `TOLLGATE_PROFILE=baseline|inflight [TOLLGATE_PROFILE_N=1000000]`: one side's batch
    // only, for profilers (`valgrind --tool=callgrind`).
    if let Ok(who) = std::env::var("TOLLGATE_PROFILE") {
        PROFILING.store(true, std::sync::atomic::Ordering::Relaxed);
        let n = std::env::var("TOLLGATE_PROFILE_N").map_or(1_000_000, |n| n.parse().unwrap());
        let mut b = if who == "baseline" {
            baseline()
        } else {
            inflight()
        };
        println!("{who}: {:?} per request", b(n) / n as u32);
        return;
    }
    if std::env::var("TOLLGATE_RATIOS").is_err() {
        benches();
        Criterion::default().configure_from_args().final_summary();
    }
    ratios();
}
