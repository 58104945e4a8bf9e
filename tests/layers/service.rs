//! The middleware as a tower `Service`, under paused tokio time: the delay queue's waits,
//! order and bound, slots given back by dropped waiters, composition with `tower::retry`
//! and `tower::timeout`, and the bounds axum requires.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tollgate::{generic::RateLimited, key::key_fn, key::Global, Quota, RateLimitLayer};
use tower::BoxError;
use tower::{Service, ServiceBuilder, ServiceExt};

type Req = Request<Body>;

fn request(i: usize) -> Req {
    Request::builder()
        .uri(format!("/{i}"))
        .body(Body::empty())
        .unwrap()
}

/// A leaky queue at 10/s (one slot every 100 ms) with a queue of 5, and a handler that
/// records the order it serves requests in.
fn queued(
    served: Arc<Mutex<Vec<usize>>>,
) -> impl Service<
    Req,
    Response = Response<tollgate::response::RateLimitBody<Body>>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send {
    let layer = RateLimitLayer::builder()
        .key(Global::new())
        .leaky_queue(Quota::per_second(10).unwrap(), 5)
        .build()
        .unwrap();
    ServiceBuilder::new()
        .layer(layer)
        .service_fn(move |req: Req| {
            let served = served.clone();
            async move {
                let i: usize = req.uri().path()[1..].parse().unwrap();
                served.lock().unwrap().push(i);
                Ok::<_, Infallible>(Response::new(Body::empty()))
            }
        })
}

#[tokio::test(start_paused = true)]
async fn queue_waits_order_and_bound() {
    let served = Arc::new(Mutex::new(Vec::new()));
    let svc = queued(served.clone());
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let mut svc = svc.clone();
        // Each call decides at once (in `call`); the queued ones then sleep to their slot.
        let fut = svc.ready().await.unwrap().call(request(i));
        tasks.push(tokio::spawn(async move {
            let r = fut.await.unwrap();
            (i, r.status(), start.elapsed())
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    // 1 immediate + 5 queued at 100 ms spacing; requests 6 and 7 overflow the queue.
    for (i, status, at) in &results {
        if *i < 6 {
            assert_eq!(*status, StatusCode::OK);
            assert_eq!(*at, Duration::from_millis(100 * *i as u64), "request {i}");
        } else {
            assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(*at, Duration::ZERO, "refusals are immediate");
        }
    }
    assert_eq!(
        *served.lock().unwrap(),
        vec![0, 1, 2, 3, 4, 5],
        "served in slot order"
    );
}

#[tokio::test(start_paused = true)]
async fn dropped_waiters_give_their_slots_back() {
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut svc = queued(served.clone());
    // Fill the bucket's immediate slot so that every further request is queued.
    svc.ready().await.unwrap().call(request(0)).await.unwrap();
    // 10 000 clients that queue and go away before their slot.
    for i in 0..10_000 {
        let fut = svc.ready().await.unwrap().call(request(i));
        drop(fut);
    }
    // The queue is as usable as before: 5 queued requests at 100 ms spacing, then a refusal.
    let start = Instant::now();
    let mut futs = Vec::new();
    for i in 0..6 {
        futs.push(svc.ready().await.unwrap().call(request(100 + i)));
    }
    let mut statuses = Vec::new();
    for f in futs {
        let r = f.await.unwrap();
        statuses.push((r.status().as_u16(), start.elapsed()));
    }
    assert_eq!(
        statuses,
        vec![
            (200, Duration::from_millis(100)),
            (200, Duration::from_millis(200)),
            (200, Duration::from_millis(300)),
            (200, Duration::from_millis(400)),
            (200, Duration::from_millis(500)),
            (429, Duration::from_millis(500)),
        ]
    );
    assert_eq!(
        served.lock().unwrap().len(),
        6,
        "dropped waiters never reached the handler"
    );
}

/// A retry policy that waits exactly the advertised retry-after of a refusal.
#[derive(Clone)]
struct HonourRetryAfter {
    attempts: usize,
    waited: Arc<Mutex<Vec<Duration>>>,
}

impl<Req: Clone, Res> tower::retry::Policy<Req, Res, BoxError> for HonourRetryAfter {
    type Future = tokio::time::Sleep;

    fn retry(&mut self, _: &mut Req, result: &mut Result<Res, BoxError>) -> Option<Self::Future> {
        let wait = result
            .as_ref()
            .err()?
            .downcast_ref::<RateLimited>()?
            .retry_after()?;
        if self.attempts == 0 {
            return None;
        }
        self.attempts -= 1;
        self.waited.lock().unwrap().push(wait);
        Some(tokio::time::sleep(wait))
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

#[tokio::test(start_paused = true)]
async fn retry_honours_retry_after_through_timeout_and_the_layer() {
    let layer = tollgate::generic::RateLimitLayer::builder()
        .key(key_fn(|call: &&'static str| Some(*call)))
        .token_bucket(Quota::per_second(4).unwrap().with_burst(2).unwrap())
        .build::<&'static str>()
        .unwrap();
    let waited = Arc::new(Mutex::new(Vec::new()));
    let mut svc = ServiceBuilder::new()
        .retry(HonourRetryAfter {
            attempts: 3,
            waited: waited.clone(),
        })
        .timeout(Duration::from_secs(5))
        .layer(layer)
        .service_fn(|call: &'static str| async move { Ok::<_, BoxError>(call.len()) });
    let start = Instant::now();
    // Burst of 2 passes at once; the third is refused with retry-after 250 ms, retried
    // after exactly that wait, and succeeds.
    for _ in 0..2 {
        assert_eq!(svc.ready().await.unwrap().call("api").await.unwrap(), 3);
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(svc.ready().await.unwrap().call("api").await.unwrap(), 3);
    assert_eq!(*waited.lock().unwrap(), vec![Duration::from_millis(250)]);
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(250),
        "retried exactly at retry-after"
    );
}

#[tokio::test(start_paused = true)]
async fn generic_queue_makes_clients_wait_for_their_slot() {
    let layer = tollgate::generic::RateLimitLayer::builder()
        .key(key_fn(|_: &u32| Some(())))
        .leaky_queue(Quota::per_second(5).unwrap(), 20)
        .build::<u32>()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|n: u32| async move { Ok::<_, BoxError>((n, Instant::now())) });
    let start = Instant::now();
    let mut futs = Vec::new();
    for n in 0..5 {
        let mut s = svc.clone();
        futs.push(s.ready().await.unwrap().call(n));
    }
    for (i, f) in futs.into_iter().enumerate() {
        let (_, at) = f.await.unwrap();
        assert_eq!(at - start, Duration::from_millis(200 * i as u64));
    }
}

#[test]
fn building_outside_a_runtime_does_not_panic() {
    let layer = RateLimitLayer::builder()
        .key(Global::new())
        .leaky_queue(Quota::per_second(1).unwrap(), 1)
        .build()
        .unwrap();
    let router: axum::Router = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    // It then serves inside a runtime created later.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let req = Request::builder().uri("/").body(Body::empty()).unwrap();
    let status = rt.block_on(async move { router.oneshot(req).await.unwrap().status() });
    assert_eq!(status, StatusCode::OK);
}

#[test]
fn invalid_quota_is_refused_when_the_layer_is_built() {
    let err = RateLimitLayer::builder()
        .key(Global::new())
        .leaky_meter(Quota::per_second(5).unwrap().with_burst(3).unwrap())
        .build()
        .unwrap_err();
    assert!(matches!(err, tollgate::ConfigError::BurstNotApplicable(_)));
    let err = RateLimitLayer::builder()
        .key(Global::new())
        .build()
        .unwrap_err();
    assert_eq!(err, tollgate::ConfigError::NoLimits);
}

/// Compiles only if the layer meets `Router::layer`'s bounds and the service and future are
/// `Send` (and the layer `Sync`).
#[test]
fn layer_meets_router_bounds() {
    fn router_layer<L>(l: L) -> axum::Router
    where
        L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
        L::Service: Service<Req> + Clone + Send + Sync + 'static,
        <L::Service as Service<Req>>::Response: axum::response::IntoResponse + 'static,
        <L::Service as Service<Req>>::Error: Into<Infallible> + 'static,
        <L::Service as Service<Req>>::Future: Send + 'static,
    {
        axum::Router::new()
            .route("/", axum::routing::get(|| async {}))
            .layer(l)
    }
    let layer = RateLimitLayer::builder()
        .key(tollgate::key::PeerIp::new())
        .token_bucket(Quota::per_second(1).unwrap())
        .build()
        .unwrap();
    // The service's own parts (the shared limiter) are Send + Sync.
    fn send_sync_of<T: Send + Sync>(_: &T) {}
    let inner = tower::service_fn(|_: http::Request<axum::body::Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
    });
    send_sync_of(&tower::Layer::layer(&layer, inner));
    let _ = router_layer(layer.clone());
    let _ = axum::Router::<()>::new()
        .route("/", axum::routing::get(|| async {}))
        .route_layer(layer.clone());
    let _: axum::routing::MethodRouter<()> = axum::routing::get(|| async {}).layer(layer);
}

#[tokio::test]
async fn readiness_is_forwarded_not_reserved() {
    let layer = RateLimitLayer::builder()
        .key(Global::new())
        .token_bucket(Quota::per_minute(1).unwrap())
        .build()
        .unwrap();
    let (mock, mut handle) = tower_test::mock::pair::<Req, Response<Body>>();
    let mut svc = tower_test::mock::Spawn::new(ServiceBuilder::new().layer(layer).service(mock));
    handle.allow(0);
    assert!(
        svc.poll_ready().is_pending(),
        "inner not ready -> layer not ready"
    );
    handle.allow(1);
    assert!(svc.poll_ready().is_ready());
    // Polling readiness many times does not spend the quota.
    for _ in 0..10 {
        assert!(svc.poll_ready().is_ready());
    }
    let fut = svc.call(request(0));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_response(Response::new(Body::empty()));
    assert_eq!(fut.await.unwrap().status(), StatusCode::OK);
}

/// Regression: a queued request dropped in the very tick of its slot (its timeout due at
/// the same instant) had already been handed to the inner service and stayed charged, so
/// the daily window and the queue kept a unit for a request that never got an answer.
/// Now a queued request yields once when its slot comes: a timeout due at that instant
/// drops it first, and every unit of every request dropped before the inner service had
/// it goes back to every limit.
#[tokio::test(start_paused = true)]
async fn dropped_waiters_give_every_unit_back_to_every_limit() {
    use tollgate::Limit;
    let layer = tollgate::generic::RateLimitLayer::builder()
        .key(Global::new())
        .leaky_queue(Quota::per_second(10).unwrap(), 20)
        .limit(Limit::fixed_window(Quota::per_day(1000).unwrap()).unwrap())
        .build::<u32>()
        .unwrap();
    let inspect = layer.clone();
    let store = inspect.store();
    let svc = ServiceBuilder::new()
        .timeout(Duration::from_millis(1500))
        .layer(layer)
        .service_fn(|n: u32| async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok::<_, BoxError>(n)
        });
    let mut tasks = Vec::new();
    for n in 0..30u32 {
        let mut s = svc.clone();
        let fut = s.ready().await.unwrap().call(n);
        tasks.push(tokio::spawn(fut));
    }
    let (mut served, mut timed_out, mut refused) = (0, 0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => served += 1,
            Err(e) if e.is::<tower::timeout::error::Elapsed>() => timed_out += 1,
            Err(e) => {
                assert!(e.is::<RateLimited>());
                refused += 1
            }
        }
    }
    // Slots at 0, 100, ..., 2000 ms; the 1500 ms timeout takes the slots from 1500 on.
    assert_eq!((served, timed_out, refused), (15, 6, 9));
    let now = store.peek(&Some(()), 0);
    assert_eq!(now.limits()[1].remaining(), 985, "the day charged 15");
    assert_eq!(
        now.limits()[0].reset_after(),
        Duration::ZERO,
        "the queue is empty"
    );
}

/// Regression: a state that could not happen (the request or the service already taken,
/// as after a panic in the inner service) made the future return `Pending` forever with
/// nothing to wake it. States now own their values; such a future fails loudly.
#[tokio::test(start_paused = true)]
async fn a_future_polled_again_after_the_inner_service_panicked_fails_loudly() {
    use std::future::Future;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::task::Context;
    let layer = tollgate::generic::RateLimitLayer::builder()
        .key(Global::new())
        .leaky_queue(Quota::per_second(10).unwrap(), 5)
        .build::<u32>()
        .unwrap();
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(
        |n: u32| -> std::future::Ready<Result<u32, BoxError>> {
            assert!(n != 1, "the handler panics on request 1");
            std::future::ready(Ok(n))
        },
    );
    svc.ready().await.unwrap().call(0).await.unwrap();
    let mut queued = Box::pin(svc.ready().await.unwrap().call(1));
    tokio::time::advance(Duration::from_millis(100)).await;
    let mut cx = Context::from_waker(std::task::Waker::noop());
    // The slot has come: the first poll yields once, the second calls the handler.
    assert!(queued.as_mut().poll(&mut cx).is_pending());
    let panicked = catch_unwind(AssertUnwindSafe(|| queued.as_mut().poll(&mut cx)));
    assert!(panicked.is_err(), "the handler's panic goes through");
    let again = catch_unwind(AssertUnwindSafe(|| queued.as_mut().poll(&mut cx)));
    let message = again.expect_err("polled again, it fails loudly instead of hanging");
    assert!(
        message
            .downcast_ref::<String>()
            .is_some_and(|m| m.contains("polled after it completed")),
        "{message:?}"
    );
}
