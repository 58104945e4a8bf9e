//! Reading a limit by its name: `Decision::limit`, and a layer's `peek`, which reads what a
//! key has left with the key as the extractor gives it (not the store's `Option` of it).

use crate::support::{self, FailingStore};
use axum::{routing::get, Extension, Router};
use http::StatusCode;
use tollgate::key::{key_fn, Global, HeaderKey};
use tollgate::store::OnStoreError;
use tollgate::{Decision, Policy, RateLimitLayer};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

const TWO_LIMITS: &str = "second: 10/s burst 20, daily: 1000/day window";

async fn get_ok(app: &Router, key: Option<&str>) -> StatusCode {
    let headers: Vec<(&str, &str)> = key.map(|k| ("x-key", k)).into_iter().collect();
    support::status_of(app, "/", &headers).await
}

#[tokio::test]
async fn a_global_layer_reads_the_daily_count_by_name_without_the_stores_key_type() {
    let layer = RateLimitLayer::new(Global::new(), TWO_LIMITS.parse::<Policy>().unwrap());
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());
    for _ in 0..3 {
        assert_eq!(get_ok(&app, None).await, StatusCode::OK);
    }
    let now = layer.peek(()).await.unwrap();
    assert_eq!(now.limit("daily").map(|l| l.remaining()), Some(997));
    assert_eq!(now.limit("second").map(|l| l.remaining()), Some(17));
    assert_eq!(now.limit("daily").map(|l| l.index()), Some(1));
    assert!(now.limit("weekly").is_none());
    assert!(now.limit("Daily").is_none());
    // Peeking spends nothing.
    assert_eq!(
        layer
            .peek(())
            .await
            .unwrap()
            .limit("daily")
            .unwrap()
            .remaining(),
        997
    );
}

#[tokio::test]
async fn a_keyed_layer_peeks_a_key_by_its_value() {
    let layer = RateLimitLayer::new(
        HeaderKey::new("x-key").unwrap(),
        "daily: 5/day window".parse::<Policy>().unwrap(),
    );
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());
    for _ in 0..2 {
        assert_eq!(get_ok(&app, Some("alice")).await, StatusCode::OK);
    }
    let left = |d: Decision| d.limit("daily").unwrap().remaining();
    assert_eq!(left(layer.peek("alice").await.unwrap()), 3);
    assert_eq!(left(layer.peek("bob").await.unwrap()), 5);
}

#[tokio::test]
async fn the_generic_layer_peeks_too() {
    let layer = tollgate::generic::RateLimitLayer::builder()
        .key(key_fn(|n: &u32| Some(*n)))
        .policy(TWO_LIMITS)
        .build::<u32>()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|_: u32| async {
            Ok::<_, std::convert::Infallible>(())
        }));
    svc.ready().await.unwrap().call(7).await.unwrap();
    let d = layer.peek(7).await.unwrap();
    assert_eq!(d.limit("daily").unwrap().remaining(), 999);
    assert_eq!(d.limit("second").unwrap().remaining(), 19);
}

/// A decision made without the store (here: it failed, and the layer fails open) still
/// names its limits.
#[tokio::test]
async fn a_fail_open_decision_names_its_limits() {
    let layer = RateLimitLayer::builder()
        .key(Global::new())
        .policy(TWO_LIMITS)
        .on_store_error(OnStoreError::FailOpen)
        .expose_decision(true)
        .build_with(FailingStore)
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|Extension(d): Extension<Decision>| async move {
                match d.limit("daily") {
                    Some(_) => StatusCode::OK,
                    None => StatusCode::INTERNAL_SERVER_ERROR,
                }
            }),
        )
        .layer(layer);
    assert_eq!(get_ok(&app, None).await, StatusCode::OK);
}
