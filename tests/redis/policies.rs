//! Plans, live changes and deploys with changed quotas on Redis: instances that apply
//! different policies to one key share its one state, converted as the in-memory store
//! converts it (the property test in `redis_semantics` checks every decision against
//! memory; these pin the user-visible counts through layers).

use std::time::Duration;

use crate::support::redis::RedisServer;
use axum::{body::Body, routing::get, Router};
use http::{Request, StatusCode};
use tollgate::clock::ManualClock;
use tollgate::key::{HeaderBytes, HeaderKey, RequestHead};
use tollgate::store::{RedisConnection, RedisStore};
use tollgate::Policy;
use tollgate::RateLimitLayer;
use tower::ServiceExt;

fn clock() -> ManualClock {
    ManualClock::at(Duration::from_secs(1_800_000_000))
}

fn by_prefix(_: &RequestHead<'_>, key: Option<&HeaderBytes>) -> &'static str {
    match key {
        Some(k) if k.starts_with(b"pro_") => "pro",
        _ => "free",
    }
}

/// A store on its own connection (as another instance would have), on `clock`.
async fn store(server: &RedisServer, clock: &ManualClock, ns: &str) -> RedisStore {
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    RedisStore::builder("limit", "1/s".parse::<Policy>().unwrap())
        .namespace(ns)
        .clock(clock.clone())
        .build(conn)
        .unwrap()
}

async fn status(app: &Router, key: &str) -> (StatusCode, Option<String>) {
    let req = Request::get("/")
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let retry = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (res.status(), retry)
}

async fn admitted(app: &Router, key: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if status(app, key).await.0 == StatusCode::OK {
            ok += 1;
        }
    }
    ok
}

#[tokio::test]
async fn plans_are_shared_by_instances_through_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = clock();
    let mut apps = Vec::new();
    for _ in 0..2 {
        let layer = RateLimitLayer::builder()
            .key(HeaderKey::new("x-api-key").unwrap())
            .named_policy("free", "3/min")
            .named_policy("pro", "5/min")
            .policy("daily: 7/day window")
            .select(by_prefix)
            .build_with(store(&server, &clock, "plans").await)
            .unwrap();
        apps.push(
            Router::new()
                .route("/", get(|| async { "ok" }))
                .layer(layer),
        );
    }
    // Requests alternate between the two instances: one limit per key, per plan.
    let mut counts = Vec::new();
    for key in ["free_1", "pro_1"] {
        let mut ok = 0;
        for i in 0..10 {
            if status(&apps[i % 2], key).await.0 == StatusCode::OK {
                ok += 1;
            }
        }
        counts.push(ok);
    }
    assert_eq!(counts, [3, 5]);
    // The daily cap binds a pro key after 7, whichever instance asks: 2 more a minute on.
    clock.advance(Duration::from_secs(60));
    assert_eq!(admitted(&apps[0], "pro_1", 3).await, 2);
    let (code, retry) = status(&apps[1], "pro_1").await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS);
    // Until midnight UTC: 16 h minus the minute.
    assert_eq!(retry.as_deref(), Some("57540"));
}

#[tokio::test]
async fn a_deploy_with_changed_quotas_and_a_live_swap_keep_state_on_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = clock();
    let instance = |policy: &'static str| {
        let server = &server;
        let clock = &clock;
        async move {
            RateLimitLayer::builder()
                .key(HeaderKey::new("x-api-key").unwrap())
                .policy(policy)
                .build_with(store(server, clock, "deploy").await)
                .unwrap()
        }
    };
    let old = instance("10/min").await;
    let new = instance("20/min").await;
    let handle = new.policy_handle();
    let old = Router::new().route("/", get(|| async { "ok" })).layer(old);
    let new = Router::new().route("/", get(|| async { "ok" })).layer(new);

    // A rolling deploy: the old instances spent 10; the new ones see them (10 more of 20),
    // not a fresh limit beside the old one.
    assert_eq!(admitted(&old, "k", 12).await, 10);
    assert_eq!(admitted(&new, "k", 15).await, 10);
    // An old instance reads the new state under its own quota: 20 outstanding, capped at
    // its full bucket, so it waits one of its own intervals.
    assert_eq!(
        status(&old, "k").await,
        (StatusCode::TOO_MANY_REQUESTS, Some("6".to_owned()))
    );

    // A live swap on the new instance: 20 spent of 30.
    handle.swap_text("default = 30/min").unwrap();
    assert_eq!(admitted(&new, "k", 15).await, 10);
}

#[tokio::test]
async fn local_first_decides_plans_locally_and_shares_them() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = clock();
    let local = |ns: &'static str| {
        let (server, clock) = (&server, &clock);
        async move {
            let conn = RedisConnection::connect(&server.url()).await.unwrap();
            RedisStore::builder("limit", "1/s".parse::<Policy>().unwrap())
                .namespace(ns)
                .clock(clock.clone())
                .build_local_first(conn, Duration::from_secs(3600))
                .unwrap()
        }
    };
    let a = local("lf-plans").await;
    let b = local("lf-plans").await;
    let layer = |store| {
        RateLimitLayer::builder()
            .key(HeaderKey::new("x-api-key").unwrap())
            .named_policy("free", "3/min")
            .named_policy("pro", "5/min")
            .select(by_prefix)
            .build_with(store)
            .unwrap()
    };
    let app_a = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer(a.clone()));
    let app_b = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer(b.clone()));
    assert_eq!(admitted(&app_a, "free_1", 5).await, 3);
    assert_eq!(admitted(&app_a, "pro_1", 8).await, 5);
    // A reconciliation round pushes both keys' charges; the other instance pulls them.
    // Redis stays off the request path: b decides a key it has not synced yet on its
    // own (fresh) state, then its round pulls the shared one.
    a.sync().await.unwrap();
    assert_eq!(admitted(&app_b, "free_1", 1).await, 1);
    assert_eq!(admitted(&app_b, "pro_1", 1).await, 1);
    b.sync().await.unwrap();
    assert_eq!(admitted(&app_b, "free_1", 3).await, 0);
    assert_eq!(admitted(&app_b, "pro_1", 3).await, 0);
}
