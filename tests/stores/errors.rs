//! A store that fails: `OnStoreError` decides, for an error known at once and for one that
//! arrives after the store's future was pending, on HTTP and on the generic service.

use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tollgate::decision::Source;
use tollgate::error::StoreError;
use tollgate::generic::RateLimited;
use tollgate::key::Global;
use tollgate::store::OnStoreError;
use tollgate::store::{Store, StoreFuture};
use tollgate::Decision;
use tollgate::Limit;
use tollgate::Policy;
use tollgate::Quota;
use tollgate::RateLimitLayer;
use tower::BoxError;
use tower::{ServiceBuilder, ServiceExt};

/// Always fails: at once, or after yielding once (like a network store that times out).
struct Broken {
    policy: Policy,
    pending: bool,
}

impl Broken {
    fn new(pending: bool) -> Self {
        Broken {
            policy: Policy::new(Limit::token_bucket(Quota::per_second(1).unwrap()).unwrap()),
            pending,
        }
    }
}

impl Store<Option<()>> for Broken {
    fn default_policy(&self) -> Option<Policy> {
        Some(self.policy.clone())
    }
    fn decide(&self, _: &Option<()>, _: &Policy, _: u64) -> StoreFuture<Decision> {
        let err = StoreError::Timeout(Duration::from_millis(20));
        if self.pending {
            StoreFuture::boxed(async move {
                tokio::task::yield_now().await;
                Err(err)
            })
        } else {
            StoreFuture::ready(Err(err))
        }
    }
    fn preview(&self, key: &Option<()>, policy: &Policy, cost: u64) -> StoreFuture<Decision> {
        self.decide(key, policy, cost)
    }
    fn refund(&self, _: &Option<()>, _: &Policy, _: u64) {}
    fn settle(&self, _: &Option<()>, _: &Policy, _: u64, _: u64) -> StoreFuture<()> {
        StoreFuture::ready(Err(StoreError::backend("connection refused")))
    }
    fn reset(&self, _: &Option<()>) -> StoreFuture<()> {
        StoreFuture::ready(Err(StoreError::backend("connection refused")))
    }
    fn ban(&self, _: &Option<()>, _: &Policy, _: Duration) -> StoreFuture<()> {
        StoreFuture::ready(Err(StoreError::backend("connection refused")))
    }
}

/// `on_error: None` leaves the builder's default.
async fn http_status(
    on_error: Option<OnStoreError>,
    pending: bool,
) -> (StatusCode, String, Option<Source>) {
    let mut builder = RateLimitLayer::builder()
        .key(Global::new())
        .expose_decision(true);
    if let Some(on_error) = on_error {
        builder = builder.on_store_error(on_error);
    }
    let layer = builder.build_with(Broken::new(pending)).unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|req: Request<Body>| async move {
            let source = req.extensions().get::<Decision>().map(|d| d.source());
            let mut r = Response::new(Body::empty());
            r.extensions_mut().insert(source);
            Ok::<_, std::convert::Infallible>(r)
        });
    let r = svc.oneshot(Request::new(Body::empty())).await.unwrap();
    let source = r.extensions().get::<Option<Source>>().copied().flatten();
    let status = r.status();
    let body = axum::body::to_bytes(axum::body::Body::new(r.into_body()), 4096)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap(), source)
}

#[tokio::test]
async fn http_fails_open_by_default_and_closed_on_request() {
    for pending in [false, true] {
        let (status, _, source) = http_status(None, pending).await;
        assert_eq!(status, StatusCode::OK, "pending {pending}");
        assert_eq!(
            source,
            Some(Source::FailOpen),
            "the decision says why it passed"
        );

        let (status, body, _) = http_status(Some(OnStoreError::FailClosed), pending).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "pending {pending}");
        assert!(body.contains("temporary-reduced-capacity"), "{body}");
    }
}

#[tokio::test]
async fn generic_fail_closed_returns_the_store_error() {
    for pending in [false, true] {
        let layer = tollgate::generic::RateLimitLayer::builder()
            .key(tollgate::key::key_fn(|_: &u32| Some(())))
            .on_store_error(OnStoreError::FailClosed)
            .build_with::<u32, _>(Broken::new(pending))
            .unwrap();
        let svc = ServiceBuilder::new()
            .layer(layer)
            .service_fn(|n: u32| async move { Ok::<_, BoxError>(n) });
        let err = svc.oneshot(7).await.unwrap_err();
        assert!(err.downcast_ref::<StoreError>().is_some(), "{err}");
        assert!(err.downcast_ref::<RateLimited>().is_none());
    }
}
