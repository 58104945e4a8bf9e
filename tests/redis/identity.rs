//! Limits as independent on Redis as in memory: a store's name is its limit's identity.
//! Stores share a key's state only under the same name (every instance of one limit, a
//! rolling deploy that changes its quotas); two stores of one connection that would share
//! keys while applying different limits are refused when built.

use std::net::SocketAddr;

use crate::support::redis::Target;
use axum::{extract::connect_info::MockConnectInfo, routing::get, Router};
use http::Request;
use tollgate::fair::{RedisFair, Share};
use tollgate::inflight::RedisInFlight;
use tollgate::key::{Global, PeerIp};
use tollgate::store::{RedisConnection, RedisStore};
use tollgate::{ConfigError, FairLimitLayer, InFlightLimitLayer, Limit, Quota, RateLimitLayer};
use tower::ServiceExt;

fn per_minute(n: u64) -> Limit {
    Limit::token_bucket(Quota::per_minute(n).unwrap()).unwrap()
}

async fn connect(target: &Target) -> RedisConnection {
    RedisConnection::connect(&target.url()).await.unwrap()
}

/// The `RateLimit` field of a response.
fn field(r: &http::Response<axum::body::Body>) -> String {
    r.headers()["ratelimit"].to_str().unwrap().to_owned()
}

/// Regression: two Redis-backed stores on one connection in the default namespace, one
/// for the API (100/min) and one for logins (5/min), keyed by the same client address,
/// kept that address's state in ONE Redis key: after 50 API requests the first login was
/// refused (retry after 12 s), and 5 logins from a second address left it 94 API requests
/// instead of 99.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_limits_keyed_by_one_address_are_independent() {
    let Some(target) = Target::get() else { return };
    let conn = connect(&target).await;
    let namespace = format!("identity-{}", std::process::id());
    let store = |name: &str, limit: Limit| {
        RedisStore::builder(name, limit)
            .namespace(namespace.as_str())
            .build(conn.clone())
            .unwrap()
    };
    let (api, login) = (store("api", per_minute(100)), store("login", per_minute(5)));
    let layer = |s: &RedisStore| {
        RateLimitLayer::builder()
            .key(PeerIp::new())
            .build_with(s.clone())
            .unwrap()
    };
    let (api_layer, login_layer) = (layer(&api), layer(&login));
    let app = |from: [u8; 4]| {
        Router::new()
            .route("/api", get(|| async { "api" }).layer(api_layer.clone()))
            .route(
                "/login",
                get(|| async { "login" }).layer(login_layer.clone()),
            )
            .layer(MockConnectInfo(SocketAddr::from((from, 4000))))
    };
    let get = |path: &str| Request::get(path).body(axum::body::Body::empty()).unwrap();

    for _ in 0..50 {
        let r = app([192, 0, 2, 1]).oneshot(get("/api")).await.unwrap();
        assert_eq!(r.status(), 200);
    }
    let first = app([192, 0, 2, 1]).oneshot(get("/login")).await.unwrap();
    assert_eq!(first.status(), 200, "{}", field(&first));
    assert!(field(&first).ends_with(";r=4;t=12"), "{}", field(&first));

    for _ in 0..5 {
        let r = app([192, 0, 2, 2]).oneshot(get("/login")).await.unwrap();
        assert_eq!(r.status(), 200);
    }
    let other = app([192, 0, 2, 2]).oneshot(get("/api")).await.unwrap();
    assert!(field(&other).contains(";r=99;"), "{}", field(&other));
}

/// Two stores of one connection with one name and different limits would read each
/// other's state: refused, the error naming both limits. The same name with the same
/// limit is one limit shared on purpose.
#[tokio::test]
async fn one_name_with_two_limits_is_refused_on_one_connection() {
    let Some(target) = Target::get() else { return };
    let conn = connect(&target).await;
    let _first = RedisStore::builder("login", per_minute(100))
        .build(conn.clone())
        .unwrap();
    let err = RedisStore::builder("login", per_minute(5))
        .build(conn.clone())
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ConfigError::Store(_)), "{err:?}");
    assert!(
        text.contains("\"login\"") && text.contains("100-per-1m") && text.contains("5-per-1m"),
        "{text}"
    );
    // The same limit under the same name: one limit, two handles.
    let same = RedisStore::builder("login", per_minute(100)).build(conn.clone());
    assert!(same.is_ok());
    // Another namespace, or another name: another limit.
    assert!(RedisStore::builder("login", per_minute(5))
        .namespace("other-app")
        .build(conn.clone())
        .is_ok());
    assert!(RedisStore::builder("signup", per_minute(5))
        .build(conn.clone())
        .is_ok());
    // Once the first store is gone, its name is free for other limits.
    drop((_first, same));
    assert!(RedisStore::builder("login", per_minute(5))
        .build(conn.clone())
        .is_ok());
}

/// A layer that installs limits of its own on a store is held to the same rule: it may not
/// apply, under a name another store of the connection uses, limits that store does not.
#[tokio::test]
async fn a_layer_may_not_give_a_shared_name_other_limits() {
    let Some(target) = Target::get() else { return };
    let conn = connect(&target).await;
    let ns = format!("layered-{}", std::process::id());
    let build = || {
        RedisStore::builder("api", per_minute(100))
            .namespace(ns.as_str())
            .build(conn.clone())
            .unwrap()
    };
    let (a, b) = (build(), build());
    let err = RateLimitLayer::builder()
        .key(Global)
        .limit(per_minute(10))
        .build_with(b.clone())
        .unwrap_err();
    assert!(err.to_string().contains("10-per-1m"), "{err}");
    // The store's own limit is fine.
    let layer = RateLimitLayer::builder().key(Global).build_with(a);
    assert!(layer.is_ok());
}

/// Instances of one limit (separate connections) share its state under its name, also
/// while a rolling deploy runs old and new quotas side by side: the new instance carries
/// the key's state over instead of handing out a fresh bucket.
#[tokio::test]
async fn instances_of_a_rolling_deploy_share_one_state_by_name() {
    let Some(target) = Target::get() else { return };
    let ns = format!("rolling-{}", std::process::id());
    let old = RedisStore::builder("api", per_minute(10))
        .namespace(ns.as_str())
        .build(connect(&target).await)
        .unwrap();
    let new = RedisStore::builder("api", per_minute(20))
        .namespace(ns.as_str())
        .build(connect(&target).await)
        .unwrap();
    for _ in 0..10 {
        assert!(old.check("client", 1).await.unwrap().is_allowed());
    }
    assert!(!old.check("client", 1).await.unwrap().is_allowed());
    // The 10 units spent stay spent under the new quota: 10 of its 20 are left, not a
    // fresh bucket (see the policy guide's conversion rules).
    for _ in 0..10 {
        assert!(new.check("client", 1).await.unwrap().is_allowed());
    }
    assert!(!new.check("client", 1).await.unwrap().is_allowed());
    assert_eq!(old.redis_key("client"), new.redis_key("client"));
}

/// In-flight and fair-share stores follow the same rule: their names keep their counts
/// and pools apart, and two stores of one name that would share counts or a pool with
/// other limits are refused when a layer is built on the second.
#[tokio::test]
async fn in_flight_and_fair_stores_are_named_too() {
    let Some(target) = Target::get() else { return };
    let conn = connect(&target).await;
    let ns = format!("named-{}", std::process::id());
    let inflight = |name: &str| {
        RedisInFlight::builder(name)
            .namespace(ns.as_str())
            .build(conn.clone())
            .unwrap()
    };
    let in_flight_layer =
        |store: RedisInFlight, max: u32| InFlightLimitLayer::builder(Global, max).build_with(store);
    let _exports = in_flight_layer(inflight("exports"), 2).unwrap();
    let err = in_flight_layer(inflight("exports"), 5).unwrap_err();
    assert!(err.to_string().contains("at most 2 in flight"), "{err}");
    assert!(in_flight_layer(inflight("uploads"), 5).is_ok());

    let fair = |name: &str| {
        RedisFair::builder(name)
            .namespace(ns.as_str())
            .build(conn.clone())
            .unwrap()
    };
    let fair_layer = |store: RedisFair, per_second: u64| {
        let quota = |n| Quota::per_second(n).unwrap();
        FairLimitLayer::builder(Global, quota(per_second))
            .share(Share::new(quota(1), quota(per_second)).unwrap())
            .build_with(store)
    };
    let _pool = fair_layer(fair("pool"), 20).unwrap();
    assert!(fair_layer(fair("pool"), 40).is_err());
    assert!(
        fair_layer(fair("pool"), 20).is_ok(),
        "the same pool, shared"
    );
    assert!(fair_layer(fair("other"), 40).is_ok());
}
