//! Deadline-aware queues: a queued request is never held past its caller's deadline
//! (`grpc-timeout`, `x-envoy-expected-rq-timeout-ms`, a header the layer names, or a
//! `Deadline` in the extensions). A rate limit refuses it at once, with the time its slot
//! would have come as its retry-after, and gives the slot to the next request; an
//! in-flight limit takes it out of its queue at its deadline. Such refusals are counted
//! apart. Paused time throughout: every wait below is exact.

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tokio::{sync::Semaphore, time::Instant};
use tollgate::generic::{self, RateLimited};
use tollgate::key::{key_fn, Global};
use tollgate::{Deadline, InFlightLimitLayer, Quota, RateLimitLayer};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

const SLOT: Duration = Duration::from_millis(300);

fn get(headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::builder().uri("/queue");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::empty()).unwrap()
}

/// A queue of one request every 300 ms (queue of 10): the first request takes the slot
/// that is free now, the next waits 300 ms.
fn queue_layer() -> RateLimitLayer {
    RateLimitLayer::builder()
        .leaky_queue(Quota::every(SLOT).unwrap(), 10)
        .deadline_header("x-deadline-ms")
        .label("queue")
        .build()
        .unwrap()
}

async fn ok(_: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("served")))
}

/// Sends `req` and returns its status, `Retry-After`, and how long it took.
async fn send<S, B>(svc: &mut S, req: Request<Body>) -> (StatusCode, Option<String>, Duration)
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
{
    let t = Instant::now();
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    let retry = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (res.status(), retry, t.elapsed())
}

/// The case: a queued request with a 100 ms `grpc-timeout` and a 300 ms slot is
/// refused at once with its retry-after, and the next request gets the unspent slot (300
/// ms, not 600 ms). On the queue without deadlines, the second request waited 300 ms and
/// was served past its caller's deadline, and the third waited 600 ms.
#[tokio::test(start_paused = true)]
async fn a_grpc_timeout_shorter_than_the_slot_is_refused_at_once_and_the_slot_stays_free() {
    let mut svc = ServiceBuilder::new().layer(queue_layer()).service_fn(ok);
    assert_eq!(send(&mut svc, get(&[])).await.2, Duration::ZERO);

    let (status, retry, took) = send(&mut svc, get(&[("grpc-timeout", "100m")])).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry.as_deref(), Some("1"), "300 ms, rounded up to seconds");
    assert_eq!(took, Duration::ZERO, "refused at once, not at its deadline");

    let (status, _, took) = send(&mut svc, get(&[])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(took, SLOT, "the refused request's slot went to this one");
}

/// A deadline at the slot is met (the request is served at its deadline); a deadline 1 ms
/// short of it is not. Envoy's header, the layer's own header and a `Deadline` in the
/// extensions are read alike, and the earliest of them counts.
#[tokio::test(start_paused = true)]
async fn every_source_of_deadlines_is_read_and_the_earliest_counts() {
    let mut svc = ServiceBuilder::new().layer(queue_layer()).service_fn(ok);
    send(&mut svc, get(&[])).await; // the free slot
    let at_slot = [("x-envoy-expected-rq-timeout-ms", "300")];
    let (status, _, took) = send(&mut svc, get(&at_slot)).await;
    assert_eq!((status, took), (StatusCode::OK, SLOT));

    // The next slot is 300 ms away again.
    for short in [
        get(&[("x-envoy-expected-rq-timeout-ms", "299")]),
        get(&[("x-deadline-ms", "299"), ("grpc-timeout", "5S")]),
        {
            let mut r = get(&[("x-envoy-expected-rq-timeout-ms", "60000")]);
            r.extensions_mut()
                .insert(Deadline::after(Duration::from_millis(299)));
            r
        },
    ] {
        let (status, _, took) = send(&mut svc, short).await;
        assert_eq!(
            (status, took),
            (StatusCode::TOO_MANY_REQUESTS, Duration::ZERO)
        );
    }
    // A malformed value is no deadline: queued as usual.
    let (status, _, took) = send(&mut svc, get(&[("grpc-timeout", "soon")])).await;
    assert_eq!((status, took), (StatusCode::OK, SLOT));
}

struct Job {
    deadline: Option<Deadline>,
}

/// The generic layer's typed error says the request was refused for its deadline, with
/// the exact wait its slot had, not rounded; the slot goes to the next job.
#[tokio::test(start_paused = true)]
async fn the_generic_layer_says_the_refusal_was_for_the_deadline() {
    let layer = generic::RateLimitLayer::builder()
        .key(key_fn(|_: &Job| Some(())))
        .leaky_queue(Quota::every(SLOT).unwrap(), 10)
        .deadline(|job: &Job| job.deadline)
        .build::<Job>()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: Job| async { Ok::<_, BoxError>(()) });
    async fn call<S>(svc: &mut S, deadline: Option<Duration>) -> Result<(), BoxError>
    where
        S: Service<Job, Response = (), Error = BoxError>,
    {
        let job = Job {
            deadline: deadline.map(Deadline::after),
        };
        svc.ready().await?.call(job).await
    }
    call(&mut svc, None).await.unwrap();
    let t = Instant::now();
    let err = call(&mut svc, Some(Duration::from_millis(100)))
        .await
        .unwrap_err();
    assert_eq!(t.elapsed(), Duration::ZERO);
    let refused = err.downcast_ref::<RateLimited>().expect("a RateLimited");
    assert!(refused.is_past_deadline());
    assert_eq!(refused.retry_after(), Some(SLOT));
    assert!(refused.to_string().contains("deadline"), "{refused}");
    call(&mut svc, None).await.unwrap();
    assert_eq!(t.elapsed(), SLOT, "the next job took the unspent slot");

    // An ordinary refusal (the queue full) is not a deadline's.
    let full = generic::RateLimitLayer::builder()
        .key(Global::new())
        .leaky_queue(Quota::every(SLOT).unwrap(), 0)
        .build::<Job>()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(full)
        .service_fn(|_: Job| async { Ok::<_, BoxError>(()) });
    svc.ready()
        .await
        .unwrap()
        .call(Job { deadline: None })
        .await
        .unwrap();
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(Job { deadline: None })
        .await
        .unwrap_err();
    assert!(!err
        .downcast_ref::<RateLimited>()
        .unwrap()
        .is_past_deadline());
}

/// An in-flight limit's waiting request leaves the queue at its deadline (100 ms, not
/// the layer's 10 s), refused; the slot, when it frees, goes to the next waiter.
#[tokio::test(start_paused = true)]
async fn an_in_flight_queue_lets_a_request_go_at_its_deadline() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = InFlightLimitLayer::builder(Global::new(), 1)
        .queue(4)
        .max_wait(Duration::from_secs(10))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn({
        let gate = Arc::clone(&gate);
        move |_: Request<Body>| {
            let gate = Arc::clone(&gate);
            async move {
                gate.acquire().await.unwrap().forget();
                Ok::<_, Infallible>(Response::new(Body::empty()))
            }
        }
    });
    let holder = tokio::spawn(svc.clone().oneshot(get(&[])));
    tokio::task::yield_now().await;
    let t = Instant::now();
    let late = svc
        .clone()
        .oneshot(get(&[("grpc-timeout", "100m")]))
        .await
        .unwrap();
    assert_eq!(late.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(t.elapsed(), Duration::from_millis(100));
    // Marked as such: its own problem type, not `quota-exceeded`.
    let body = http_body_util::BodyExt::collect(late.into_body())
        .await
        .unwrap()
        .to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body["type"],
        "https://docs.rs/tollgate/latest/tollgate/response/index.html#queued-past-the-deadline"
    );
    let next = tokio::spawn(svc.clone().oneshot(get(&[])));
    tokio::task::yield_now().await;
    gate.add_permits(2);
    assert_eq!(holder.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(next.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(
        t.elapsed(),
        Duration::from_millis(100),
        "no wait after the slot freed"
    );
}

/// A counter's name, labels and value.
#[cfg(feature = "metrics")]
type Series = (String, Vec<(String, String)>, u64);

/// Refusals for a deadline are counted apart from the other refusals, in both layers.
#[cfg(feature = "metrics")]
#[test]
fn deadline_refusals_are_counted_apart() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let mut svc = ServiceBuilder::new().layer(queue_layer()).service_fn(ok);
            send(&mut svc, get(&[])).await;
            send(&mut svc, get(&[("grpc-timeout", "1m")])).await;
            send(&mut svc, get(&[("grpc-timeout", "2m")])).await;
            let inflight = InFlightLimitLayer::builder(Global::new(), 1)
                .queue(1)
                .label("slots")
                .build()
                .unwrap();
            let svc = ServiceBuilder::new()
                .layer(inflight)
                .service_fn(|_: Request<Body>| {
                    std::future::pending::<Result<Response<Body>, Infallible>>()
                });
            let mut holder = Box::pin(svc.clone().oneshot(get(&[])));
            assert!(futures_poll(&mut holder).await);
            let late = svc.oneshot(get(&[("grpc-timeout", "1m")])).await.unwrap();
            assert_eq!(late.status(), StatusCode::TOO_MANY_REQUESTS);
        })
    });
    let series: Vec<Series> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(ck, _, _, v)| match v {
            DebugValue::Counter(n) => {
                let k = ck.key();
                let labels = k
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                Some((k.name().to_owned(), labels, n))
            }
            _ => None,
        })
        .collect();
    let counted = |name: &str, limiter: &str, result: &str| -> u64 {
        let has = |labels: &[(String, String)], k: &str, v: &str| {
            labels.iter().any(|(lk, lv)| lk == k && lv == v)
        };
        series
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && has(l, "tollgate.limiter", limiter)
                    && has(l, "tollgate.result", result)
            })
            .map(|(.., n)| n)
            .sum()
    };
    assert_eq!(
        counted("tollgate.rate_limit.requests_total", "queue", "deadline"),
        2
    );
    assert_eq!(
        counted("tollgate.rate_limit.requests_total", "queue", "refused"),
        0
    );
    assert_eq!(
        counted("tollgate.rate_limit.requests_total", "queue", "delayed"),
        0
    );
    assert_eq!(
        counted("tollgate.in_flight.requests_total", "slots", "deadline"),
        1
    );
    assert_eq!(
        counted("tollgate.in_flight.requests_total", "slots", "refused"),
        0
    );
}

/// Polls `f` once: whether it is still pending.
#[cfg(feature = "metrics")]
async fn futures_poll<F: std::future::Future + Unpin>(f: &mut F) -> bool {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::pin::Pin::new(&mut *f).poll(cx).is_pending())
    })
    .await
}
