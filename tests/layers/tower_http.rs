//! tower-http's layers around every HTTP layer: `CorsLayer` and `TimeoutLayer` build
//! their own answers with the wrapped service's body type, so the layers' bodies must
//! have an empty `Default`. A preflight answered by `CorsLayer` is never charged.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use tollgate::fair::Share;
use tollgate::key::Global;
use tollgate::{FairLimitLayer, InFlightLimitLayer, Quota, RateLimitLayer};
use tower::{ServiceBuilder, ServiceExt};
use tower_http::cors::CorsLayer;
use tower_http::timeout::TimeoutLayer;

const ORIGIN: &str = "https://app.example.com";

fn cors() -> CorsLayer {
    CorsLayer::new()
        .allow_origin(HeaderValue::from_static(ORIGIN))
        .allow_methods([Method::GET])
}

fn preflight() -> Request<Body> {
    Request::options("/")
        .header("origin", ORIGIN)
        .header("access-control-request-method", "GET")
        .body(Body::empty())
        .unwrap()
}

fn get() -> Request<Body> {
    Request::get("/")
        .header("origin", ORIGIN)
        .body(Body::empty())
        .unwrap()
}

/// Three preflights, then three requests (or `$requests`) through `CorsLayer` around
/// `$limit` around a handler that takes `$work`, behind a 50 ms `TimeoutLayer`: their
/// statuses.
macro_rules! statuses {
    ($limit:expr, $work:expr) => {
        statuses!(
            $limit,
            $work,
            [preflight(), preflight(), preflight(), get(), get(), get()]
        )
    };
    ($limit:expr, $work:expr, $requests:expr) => {{
        let work: Duration = $work;
        let svc = ServiceBuilder::new()
            .layer(TimeoutLayer::with_status_code(
                StatusCode::SERVICE_UNAVAILABLE,
                Duration::from_millis(50),
            ))
            .layer(cors())
            .layer($limit)
            .service_fn(move |_: Request<Body>| async move {
                tokio::time::sleep(work).await;
                Ok::<_, Infallible>(Response::new(Body::from("ok")))
            });
        let mut out = Vec::new();
        for req in $requests {
            out.push(svc.clone().oneshot(req).await.unwrap().status().as_u16());
        }
        out
    }};
}

#[tokio::test(start_paused = true)]
async fn cors_and_timeout_wrap_the_rate_limit_and_preflights_are_not_charged() {
    let limit = RateLimitLayer::builder()
        .key(Global::new())
        .token_bucket(Quota::per_minute(2).unwrap())
        .build()
        .unwrap();
    assert_eq!(
        statuses!(limit, Duration::ZERO),
        [200, 200, 200, 200, 200, 429]
    );
}

#[tokio::test(start_paused = true)]
async fn cors_and_timeout_wrap_the_in_flight_limit() {
    // Each request outlives the timeout: the timeout's answer releases its slot, so the
    // next request finds one free.
    let limit = InFlightLimitLayer::new(Global::new(), 1);
    assert_eq!(
        statuses!(limit, Duration::from_secs(1)),
        [200, 200, 200, 503, 503, 503]
    );
}

#[tokio::test(start_paused = true)]
async fn cors_and_timeout_wrap_the_fair_limit() {
    let limit = || {
        let pool = Quota::per_minute(4).unwrap().with_burst(4).unwrap();
        let share = Share::new(Quota::per_minute(1).unwrap(), Quota::per_minute(1).unwrap());
        FairLimitLayer::builder(Global::new(), pool)
            .share(share.unwrap())
            .build()
            .unwrap()
    };
    // The three requests are answered as without the preflights before them, and the
    // layer does refuse some: preflights are not charged.
    let with_preflights = statuses!(limit(), Duration::ZERO);
    let alone = statuses!(limit(), Duration::ZERO, [get(), get(), get()]);
    assert_eq!(with_preflights[..3], [200; 3]);
    assert_eq!(with_preflights[3..], alone[..]);
    assert!(alone.contains(&429), "{alone:?}");
}
