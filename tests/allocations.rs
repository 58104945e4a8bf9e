#![allow(unsafe_code)] // a counting global allocator: `GlobalAlloc` is an unsafe trait
//! The in-memory path allocates no boxed future: counted with a global allocator, a request
//! through the layer makes no more allocations than the same request without it (IETF
//! headers off), and exactly one more with the `RateLimit` field (its formatted value); so
//! do the in-flight and fair layers. A refusal allocates no more than an admission plus
//! its response, whatever its wait. And memory held, counted in live bytes: the fair
//! store keeps within its budget whatever its keys' length.

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use http_body_util::Full;
use tollgate::fair::{FairLimitLayer, Share};
use tollgate::key::Global;
use tollgate::InFlightLimitLayer;
use tollgate::Quota;
use tollgate::RateLimitLayer;
use tower::{Service, ServiceBuilder};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// Bytes allocated and not yet freed.
static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// The counts are global: the tests of this file run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Bytes allocated and not yet freed, now.
fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

#[global_allocator]
static GLOBAL: Counting = Counting;

type Body = Full<bytes::Bytes>;

/// Allocations made by one `call` polled to completion (the inner service is always ready).
fn allocations<S, F>(svc: &mut S) -> usize
where
    S: Service<Request<Body>, Future = F>,
    F: Future,
{
    let mut cx = Context::from_waker(Waker::noop());
    let req = Request::new(Body::default());
    let before = ALLOCS.load(Ordering::Relaxed);
    assert!(svc.poll_ready(&mut cx).is_ready());
    let mut fut = std::pin::pin!(svc.call(req));
    let out = loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            break out;
        }
    };
    let after = ALLOCS.load(Ordering::Relaxed);
    drop(out);
    after - before
}

/// Like an axum handler's response, it already carries a header (so its header map exists).
fn handler(_: Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>> {
    let mut r = Response::new(Body::default());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    std::future::ready(Ok(r))
}

fn layered(quota: Quota, ietf: bool) -> impl Service<Request<Body>> {
    let layer = RateLimitLayer::builder()
        .key(Global::new())
        .token_bucket(quota)
        .ietf_headers(ietf)
        .build()
        .unwrap();
    ServiceBuilder::new().layer(layer).service_fn(handler)
}

#[test]
fn memory_path_allocates_no_boxed_future() {
    let _serial = serial();
    let mut bare = ServiceBuilder::new().service_fn(handler);
    let mut plain = layered(Quota::per_second(1_000_000).unwrap(), false);
    let mut headers = layered(Quota::per_second(1_000_000).unwrap(), true);
    // Warm up: first-use allocations (the key's entry in the store, lazy statics).
    for _ in 0..3 {
        allocations(&mut bare);
        allocations(&mut plain);
        allocations(&mut headers);
    }
    let base = allocations(&mut bare);
    assert_eq!(
        allocations(&mut plain),
        base,
        "no allocation of its own without headers"
    );
    // The RateLimit value is formatted per response (one exact-size copy); RateLimit-Policy
    // is preformatted and shared.
    let with_headers = allocations(&mut headers);
    assert_eq!(
        with_headers,
        base + 1,
        "{with_headers} allocations vs {base} bare"
    );

    // The in-flight and fair layers' futures are not boxed either: an admitted request
    // allocates its RateLimit value and nothing else (the policy value is shared); an
    // in-flight limit of up to 256 slots has every value formatted in advance.
    let in_flight_layer = |max| {
        ServiceBuilder::new()
            .layer(InFlightLimitLayer::new(Global::new(), max))
            .service_fn(handler)
    };
    let (mut in_flight, mut preset) = (in_flight_layer(1_000), in_flight_layer(100));
    let big = Quota::per_second(1_000_000).unwrap();
    let mut fair = ServiceBuilder::new()
        .layer(
            FairLimitLayer::builder(Global::new(), big)
                .share(Share::new(big, big).unwrap())
                .build()
                .unwrap(),
        )
        .service_fn(handler);
    for _ in 0..3 {
        allocations(&mut in_flight);
        allocations(&mut preset);
        allocations(&mut fair);
    }
    let (in_flight, preset, fair) = (
        allocations(&mut in_flight),
        allocations(&mut preset),
        allocations(&mut fair),
    );
    assert_eq!(
        (in_flight, preset, fair),
        (base + 1, base, base + 1),
        "in-flight {in_flight}, preset {preset}, fair {fair} vs {base} bare"
    );

    // A refusal: no inner call, one response built by the middleware.
    let mut refusing = layered(Quota::per_minute(1).unwrap(), true);
    allocations(&mut refusing); // admitted, inserts the key
    let refused = allocations(&mut refusing);
    let admitted_total = with_headers;
    eprintln!("allocations: bare {base}, admitted {admitted_total}, refused {refused}");
    assert!(
        refused <= admitted_total + 1,
        "refusal {refused} vs admission {admitted_total}"
    );

    // A wait of 100 s or more is not static text: its `Retry-After` value shares the
    // `RateLimit` value's allocation, so a long wait allocates no more than a short one.
    let mut refusing_long = layered(Quota::per_hour(1).unwrap(), true);
    allocations(&mut refusing_long);
    let refused_long = allocations(&mut refusing_long);
    assert_eq!(
        refused_long, refused,
        "a refusal with Retry-After: 3600 vs one with Retry-After: 60"
    );
}

/// Regression: the fair store's budget counted each key at its inline size (24 bytes for a
/// `String`, 16 for a header value), not the bytes it owns: keys of 256 bytes took it to
/// about 6 times its budget. A key that owns heap memory is now kept as a 12-byte digest,
/// and the table's allocation is what the budget bounds.
#[test]
fn the_fair_store_keeps_within_its_budget_whatever_the_keys_length() {
    use tollgate::clock::ManualClock;
    use tollgate::fair::MemoryFair;
    use tollgate::key::{HeaderBytes, HeaderKey};

    let _serial = serial();
    const BUDGET: usize = 1 << 20;
    let big = Quota::per_second(1_000_000).unwrap();
    // A frozen clock: every key keeps its state, none can be dropped as fresh.
    let store = MemoryFair::<HeaderBytes>::new()
        .with_max_bytes(BUDGET)
        .with_clock(ManualClock::at(std::time::Duration::from_secs(
            1_800_000_000,
        )));
    let layer = FairLimitLayer::builder(HeaderKey::new("x-key").unwrap(), big)
        .share(Share::new(Quota::per_second(1).unwrap(), big).unwrap())
        .build_with(store.clone())
        .unwrap();
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(handler);
    let mut cx = Context::from_waker(Waker::noop());
    let before = live();
    for i in 0..40_000u32 {
        let key = format!("{i:0>256}");
        let req = Request::builder()
            .header("x-key", key)
            .body(Body::default())
            .unwrap();
        assert!(svc.poll_ready(&mut cx).is_ready());
        let mut fut = std::pin::pin!(svc.call(req));
        assert!(fut.as_mut().poll(&mut cx).is_ready());
    }
    let held = live() - before;
    eprintln!(
        "fair store: {} keys of 256 bytes in {held} bytes, budget {BUDGET}",
        store.len()
    );
    assert!(store.len() > 10_000, "{} keys", store.len());
    assert!(held <= BUDGET, "{held} bytes held for a budget of {BUDGET}");
}

/// Regression: a policy set cost memory far beyond its text: 5.4 to 18.8 KB a policy once
/// installed (each policy's response fields formatted and its metrics registered up
/// front), and after swapping back to one policy most of it stayed (every policy kept by
/// the store, every series by the recorder). Now a policy's fields and series are made at
/// its first decision (the fallback's when the set is installed), and the store keeps
/// only the parameters it decided under.
#[test]
fn a_policy_set_costs_memory_in_proportion_to_its_text() {
    use tollgate::key::{HeaderBytes, HeaderKey, RequestHead};
    use tollgate::policy::PolicySet;

    let _serial = serial();
    const N: usize = 10_000;
    // Distinct parameters for every policy: none shares a store tag with another.
    let text: String = (0..N)
        .map(|i| format!("tenant-{i} = {}/s burst 200\n", i + 1))
        .collect();
    // With a recorder in force, as in production: each policy's series are registered in it.
    #[cfg(feature = "metrics")]
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let measure = || {
        let layer = RateLimitLayer::builder()
            .key(HeaderKey::new("x-tenant").unwrap())
            .policy("1/s")
            .select(|_: &RequestHead<'_>, key: Option<&HeaderBytes>| {
                key.map(|k| String::from_utf8_lossy(k).into_owned())
                    .unwrap_or_default()
            })
            .build()
            .unwrap();
        let mut svc = ServiceBuilder::new()
            .layer(layer.clone())
            .service_fn(handler);
        let handle = layer.policy_handle();
        let mut cx = Context::from_waker(Waker::noop());
        let mut call = |tenant: &str| {
            let req = Request::builder()
                .header("x-tenant", tenant)
                .body(Body::default())
                .unwrap();
            assert!(svc.poll_ready(&mut cx).is_ready());
            let mut fut = std::pin::pin!(svc.call(req));
            assert!(fut.as_mut().poll(&mut cx).is_ready());
        };
        call("warm-up");
        let before = live();
        let set = PolicySet::from_text(&text).unwrap();
        let parsed = live() - before;
        handle.swap(set).unwrap();
        let installed = live() - before;
        // Ten tenants in use: their fields and series are made now.
        for i in 0..10 {
            call(&format!("tenant-{i}"));
        }
        let used = live() - before;
        handle.swap_text("1/s").unwrap();
        let retained = live().saturating_sub(before);
        let per = |bytes: usize| bytes / N;
        eprintln!(
            "{N} policies, {} bytes of text ({} a line): parsed {} B/policy, installed {} \
             B/policy, ten in use {} B/policy, {} B/policy retained after swapping back to \
             one",
            text.len(),
            text.len() / N,
            per(parsed),
            per(installed),
            per(used),
            per(retained)
        );
        let line = text.len() / N;
        assert!(
            per(installed) <= 16 * line,
            "{} B a policy installed",
            per(installed)
        );
        assert!(
            per(used) <= 16 * line,
            "{} B a policy, ten in use",
            per(used)
        );
        assert!(per(retained) <= 64, "{} B a policy retained", per(retained));
    };
    #[cfg(feature = "metrics")]
    metrics::with_local_recorder(&recorder, measure);
    #[cfg(not(feature = "metrics"))]
    measure();
}
