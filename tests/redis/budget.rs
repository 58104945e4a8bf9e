//! One store deadline per request, however many Redis-backed layers it passes: the HTTP
//! layers share one budget through the request's extensions, so while Redis stalls the
//! second layer decides from its fallback at once.

use std::time::{Duration, Instant};

use crate::support::redis::RedisServer;
use axum::{routing::get, Router};
use http::Request;
use tollgate::key::HeaderKey;
use tollgate::store::{RedisConnection, RedisStore};
use tollgate::{Limit, Quota, RateLimitLayer};
use tower::ServiceExt;

/// Long enough that the machine's own stalls do not blur one deadline and two.
const DEADLINE: Duration = Duration::from_millis(300);

/// Regression: a request through two Redis-backed layers waited one deadline per layer
/// while Redis was stopped (43.6 ms at the default 20 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_layers_wait_one_deadline_while_redis_is_stopped() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let layer = |namespace: &'static str| {
        let url = server.url();
        async move {
            let store = RedisStore::builder(
                "limit",
                Limit::token_bucket(Quota::per_second(100).unwrap()).unwrap(),
            )
            .namespace(namespace)
            .deadline(DEADLINE)
            .build(RedisConnection::connect(&url).await.unwrap())
            .unwrap();
            RateLimitLayer::builder()
                .key(HeaderKey::new("x-api-key").unwrap())
                .build_with(store)
                .unwrap()
        }
    };
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer("route").await)
        .layer(layer("edge").await);
    let request = || {
        Request::get("/")
            .header("x-api-key", "client")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    // Redis answers: both layers decide on it.
    let response = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(response.status(), 200);

    server.stop();
    let start = Instant::now();
    let response = app.clone().oneshot(request()).await.unwrap();
    let waited = start.elapsed();
    server.cont();
    assert_eq!(response.status(), 200, "both fallbacks admit");
    assert!(
        waited >= DEADLINE,
        "the first layer waits its deadline: {waited:?}"
    );
    assert!(
        waited < DEADLINE + DEADLINE / 2,
        "the second layer decides at once, without a deadline of its own: {waited:?}"
    );
}
