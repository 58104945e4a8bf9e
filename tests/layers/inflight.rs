//! In-flight (concurrency) limits: at most N requests of a key reach the handler at once,
//! a slot is held until the response body ends or is dropped, queues are FIFO and
//! bounded in length and time, a dropped waiter leaves its queue, keyless requests follow
//! `MissingKey`, the fields combine with the rate layer's; on Redis, instances share the
//! limit and a dead instance's leases come back within the lease TTL.

use std::{
    collections::VecDeque,
    convert::Infallible,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::Duration,
};

use crate::support;
use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::{sync::Semaphore, time::Instant};
use tollgate::inflight::{InFlightBody, MemoryInFlight};
use tollgate::key::MissingKey;
use tollgate::key::{Global, HeaderKey};
use tollgate::InFlightLimitLayer;
use tollgate::Limit;
use tollgate::Quota;
use tollgate::RateLimitLayer;
use tower::{Service, ServiceBuilder, ServiceExt};

type Req = Request<Body>;

fn request(path: &str) -> Req {
    Request::builder().uri(path).body(Body::empty()).unwrap()
}

fn keyed(key: &str) -> Req {
    Request::builder()
        .uri("/")
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap()
}

/// A handler that counts the requests inside it (and the most at once), and waits for a
/// permit of `gate` before answering.
#[derive(Clone)]
struct Gate {
    inside: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    entered: Arc<Mutex<Vec<String>>>,
    gate: Arc<Semaphore>,
}

impl Gate {
    fn new() -> Self {
        Gate {
            inside: Arc::default(),
            most: Arc::default(),
            entered: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }

    async fn handle(self, req: Req) -> Result<Response<Body>, Infallible> {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        self.entered
            .lock()
            .unwrap()
            .push(req.uri().path().to_owned());
        self.gate.acquire().await.unwrap().forget();
        self.inside.fetch_sub(1, Ordering::SeqCst);
        Ok(Response::new(Body::from("done")))
    }
}

/// Lets the tasks run until they are all waiting.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

fn header<B>(r: &Response<B>, name: &str) -> Vec<String> {
    r.headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

async fn body_text(r: Response<InFlightBody<Body>>) -> String {
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn at_most_n_requests_reach_the_handler() {
    let gate = Gate::new();
    let layer = InFlightLimitLayer::new(Global::new(), 2);
    let g = gate.clone();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service_fn(move |req| g.clone().handle(req));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            svc.oneshot(request(&format!("/{i}"))).await.unwrap()
        }));
    }
    settle().await;
    assert_eq!(gate.inside.load(Ordering::SeqCst), 2);
    // The 8 refusals are answered while the 2 admitted requests are still inside.
    let mut refused = Vec::new();
    let mut admitted = Vec::new();
    for t in tasks {
        if t.is_finished() {
            refused.push(t.await.unwrap());
        } else {
            admitted.push(t);
        }
    }
    assert_eq!(refused.len(), 8);
    for r in refused {
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&r, "retry-after"), ["1"]);
        assert_eq!(
            header(&r, "ratelimit-policy"),
            ["\"inflight\";q=2;qu=\"concurrent-requests\""]
        );
        assert_eq!(header(&r, "ratelimit"), ["\"inflight\";r=0"]);
        assert_eq!(header(&r, "content-type"), ["application/problem+json"]);
        assert_eq!(header(&r, "cache-control"), ["no-store"]);
        let body: serde_json::Value = serde_json::from_str(&body_text(r).await).unwrap();
        assert_eq!(
            body["type"],
            "https://iana.org/assignments/http-problem-types#quota-exceeded"
        );
        assert_eq!(body["violated-policies"], serde_json::json!(["inflight"]));
    }
    gate.gate.add_permits(2);
    let mut remaining = Vec::new();
    for t in admitted {
        let r = t.await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            header(&r, "ratelimit-policy"),
            ["\"inflight\";q=2;qu=\"concurrent-requests\""]
        );
        remaining.extend(header(&r, "ratelimit"));
        assert_eq!(body_text(r).await, "done");
    }
    remaining.sort();
    assert_eq!(remaining, ["\"inflight\";r=0", "\"inflight\";r=1"]);
    assert_eq!(gate.most.load(Ordering::SeqCst), 2);
    assert!(layer.store().is_empty(), "{:?}", layer.store());
}

/// A body of a few frames, sent one per poll.
struct Frames(VecDeque<Bytes>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

fn frames_service(
    layer: InFlightLimitLayer<Global, MemoryInFlight<()>>,
) -> impl Service<Req, Response = Response<InFlightBody<Frames>>, Error = Infallible, Future: Send> + Clone
{
    ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: Req| async {
            let chunks = [&b"a"[..], b"b", b"c"].map(Bytes::from_static);
            Ok::<_, Infallible>(Response::new(Frames(chunks.into())))
        })
}

#[tokio::test]
async fn a_slot_is_held_until_the_last_frame_is_read() {
    let layer = InFlightLimitLayer::new(Global::new(), 1);
    let svc = frames_service(layer.clone());
    let first = svc.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        svc.clone().oneshot(request("/")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let mut body = first.into_body();
    // Two of three frames read: the response is still in flight.
    for _ in 0..2 {
        body.frame().await.unwrap().unwrap();
    }
    assert_eq!(
        svc.clone().oneshot(request("/")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // The last frame ends the stream and gives the slot back, though the body lives on.
    body.frame().await.unwrap().unwrap();
    assert!(layer.store().is_empty());
    let next = svc.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);
    drop(body);
}

#[tokio::test]
async fn a_dropped_response_body_gives_its_slot_back() {
    let layer = InFlightLimitLayer::new(Global::new(), 1);
    let svc = frames_service(layer.clone());
    let first = svc.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(
        svc.clone().oneshot(request("/")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Dropped without reading a byte (the client went away).
    drop(first);
    assert!(layer.store().is_empty());
    let second = svc.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_dropped_response_future_gives_its_slot_back() {
    let gate = Gate::new();
    let layer = InFlightLimitLayer::new(Global::new(), 1);
    let g = gate.clone();
    let mut svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service_fn(move |req| g.clone().handle(req));
    // Admitted, and inside the handler when a timeout drops it.
    let pending = svc.ready().await.unwrap().call(request("/1"));
    let timed_out = tokio::time::timeout(Duration::from_millis(10), pending).await;
    assert!(timed_out.is_err());
    assert!(layer.store().is_empty());
    gate.gate.add_permits(1);
    let r = svc
        .ready()
        .await
        .unwrap()
        .call(request("/2"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn queued_requests_are_served_in_order_and_bounded() {
    let gate = Gate::new();
    let layer = InFlightLimitLayer::builder(Global::new(), 1)
        .queue(2)
        .max_wait(Duration::from_secs(60))
        .build()
        .unwrap();
    let g = gate.clone();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service_fn(move |req| g.clone().handle(req));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..4 {
        let mut svc = svc.clone();
        // Each call takes its slot or its place in the queue at once, in this order.
        let fut = svc.ready().await.unwrap().call(request(&format!("/{i}")));
        tasks.push(tokio::spawn(async move {
            let r = fut.await.unwrap();
            (r.status(), start.elapsed())
        }));
    }
    settle().await;
    // /0 inside, /1 and /2 queued, /3 refused at once: the queue holds 2.
    assert_eq!(*gate.entered.lock().unwrap(), ["/0"]);
    let refused = tasks.pop().unwrap().await.unwrap();
    assert_eq!(refused, (StatusCode::TOO_MANY_REQUESTS, Duration::ZERO));
    for (i, t) in tasks.into_iter().enumerate() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        gate.gate.add_permits(1);
        let (status, _) = t.await.unwrap();
        assert_eq!(status, StatusCode::OK, "request {i}");
        settle().await;
    }
    assert_eq!(*gate.entered.lock().unwrap(), ["/0", "/1", "/2"]);
    assert_eq!(gate.most.load(Ordering::SeqCst), 1);
    assert!(layer.store().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_is_refused_after_max_wait() {
    let gate = Gate::new();
    let layer = InFlightLimitLayer::builder(Global::new(), 1)
        .queue(5)
        .max_wait(Duration::from_millis(1500))
        .build()
        .unwrap();
    let g = gate.clone();
    let mut svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service_fn(move |req| g.clone().handle(req));
    let holder = tokio::spawn(svc.ready().await.unwrap().call(request("/0")));
    settle().await;
    let start = Instant::now();
    let r = svc
        .ready()
        .await
        .unwrap()
        .call(request("/1"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(start.elapsed(), Duration::from_millis(1500));
    assert_eq!(header(&r, "retry-after"), ["1"]);
    // It left the queue: the holder's slot, once back, goes to nobody.
    gate.gate.add_permits(1);
    let r = holder.await.unwrap().unwrap();
    drop(r);
    assert!(layer.store().is_empty());
    assert_eq!(*gate.entered.lock().unwrap(), ["/0"]);
}

#[tokio::test]
async fn a_dropped_queued_future_leaves_the_queue() {
    let layer = InFlightLimitLayer::builder(Global::new(), 1)
        .queue(1)
        .build()
        .unwrap();
    let svc = frames_service(layer.clone());
    let holder = svc.clone().oneshot(request("/")).await.unwrap();
    // Queued in `call`, then dropped (the client left) before it was ever polled.
    let queued = svc
        .clone()
        .ready_oneshot()
        .await
        .unwrap()
        .call(request("/"));
    drop(queued);
    // Its place is free again: another request can queue (not refused for a full queue),
    // and it gets the slot when the holder's body is dropped.
    let mut again = svc.clone();
    let waiting = tokio::spawn(again.ready().await.unwrap().call(request("/")));
    settle().await;
    assert!(!waiting.is_finished());
    drop(holder);
    let r = waiting.await.unwrap().unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "ratelimit"), ["\"inflight\";r=0"]);
    drop(r);
    assert!(layer.store().is_empty());
}

#[tokio::test]
async fn a_waiter_handed_a_slot_and_then_dropped_passes_it_on() {
    let layer = InFlightLimitLayer::builder(Global::new(), 1)
        .queue(2)
        .build()
        .unwrap();
    let svc = frames_service(layer.clone());
    let holder = svc.clone().oneshot(request("/")).await.unwrap();
    let first = svc
        .clone()
        .ready_oneshot()
        .await
        .unwrap()
        .call(request("/"));
    let second = tokio::spawn(
        svc.clone()
            .ready_oneshot()
            .await
            .unwrap()
            .call(request("/")),
    );
    settle().await;
    // The holder's slot goes to `first`, which is dropped before it picks it up.
    drop(holder);
    drop(first);
    let r = second.await.unwrap().unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    drop(r);
    assert!(layer.store().is_empty());
}

#[tokio::test]
async fn requests_without_a_key_follow_missing_key() {
    let key = || HeaderKey::new("x-api-key").unwrap();
    let hold = |layer: InFlightLimitLayer<HeaderKey, MemoryInFlight<_>>| {
        ServiceBuilder::new()
            .layer(layer)
            .service_fn(|_: Req| async { Ok::<_, Infallible>(Response::new(Body::from("x"))) })
    };
    // By default: refused with 400 and a problem body, nothing held.
    let layer = InFlightLimitLayer::new(key(), 1);
    let svc = hold(layer.clone());
    for _ in 0..3 {
        let r = svc.clone().oneshot(request("/")).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert_eq!(header(&r, "content-type"), ["application/problem+json"]);
    }
    assert!(layer.store().is_empty());
    // Shared: keyless requests share one set of slots, apart from keyed ones.
    let svc = hold(
        InFlightLimitLayer::builder(key(), 1)
            .on_missing_key(MissingKey::Shared)
            .build()
            .unwrap(),
    );
    let a = svc.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(a.status(), StatusCode::OK);
    let b = svc.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(b.status(), StatusCode::TOO_MANY_REQUESTS);
    let keyed_one = svc.clone().oneshot(keyed("k1")).await.unwrap();
    assert_eq!(keyed_one.status(), StatusCode::OK);
    // Reject: the status asked for, with a problem body, and nothing held.
    let layer = InFlightLimitLayer::builder(key(), 1)
        .on_missing_key(MissingKey::Reject(StatusCode::BAD_REQUEST))
        .build()
        .unwrap();
    let svc = hold(layer.clone());
    let r = svc.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(header(&r, "content-type"), ["application/problem+json"]);
    assert!(header(&r, "ratelimit").is_empty());
    assert!(layer.store().is_empty());
    // Allow: unlimited, without fields.
    let svc = hold(
        InFlightLimitLayer::builder(key(), 1)
            .on_missing_key(MissingKey::Allow)
            .build()
            .unwrap(),
    );
    let held: Vec<_> = futures_all(&svc, 3).await;
    for r in &held {
        assert_eq!(r.status(), StatusCode::OK);
        assert!(header(r, "ratelimit").is_empty());
    }
}

/// `n` keyless requests through `svc`, their responses held.
async fn futures_all<S>(svc: &S, n: usize) -> Vec<Response<InFlightBody<Body>>>
where
    S: Service<Req, Response = Response<InFlightBody<Body>>, Error = Infallible> + Clone,
{
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(svc.clone().oneshot(request("/")).await.unwrap());
    }
    out
}

#[tokio::test]
async fn keys_are_forgotten_once_nothing_is_in_flight() {
    let layer = InFlightLimitLayer::new(HeaderKey::new("x-api-key").unwrap(), 1);
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service_fn(|_: Req| async { Ok::<_, Infallible>(Response::new(Body::from("x"))) });
    let mut held = Vec::new();
    for i in 0..1000 {
        held.push(svc.clone().oneshot(keyed(&format!("k{i}"))).await.unwrap());
    }
    assert_eq!(layer.store().len(), 1000);
    for r in held.drain(..500) {
        assert_eq!(body_text(r).await, "x");
    }
    assert_eq!(layer.store().len(), 500);
    held.clear();
    assert!(layer.store().is_empty());
}

#[tokio::test]
async fn fields_combine_with_the_rate_layer() {
    let rate = RateLimitLayer::new(
        Global::new(),
        Limit::token_bucket(Quota::per_second(10).unwrap()).unwrap(),
    );
    let svc = ServiceBuilder::new()
        .layer(InFlightLimitLayer::new(Global::new(), 3))
        .layer(rate)
        .service_fn(|_: Req| async { Ok::<_, Infallible>(Response::new(Body::empty())) });
    let r = svc.oneshot(request("/")).await.unwrap();
    let policies = header(&r, "ratelimit-policy");
    assert_eq!(policies.len(), 2, "{policies:?}");
    assert!(policies.contains(&"\"inflight\";q=3;qu=\"concurrent-requests\"".to_owned()));
    let fields = header(&r, "ratelimit");
    assert!(
        fields.contains(&"\"inflight\";r=2".to_owned()),
        "{fields:?}"
    );
    assert_eq!(fields.len(), 2);
}

#[tokio::test]
async fn a_limit_of_zero_refuses_every_request() {
    let layer = InFlightLimitLayer::builder(Global::new(), 0)
        .queue(3)
        .build()
        .unwrap();
    let svc = frames_service(layer.clone());
    let r = svc.oneshot(request("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(layer.store().is_empty());
}

#[tokio::test]
async fn an_unprintable_label_is_refused_when_built() {
    let e = InFlightLimitLayer::builder(Global::new(), 1)
        .label("naïve")
        .build()
        .unwrap_err();
    assert_eq!(e, tollgate::ConfigError::InvalidName("naïve".into()));
}

#[tokio::test]
async fn end_to_end_on_axum_with_peer_ips() {
    use axum::{routing::get, Router};
    let gate = Arc::new(Semaphore::new(0));
    let entered = Arc::new(tokio::sync::Notify::new());
    let (g, e) = (gate.clone(), entered.clone());
    let app = Router::new()
        .route(
            "/export",
            get(move || {
                let (g, e) = (g.clone(), e.clone());
                async move {
                    e.notify_one();
                    g.acquire().await.unwrap().forget();
                    "csv"
                }
            }),
        )
        .layer(InFlightLimitLayer::new(tollgate::key::PeerIp::new(), 1));
    let addr = support::serve(app).await;
    let client = support::client();
    let url = format!("http://{addr}/export");
    let first = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { support::get(&client, &url, &[]).await }
    });
    entered.notified().await;
    let refused = support::get(&client, &url, &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("ratelimit"), Some("\"inflight\";r=0"));
    assert_eq!(refused.header("retry-after"), Some("1"));
    gate.add_permits(1);
    let got = first.await.unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.body, "csv");
    assert_eq!(got.header("ratelimit"), Some("\"inflight\";r=0"));
}

#[cfg(feature = "redis")]
mod on_redis {
    use std::sync::atomic::AtomicU32;

    use tollgate::error::StoreError;
    use tollgate::inflight::RedisInFlight;
    use tollgate::store::OnStoreError;
    use tollgate::store::{BreakerState, RedisConnection};

    use super::*;
    use crate::support::redis::{RedisServer, Target};

    type Layer = InFlightLimitLayer<HeaderKey, RedisInFlight>;

    /// A namespace of its own for each test, so tests can share an external server.
    fn namespace() -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        format!(
            "inflight-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
    }

    async fn store(url: &str, ns: &str, ttl: Duration) -> RedisInFlight {
        RedisInFlight::builder("limit")
            .namespace(ns)
            .lease_ttl(ttl)
            .deadline(Duration::from_millis(500))
            .build(RedisConnection::connect(url).await.unwrap())
            .unwrap()
    }

    fn layer(store: RedisInFlight, max: u32) -> Layer {
        InFlightLimitLayer::builder(HeaderKey::new("x-api-key").unwrap(), max)
            .build_with(store)
            .unwrap()
    }

    fn service(
        layer: Layer,
    ) -> impl Service<Req, Response = Response<InFlightBody<Body>>, Error = Infallible, Future: Send>
           + Clone {
        ServiceBuilder::new()
            .layer(layer)
            .service_fn(|_: Req| async { Ok::<_, Infallible>(Response::new(Body::from("x"))) })
    }

    /// Waits (real time, Redis keeps its own clock) until `key` has `n` live leases.
    async fn until_in_flight(store: &RedisInFlight, key: &str, n: u32, within: Duration) {
        let start = std::time::Instant::now();
        loop {
            let now = store.in_flight(key).await.unwrap();
            if now == n {
                return;
            }
            assert!(
                start.elapsed() < within,
                "{now} leases in flight after {:?}, expected {n}",
                start.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_instances_share_the_limit() {
        let Some(redis) = Target::get() else { return };
        let ns = namespace();
        let ttl = Duration::from_secs(30);
        let (a, b) = (
            store(&redis.url(), &ns, ttl).await,
            store(&redis.url(), &ns, ttl).await,
        );
        let (sa, sb) = (service(layer(a.clone(), 2)), service(layer(b.clone(), 2)));
        let r1 = sa.clone().oneshot(keyed("k")).await.unwrap();
        assert_eq!(r1.status(), StatusCode::OK);
        assert_eq!(header(&r1, "ratelimit"), ["\"inflight\";r=1"]);
        let r2 = sb.clone().oneshot(keyed("k")).await.unwrap();
        assert_eq!(r2.status(), StatusCode::OK);
        assert_eq!(header(&r2, "ratelimit"), ["\"inflight\";r=0"]);
        for svc in [&sa, &sb] {
            let r = svc.clone().oneshot(keyed("k")).await.unwrap();
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(
                header(&r, "ratelimit-policy"),
                ["\"inflight\";q=2;qu=\"concurrent-requests\""]
            );
        }
        // Other keys are independent.
        let other = sb.clone().oneshot(keyed("k2")).await.unwrap();
        assert_eq!(other.status(), StatusCode::OK);
        assert_eq!(a.in_flight("k").await.unwrap(), 2);
        assert_eq!((a.held(), b.held()), (1, 2));
        // Instance A's response ends: its lease goes back, and B may use the slot.
        assert_eq!(body_text(r1).await, "x");
        until_in_flight(&b, "k", 1, Duration::from_secs(2)).await;
        let r3 = sb.clone().oneshot(keyed("k")).await.unwrap();
        assert_eq!(r3.status(), StatusCode::OK);
        drop((r2, r3, other));
        until_in_flight(&a, "k", 0, Duration::from_secs(2)).await;
        assert_eq!((a.held(), b.held()), (0, 0));
    }

    #[test]
    fn a_killed_instance_has_its_leases_back_within_the_ttl() {
        let Some(redis) = Target::get() else { return };
        let (url, ns) = (redis.url(), namespace());
        let ttl = Duration::from_secs(1);
        // The doomed instance takes 2 of the 3 slots on its own runtime, then dies: its
        // runtime goes, and with it the renewal task; its responses are never dropped.
        let doomed = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        doomed.block_on(async {
            let svc = service(layer(store(&url, &ns, ttl).await, 3));
            for _ in 0..2 {
                let r = svc.clone().oneshot(keyed("k")).await.unwrap();
                assert_eq!(r.status(), StatusCode::OK);
                std::mem::forget(r);
            }
        });
        let died = std::time::Instant::now();
        drop(doomed);
        let live = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        live.block_on(async {
            let store = store(&url, &ns, ttl).await;
            let svc = service(layer(store.clone(), 3));
            let held = svc.clone().oneshot(keyed("k")).await.unwrap();
            assert_eq!(held.status(), StatusCode::OK);
            let r = svc.clone().oneshot(keyed("k")).await.unwrap();
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
            // The dead instance's leases expire within one TTL of its last renewal.
            until_in_flight(&store, "k", 1, ttl + Duration::from_millis(500)).await;
            assert!(died.elapsed() <= ttl + Duration::from_millis(500));
            // The live lease is renewed past its TTL, again and again.
            tokio::time::sleep(ttl * 3).await;
            assert_eq!(store.in_flight("k").await.unwrap(), 1);
            let two: Vec<_> = futures_keyed(&svc, "k", 2).await;
            assert!(two.iter().all(|r| r.status() == StatusCode::OK));
            let r = svc.clone().oneshot(keyed("k")).await.unwrap();
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
            drop((held, two));
            until_in_flight(&store, "k", 0, Duration::from_secs(2)).await;
        });
    }

    async fn futures_keyed<S>(svc: &S, key: &str, n: usize) -> Vec<Response<InFlightBody<Body>>>
    where
        S: Service<Req, Response = Response<InFlightBody<Body>>, Error = Infallible> + Clone,
    {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(svc.clone().oneshot(keyed(key)).await.unwrap());
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_queued_request_gets_the_slot_given_back_on_another_instance() {
        let Some(redis) = Target::get() else { return };
        let ns = namespace();
        let ttl = Duration::from_secs(30);
        let a = store(&redis.url(), &ns, ttl).await;
        let b = store(&redis.url(), &ns, ttl).await;
        let sa = service(layer(a, 1));
        let queued = InFlightLimitLayer::builder(HeaderKey::new("x-api-key").unwrap(), 1)
            .queue(1)
            .max_wait(Duration::from_secs(5))
            .build_with(b)
            .unwrap();
        let sb = service(queued);
        let holder = sa.clone().oneshot(keyed("k")).await.unwrap();
        let waiting = tokio::spawn(sb.clone().oneshot(keyed("k")));
        // The queue on this instance holds one: a second waiter is refused at once.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let r = sb.clone().oneshot(keyed("k")).await.unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(!waiting.is_finished());
        drop(holder);
        let r = waiting.await.unwrap().unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }

    /// A stalled Redis opens the breaker after its failures: the requests after it get the
    /// failure policy's answer without a call (none reaches Redis when it resumes, and no
    /// lease is given back for them), and once the cooldown has passed a probe closes it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_redis_opens_the_breaker_and_a_probe_closes_it() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let store = RedisInFlight::builder("limit")
            .namespace(namespace())
            .deadline(Duration::from_millis(100))
            .breaker(2, Duration::from_secs(1))
            .build(RedisConnection::connect(&server.url()).await.unwrap())
            .unwrap();
        assert_eq!(store.in_flight("k").await.unwrap(), 0);
        let before = server.settled_script_calls();
        server.stop();
        for _ in 0..2 {
            let e = store.in_flight("k").await.unwrap_err();
            assert!(matches!(e, StoreError::Timeout(_)), "{e:?}");
        }
        assert_eq!(store.breaker_state(), BreakerState::Open);
        let svc = service(layer(store.clone(), 1));
        for _ in 0..5 {
            let r = svc.clone().oneshot(keyed("k")).await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "fails open");
            drop(r);
        }
        let e = store.in_flight("k").await.unwrap_err();
        assert!(matches!(e, StoreError::CircuitOpen), "{e:?}");
        server.cont();
        let sent = server.settled_script_calls() - before;
        assert!(
            sent <= 2,
            "{sent} calls reached Redis after the breaker opened"
        );
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(store.in_flight("k").await.unwrap(), 0, "the probe");
        assert_eq!(store.breaker_state(), BreakerState::Closed);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_store_fails_open_or_closed() {
        let Some(mut server) = RedisServer::start() else {
            return;
        };
        let ns = namespace();
        let store = RedisInFlight::builder("limit")
            .namespace(&ns)
            .deadline(Duration::from_millis(50))
            .build(RedisConnection::connect(&server.url()).await.unwrap())
            .unwrap();
        server.kill();
        let open = service(layer(store.clone(), 1));
        for _ in 0..2 {
            let r = open.clone().oneshot(keyed("k")).await.unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            assert!(header(&r, "ratelimit").is_empty());
        }
        let closed = service(
            InFlightLimitLayer::builder(HeaderKey::new("x-api-key").unwrap(), 1)
                .on_store_error(OnStoreError::FailClosed)
                .build_with(store)
                .unwrap(),
        );
        let r = closed.oneshot(keyed("k")).await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&r, "content-type"), ["application/problem+json"]);
    }
}
