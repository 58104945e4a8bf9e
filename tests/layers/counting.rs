//! Counting what matters, through the public API: exemptions and deny lists, counting only
//! the responses that match (failed logins, keyed by a body's field, JSON or form), costs settled
//! from responses, resets, and queues bounded by their longest wait. On the memory store
//! here, on a real Redis at the end.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use crate::support::send;
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use http::{HeaderMap, Request};
use tollgate::clock::ManualClock;
use tollgate::generic;
use tollgate::generic::RateLimited;
use tollgate::key::MissingKey;
use tollgate::key::{
    key_fn, BodyField, BodyFieldKey, BodyFieldLayer, ClientIp, HeaderBytes, HeaderKey, PeerIp,
};
use tollgate::store::{MemoryStore, Store};
use tollgate::ConfigError;
use tollgate::Limit;
use tollgate::Policy;
use tollgate::Quota;
use tollgate::RateLimitLayer;
use tower::{Service, ServiceExt};

/// `GET path` from `peer`, as axum's `ConnectInfo` gives it.
fn from(peer: &str, path: &str) -> Request<Body> {
    let mut req = Request::get(path).body(Body::empty()).unwrap();
    let addr = SocketAddr::new(peer.parse().unwrap(), 4000);
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(addr));
    req
}

/// `GET /` and `GET /health` behind `layer`.
macro_rules! app {
    ($layer:expr) => {
        Router::new()
            .route("/", get(|| async { "ok" }))
            .route("/health", get(|| async { "healthy" }))
            .layer($layer)
    };
}

#[tokio::test]
async fn skipped_requests_are_never_limited_and_carry_no_fields() {
    let layer = RateLimitLayer::builder()
        .key(PeerIp::new())
        .policy("2/hour")
        .skip(|head| head.uri().path() == "/health")
        .build()
        .unwrap();
    let app = app!(layer);
    for _ in 0..10 {
        let got = send(&app, from("192.0.2.1", "/health")).await;
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(got.header("ratelimit"), None);
        assert_eq!(got.header("ratelimit-policy"), None);
    }
    // The skipped requests spent nothing.
    assert_eq!(
        send(&app, from("192.0.2.1", "/")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, from("192.0.2.1", "/")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, from("192.0.2.1", "/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn allowed_addresses_are_never_limited_and_denied_ones_get_403() {
    let layer = RateLimitLayer::builder()
        .key(PeerIp::new())
        .policy("1/hour")
        .allow_ips(["10.0.0.0/8", "2001:db8::/32"])
        .deny_ips(["203.0.113.66", "10.6.6.0/24"])
        .build()
        .unwrap();
    let app = app!(layer);
    for _ in 0..5 {
        let got = send(&app, from("10.1.2.3", "/")).await;
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(got.header("ratelimit"), None);
        assert_eq!(
            send(&app, from("2001:db8::7", "/")).await.status,
            StatusCode::OK
        );
    }
    // Denied: on every request, first or not, and on both lists (10.6.6.0/24 is in 10/8).
    for peer in ["203.0.113.66", "10.6.6.9"] {
        let got = send(&app, from(peer, "/")).await;
        assert_eq!(got.status, StatusCode::FORBIDDEN, "{peer}");
        assert_eq!(got.header("content-type"), Some("application/problem+json"));
        assert!(got.body.contains("\"status\":403"), "{}", got.body);
        assert_eq!(got.header("ratelimit"), None);
    }
    // Everyone else is limited.
    assert_eq!(
        send(&app, from("192.0.2.1", "/")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, from("192.0.2.1", "/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn lists_read_the_client_behind_trusted_proxies_only() {
    let layer = RateLimitLayer::builder()
        .key(PeerIp::new())
        .policy("100/s")
        .deny_ips(["198.51.100.7"])
        .client_ip(ClientIp::trusting(["10.0.0.0/8"]).unwrap())
        .build()
        .unwrap();
    let app = app!(layer);
    let via = |peer: &str| {
        let mut r = from(peer, "/");
        r.headers_mut()
            .insert("x-forwarded-for", "198.51.100.7".parse().unwrap());
        r
    };
    // Forwarded by a trusted proxy: the client is denied.
    assert_eq!(
        send(&app, via("10.0.0.1")).await.status,
        StatusCode::FORBIDDEN
    );
    // Written by the client itself: not believed.
    assert_eq!(send(&app, via("192.0.2.1")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn allowed_and_denied_keys() {
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key").unwrap())
        .policy("1/hour")
        .allow_keys(["internal"])
        .deny_keys(["leaked"])
        .build()
        .unwrap();
    let app = app!(layer);
    let keyed = |k: &str| {
        Request::get("/")
            .header("x-api-key", k)
            .body(Body::empty())
            .unwrap()
    };
    for _ in 0..3 {
        let got = send(&app, keyed("internal")).await;
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(got.header("ratelimit"), None);
        assert_eq!(
            send(&app, keyed("leaked")).await.status,
            StatusCode::FORBIDDEN
        );
    }
    assert_eq!(send(&app, keyed("customer")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, keyed("customer")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn exempt_is_not_keyless() {
    // Keyless requests are refused; the skipped health check needs no key.
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key").unwrap())
        .policy("10/s")
        .on_missing_key(MissingKey::Reject(StatusCode::BAD_REQUEST))
        .skip(|head| head.uri().path() == "/health")
        .build()
        .unwrap();
    let app = app!(layer);
    let bare = |path: &str| Request::get(path).body(Body::empty()).unwrap();
    assert_eq!(send(&app, bare("/health")).await.status, StatusCode::OK);
    assert_eq!(send(&app, bare("/")).await.status, StatusCode::BAD_REQUEST);
}

#[test]
fn bad_lists_are_refused_when_the_layer_is_built() {
    let err = RateLimitLayer::builder()
        .key(PeerIp::new())
        .policy("1/s")
        .allow_ips(["10.0.0.0/33"])
        .build()
        .unwrap_err();
    assert_eq!(err, ConfigError::InvalidCidr("10.0.0.0/33".into()));
    // A key list of another type than the extractor's keys.
    let err = generic::RateLimitLayer::builder()
        .key(key_fn(|n: &u32| Some(*n)))
        .policy("1/s")
        .deny_keys(["seven"])
        .build::<u32>()
        .unwrap_err();
    assert!(
        matches!(&err, ConfigError::KeyList(m) if m.contains("&str") && m.contains("u32")),
        "{err}"
    );
}

#[tokio::test]
async fn the_generic_layer_denies_and_allows_keys() {
    let layer = generic::RateLimitLayer::builder()
        .key(key_fn(|n: &u32| Some(*n)))
        .policy("1/hour")
        .allow_keys([1u32])
        .deny_keys([7u32])
        .build::<u32>()
        .unwrap();
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: u32| async { Ok::<_, tower::BoxError>("done") });
    for _ in 0..3 {
        assert!(svc.ready().await.unwrap().call(1).await.is_ok());
        let e = svc.ready().await.unwrap().call(7).await.unwrap_err();
        assert!(
            e.downcast_ref::<RateLimited>()
                .is_some_and(RateLimited::is_denied),
            "{e}"
        );
    }
    assert!(svc.ready().await.unwrap().call(2).await.is_ok());
    let limited = svc.ready().await.unwrap().call(2).await.unwrap_err();
    let limited = limited.downcast_ref::<RateLimited>().unwrap();
    assert!(!limited.is_denied() && limited.retry_after().is_some());
}

#[tokio::test]
async fn the_generic_layer_refuses_keyless_requests_with_a_typed_error() {
    let layer = generic::RateLimitLayer::builder()
        .key(key_fn(|n: &u32| (*n > 0).then_some(*n)))
        .policy("1/hour")
        .on_missing_key(MissingKey::Reject(StatusCode::BAD_REQUEST))
        .build::<u32>()
        .unwrap();
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: u32| async { Ok::<_, tower::BoxError>("done") });
    let e = svc.ready().await.unwrap().call(0).await.unwrap_err();
    let refused = e.downcast_ref::<RateLimited>().expect("a typed refusal");
    assert!(refused.is_key_missing() && !refused.is_denied());
    assert_eq!(refused.retry_after(), None);
    assert!(svc.ready().await.unwrap().call(3).await.is_ok());
}

/// `POST /login` as the demo has it: the password `correct horse` answers 200, any other
/// 401; failures limited to 5 per 15 minutes per user; the handler's entries counted.
fn login_app<St: Store<Option<BodyField>>>(
    layer: RateLimitLayer<BodyFieldKey, St>,
) -> (Router, Arc<AtomicUsize>) {
    let entered = Arc::new(AtomicUsize::new(0));
    let seen = entered.clone();
    let login = move |body: String| {
        let seen = seen.clone();
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            // Long enough that concurrent attempts overlap.
            tokio::time::sleep(Duration::from_millis(50)).await;
            if password(&body) == "correct horse" {
                StatusCode::OK
            } else {
                StatusCode::UNAUTHORIZED
            }
        }
    };
    // The body is read first (the outer layer), then the limit applies.
    let app = Router::new().route(
        "/login",
        post(login).layer(
            tower::ServiceBuilder::new()
                .layer(BodyFieldLayer::new("user"))
                .layer(layer),
        ),
    );
    (app, entered)
}

fn failed_logins() -> tollgate::ratelimit::Builder<BodyFieldKey, tollgate::cost::UnitCost> {
    RateLimitLayer::builder()
        .key(BodyField::key())
        .policy("5/15min")
        .count_when(|res| res.status() == StatusCode::UNAUTHORIZED)
}

fn login(user: &str, password: &str) -> Request<Body> {
    Request::post("/login")
        .header("content-type", "application/json")
        .body(Body::from(format!(
            r#"{{"user":"{user}","password":"{password}"}}"#
        )))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn only_failed_logins_are_counted_per_user() {
    let clock = ManualClock::at(Duration::from_secs(1_800_000_000));
    let store = MemoryStore::new("5/15min".parse::<Policy>().unwrap()).with_clock(clock.clone());
    let layer = failed_logins().build_with(store).unwrap();
    let (app, entered) = login_app(layer);
    // Successes, any number of them, are not counted.
    for _ in 0..20 {
        assert_eq!(
            send(&app, login("alice", "correct horse")).await.status,
            StatusCode::OK
        );
    }
    for i in 0..5 {
        let got = send(&app, login("alice", "guess")).await;
        assert_eq!(got.status, StatusCode::UNAUTHORIZED, "failure {i}");
        if i < 4 {
            // A success between failures does not count either.
            assert_eq!(
                send(&app, login("alice", "correct horse")).await.status,
                StatusCode::OK
            );
        }
    }
    // Over: refused until the retry-after, the right password included.
    let refused = send(&app, login("alice", "correct horse")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), Some("180"));
    assert_eq!(entered.load(Ordering::SeqCst), 29);
    // Another user is not affected; the body reached the handler intact.
    assert_eq!(
        send(&app, login("bob", "correct horse")).await.status,
        StatusCode::OK
    );
    // After the retry-after, one more try.
    clock.advance(Duration::from_secs(180));
    assert_eq!(
        send(&app, login("alice", "guess")).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&app, login("alice", "guess")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(start_paused = true)]
async fn failed_logins_are_counted_with_the_rate_limit_fields_off() {
    let clock = ManualClock::at(Duration::from_secs(1_800_000_000));
    let store = MemoryStore::new("5/15min".parse::<Policy>().unwrap()).with_clock(clock.clone());
    let layer = failed_logins()
        .ietf_headers(false)
        .build_with(store)
        .unwrap();
    let (app, _) = login_app(layer);
    for _ in 0..3 {
        let ok = send(&app, login("erin", "correct horse")).await;
        assert_eq!(ok.status, StatusCode::OK);
        assert_eq!(ok.header("ratelimit"), None);
    }
    for i in 0..5 {
        let failed = send(&app, login("erin", "guess")).await;
        assert_eq!(failed.status, StatusCode::UNAUTHORIZED, "failure {i}");
        assert_eq!(failed.header("ratelimit"), None);
    }
    assert_eq!(
        send(&app, login("erin", "correct horse")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(start_paused = true)]
async fn the_failure_that_takes_the_last_unit_bans_for_the_ban_period() {
    let clock = ManualClock::at(Duration::from_secs(1_800_000_000));
    let store = MemoryStore::new("5/15min".parse::<Policy>().unwrap()).with_clock(clock.clone());
    let layer = failed_logins()
        .ban(Duration::from_secs(3600))
        .build_with(store)
        .unwrap();
    let (app, _) = login_app(layer);
    for _ in 0..4 {
        assert_eq!(
            send(&app, login("dave", "guess")).await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    // Four failures: refused only until one is forgotten? No: not refused at all yet.
    assert_eq!(
        send(&app, login("dave", "correct horse")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, login("dave", "guess")).await.status,
        StatusCode::UNAUTHORIZED
    );
    // The fifth failure took the last unit: banned for exactly an hour.
    let banned = send(&app, login("dave", "correct horse")).await;
    assert_eq!(banned.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(banned.header("retry-after"), Some("3600"));
    clock.advance(Duration::from_secs(3599));
    let still = send(&app, login("dave", "correct horse")).await;
    assert_eq!(still.header("retry-after"), Some("1"));
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        send(&app, login("dave", "correct horse")).await.status,
        StatusCode::OK
    );
    // A ban needs counted responses, and limits that can hold it.
    let err = RateLimitLayer::builder()
        .key(BodyField::key())
        .policy("5/15min")
        .ban(Duration::from_secs(60))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("count_when"), "{err}");
    let err = failed_logins()
        .policy("100/day window")
        .ban(Duration::from_secs(60))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("window"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_failed_logins_let_at_most_five_reach_the_handler() {
    let (app, entered) = login_app(failed_logins().build().unwrap());
    let tries: Vec<_> = (0..20)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, login("mallory", "guess")).await.status })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tries {
        statuses.push(t.await.unwrap());
    }
    let failed = statuses
        .iter()
        .filter(|s| **s == StatusCode::UNAUTHORIZED)
        .count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!(entered.load(Ordering::SeqCst), 5);
    assert_eq!((failed, refused), (5, 15));
}

#[tokio::test]
async fn a_body_without_the_field_is_keyless_and_an_oversized_one_is_413() {
    let layer = failed_logins()
        .on_missing_key(MissingKey::Reject(StatusCode::BAD_REQUEST))
        .build()
        .unwrap();
    let (app, entered) = login_app(layer);
    let no_user = Request::post("/login")
        .body(Body::from(r#"{"password":"x"}"#))
        .unwrap();
    assert_eq!(send(&app, no_user).await.status, StatusCode::BAD_REQUEST);
    let huge = Request::post("/login")
        .body(Body::from(vec![b' '; 64 * 1024]))
        .unwrap();
    assert_eq!(send(&app, huge).await.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(entered.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn settled_costs_charge_or_refund_the_difference() {
    let clock = ManualClock::at(Duration::from_secs(1_800_000_000));
    let store = MemoryStore::new("100/hour".parse::<Policy>().unwrap()).with_clock(clock);
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key").unwrap())
        .policy("100/hour")
        .cost(|_: &Request<Body>| 10)
        .settle_cost(|res| res.header_u64("x-used"))
        .build_with(store)
        .unwrap();
    // `GET /` whose response says in `x-used` what it really cost.
    let app = Router::new()
        .route(
            "/",
            get(|headers: HeaderMap| async move {
                let used = headers["x-will-use"].to_str().unwrap().to_owned();
                ([("x-used", used)], "ok")
            }),
        )
        .layer(layer.clone());
    let remaining = || {
        let key = Some(HeaderBytes::from("k"));
        layer.store().peek(&key, 0).limits()[0].remaining()
    };
    let call = |used: &str| {
        Request::get("/")
            .header("x-api-key", "k")
            .header("x-will-use", used)
            .body(Body::empty())
            .unwrap()
    };
    // Reserved 10, used 2: 8 given back.
    let got = send(&app, call("2")).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(remaining(), 98);
    // Reserved 10, used 30: 20 more charged.
    send(&app, call("30")).await;
    assert_eq!(remaining(), 68);
    // No figure in the response: the estimate stands.
    send(&app, call("not a number")).await;
    assert_eq!(remaining(), 58);
    // Used beyond what is left: charged anyway; the key then waits it out.
    send(&app, call("200")).await;
    assert_eq!(remaining(), 0);
    let refused = send(&app, call("1")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_reset_gives_a_key_a_fresh_start() {
    let layer = RateLimitLayer::new(
        HeaderKey::new("x-api-key").unwrap(),
        "2/day".parse::<Policy>().unwrap(),
    );
    let app = app!(layer.clone());
    let keyed = |k: &str| {
        Request::get("/")
            .header("x-api-key", k)
            .body(Body::empty())
            .unwrap()
    };
    for k in ["banned", "other"] {
        send(&app, keyed(k)).await;
        send(&app, keyed(k)).await;
        assert_eq!(
            send(&app, keyed(k)).await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    layer.reset("banned").await.unwrap();
    assert_eq!(send(&app, keyed("banned")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, keyed("other")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(start_paused = true)]
async fn a_queue_refuses_what_would_wait_longer_than_its_max_wait() {
    // 10 per second, 50 slots, but no wait over 300 ms: 1 at once, 3 queued, the rest
    // refused.
    let limit = Limit::leaky_queue(Quota::per_second(10).unwrap(), 50)
        .unwrap()
        .with_max_wait(Duration::from_millis(300))
        .unwrap();
    let layer = RateLimitLayer::new(PeerIp::new(), limit);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from(([192, 0, 2, 1], 4000))));
    let started = tokio::time::Instant::now();
    let tries: Vec<_> = (0..10)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let got = send(&app, Request::get("/").body(Body::empty()).unwrap()).await;
                (got.status, started.elapsed())
            })
        })
        .collect();
    let mut served = Vec::new();
    let mut refused = 0;
    for t in tries {
        match t.await.unwrap() {
            (StatusCode::OK, waited) => served.push(waited),
            (StatusCode::TOO_MANY_REQUESTS, _) => refused += 1,
            other => panic!("{other:?}"),
        }
    }
    served.sort();
    assert_eq!(refused, 6);
    assert_eq!(
        served,
        [0, 100, 200, 300].map(Duration::from_millis).to_vec()
    );
    // Bounded by its wait, then by its length: the wait is what the policy text says.
    let text: Policy = "queue 10/s 50 max-wait 300ms".parse().unwrap();
    assert_eq!(
        text.limits()[0].max_wait(),
        Some(Duration::from_millis(300))
    );
    let err = "10/s max-wait 1s".parse::<Policy>().unwrap_err();
    assert!(
        err.to_string().contains("max-wait applies to a queue"),
        "{err}"
    );
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use crate::support;
    use tollgate::store::{RedisConnection, RedisStore};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failed_logins_and_resets_on_redis() {
        let Some(server) = support::redis::RedisServer::start() else {
            return;
        };
        let conn = RedisConnection::connect(&server.url()).await.unwrap();
        let policy: Policy = "5/15min".parse().unwrap();
        let store = RedisStore::builder("limit", policy)
            .deadline(Duration::from_secs(5))
            .build(conn)
            .unwrap();
        let layer = failed_logins().build_with(store).unwrap();
        let (app, entered) = login_app(layer.clone());
        let carol = Some(BodyField::from("carol"));
        for _ in 0..10 {
            assert_eq!(
                send(&app, login("carol", "correct horse")).await.status,
                StatusCode::OK
            );
            // A refund goes to Redis in the background, one round trip after the response.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while layer.store().peek(&carol, 0).await.unwrap().limits()[0].remaining() < 5 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "refund never applied"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let tries: Vec<_> = (0..20)
            .map(|_| {
                let app = app.clone();
                tokio::spawn(async move { send(&app, login("carol", "guess")).await.status })
            })
            .collect();
        let mut failed = 0;
        for t in tries {
            if t.await.unwrap() == StatusCode::UNAUTHORIZED {
                failed += 1;
            }
        }
        assert_eq!(failed, 5);
        assert_eq!(entered.load(Ordering::SeqCst), 15);
        assert_eq!(
            send(&app, login("carol", "correct horse")).await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
        // An admin unbans carol.
        layer.reset(BodyField::from("carol")).await.unwrap();
        assert_eq!(
            send(&app, login("carol", "correct horse")).await.status,
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn a_ban_on_redis_is_seen_by_every_instance() {
        let Some(server) = support::redis::RedisServer::start() else {
            return;
        };
        let policy: Policy = "5/15min".parse().unwrap();
        let mut apps = Vec::new();
        for _ in 0..2 {
            let conn = RedisConnection::connect(&server.url()).await.unwrap();
            let store = RedisStore::builder("limit", policy.clone())
                .deadline(Duration::from_secs(5))
                .build(conn)
                .unwrap();
            let layer = failed_logins()
                .ban(Duration::from_secs(7200))
                .build_with(store)
                .unwrap();
            apps.push((login_app(layer.clone()).0, layer));
        }
        for i in 0..5 {
            let (app, _) = &apps[i % 2];
            assert_eq!(
                send(app, login("erin", "guess")).await.status,
                StatusCode::UNAUTHORIZED
            );
        }
        // The ban is sent in the background once the fifth failure's response is known.
        let erin = Some(BodyField::from("erin"));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let d = apps[0].1.store().peek(&erin, 1).await.unwrap();
            if d.retry_after() > Some(Duration::from_secs(3600)) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "ban never applied: {d:?}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for (app, _) in &apps {
            let refused = send(app, login("erin", "correct horse")).await;
            assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
            let secs: u64 = refused.header("retry-after").unwrap().parse().unwrap();
            assert!((7190..=7200).contains(&secs), "{secs}");
        }
    }
}

fn login_form(user: &str, password: &str) -> Request<Body> {
    Request::post("/login")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from(format!("user={user}&password={password}")))
        .unwrap()
}

/// Regression: the login recipe read the user from JSON bodies only, and a request without
/// a key shared one bucket with every other such request: seven users posting forms with
/// wrong passwords got `401` five times between them, then `429` for everyone.
#[tokio::test(start_paused = true)]
async fn seven_users_posting_forms_each_get_their_own_five_failures() {
    let (app, entered) = login_app(failed_logins().build().unwrap());
    let users = ["ann", "ben", "cat", "dan", "eve", "fay", "gus"];
    for round in 0..6 {
        for user in users {
            let want = if round < 5 {
                StatusCode::UNAUTHORIZED
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            let got = send(&app, login_form(user, "guess")).await.status;
            assert_eq!(got, want, "{user}, try {}", round + 1);
        }
    }
    assert_eq!(entered.load(Ordering::SeqCst), 35);
    // A form and a JSON body name the same user's bucket.
    assert_eq!(
        send(&app, login("ann", "correct horse")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, login_form("hal", "correct+horse")).await.status,
        StatusCode::OK
    );
}

/// Regression: by default a request without a key shared one bucket with every other
/// keyless request (`MissingKey::Shared`); it is now refused with `400` and a problem body
/// before the handler runs, whatever the body's type.
#[tokio::test(start_paused = true)]
async fn a_login_without_the_user_field_is_refused_with_400_by_default() {
    let (app, entered) = login_app(failed_logins().build().unwrap());
    let bodies = [
        ("application/json", r#"{"name":"ann","password":"guess"}"#),
        (
            "application/x-www-form-urlencoded",
            "name=ann&password=guess",
        ),
        (
            "application/x-www-form-urlencoded",
            "user=ann&user=ben&password=guess",
        ),
        ("multipart/form-data; boundary=x", "--x--"),
        ("text/plain", "ann"),
    ];
    for _ in 0..7 {
        for (content_type, body) in bodies {
            let req = Request::post("/login")
                .header("content-type", content_type)
                .body(Body::from(body))
                .unwrap();
            let got = send(&app, req).await;
            assert_eq!(got.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(got.header("content-type"), Some("application/problem+json"));
        }
    }
    assert_eq!(entered.load(Ordering::SeqCst), 0);
}

/// The password of a login body: a JSON object's `password`, or a form's.
fn password(body: &str) -> String {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(body) {
        return v["password"].as_str().unwrap_or_default().to_owned();
    }
    body.split('&')
        .find_map(|p| p.strip_prefix("password="))
        .unwrap_or_default()
        .replace('+', " ")
}
