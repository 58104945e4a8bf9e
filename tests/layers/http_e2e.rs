//! End to end: a real axum server on 127.0.0.1:0, a real HTTP client, each policy's counts
//! and every header's exact value at the edges.

use std::time::{Duration, Instant};

use crate::support::{self, client, get as fetch, serve};
use axum::{routing::get, Extension, Router};
use tollgate::cost::Cost;
use tollgate::key::KeyExtractor;
use tollgate::key::MissingKey;
use tollgate::key::PeerIp;
use tollgate::store::Store;
use tollgate::Decision;
use tollgate::Limit;
use tollgate::Quota;
use tollgate::RateLimitLayer;

fn per_ip() -> tollgate::ratelimit::Builder<PeerIp, tollgate::cost::UnitCost> {
    RateLimitLayer::builder().key(PeerIp::new())
}

/// Serves `GET /` answering "ok" behind `layer`; returns a client and the URL.
async fn hello<X, St, C>(layer: RateLimitLayer<X, St, C>) -> (reqwest::Client, String)
where
    X: KeyExtractor<http::Request<axum::body::Body>> + Send + Sync + 'static,
    X::Key: std::hash::Hash + Clone + Send + Sync + 'static,
    St: Store<Option<X::Key>>,
    C: Cost<http::Request<axum::body::Body>> + Send + Sync + 'static,
{
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    (client(), format!("http://{addr}/"))
}

#[tokio::test]
async fn token_bucket_counts_and_headers() {
    let layer = per_ip()
        .token_bucket(Quota::per_second(5).unwrap().with_burst(10).unwrap())
        .build()
        .unwrap();
    let (c, url) = hello(layer).await;
    let mut got = Vec::new();
    for _ in 0..12 {
        got.push(fetch(&c, &url, &[]).await);
    }
    let statuses: Vec<u16> = got.iter().map(|g| g.status).collect();
    // The burst of 10 passes; the refill in the few ms the loop takes is far below 1 unit.
    assert_eq!(statuses, [vec![200; 10], vec![429; 2]].concat());

    // Allowed responses: the static policy and the remaining count, t = 1 s to the next unit.
    // Regression: the policy said `q=5;w=1` and then `r=9`. It is the rate over the window
    // that holds the burst: 10 per 2 s, and `r` never exceeds `q`.
    assert_eq!(
        got[0].header("ratelimit-policy"),
        Some("\"5-per-1s\";q=10;w=2")
    );
    assert_eq!(got[0].header("ratelimit"), Some("\"5-per-1s\";r=9;t=1"));
    assert_eq!(got[9].header("ratelimit"), Some("\"5-per-1s\";r=0;t=1"));
    assert_eq!(got[0].header("retry-after"), None);

    // Refusal: the wait is under 200 ms, and Retry-After rounds it up to 1, never 0.
    let refused = &got[10];
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.header("ratelimit"), Some("\"5-per-1s\";r=0;t=1"));
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some("\"5-per-1s\";q=10;w=2")
    );
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(refused.header("cache-control"), Some("no-store"));
    let body: serde_json::Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["status"], 429);
    assert_eq!(body["title"], "Too Many Requests");
    assert_eq!(body["violated-policies"], serde_json::json!(["5-per-1s"]));
    // The exact wait, in whole milliseconds rounded up: under the 200 ms of one unit.
    let ms = body["retry_after_ms"].as_u64().unwrap();
    assert!((1..=200).contains(&ms), "{ms}");
}

#[tokio::test]
async fn strict_meter_admits_one_then_refuses() {
    let layer = per_ip()
        .leaky_meter(Quota::per_second(5).unwrap())
        .build()
        .unwrap();
    let (c, url) = hello(layer).await;
    let first = fetch(&c, &url, &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("ratelimit"), Some("\"5-per-1s\";r=0;t=1"));
    let second = fetch(&c, &url, &[]).await;
    assert_eq!(second.status, 429);
    assert_eq!(second.header("retry-after"), Some("1"));
}

#[tokio::test]
async fn queue_delays_then_refuses() {
    // 20 per second (one slot every 50 ms), queue of 4: 5 concurrent requests are served
    // at 0, 50, 100, 150, 200 ms; the rest are refused at once.
    let layer = per_ip()
        .leaky_queue(Quota::per_second(20).unwrap(), 4)
        .build()
        .unwrap();
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let c = client();
    let url = format!("http://{addr}/");
    let start = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move {
                let g = fetch(&c, &url, &[]).await;
                (g.status, start.elapsed())
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let ok: Vec<Duration> = results.iter().filter(|r| r.0 == 200).map(|r| r.1).collect();
    let refused: Vec<Duration> = results.iter().filter(|r| r.0 == 429).map(|r| r.1).collect();
    assert_eq!((ok.len(), refused.len()), (5, 3));
    let slowest = ok.iter().max().unwrap();
    assert!(
        *slowest >= Duration::from_millis(190),
        "last queued served at {slowest:?}"
    );
    assert!(
        refused.iter().all(|d| *d < Duration::from_millis(150)),
        "{refused:?}"
    );
}

#[tokio::test]
async fn retry_after_in_whole_seconds_for_long_waits() {
    let layer = per_ip()
        .token_bucket(Quota::per_minute(1).unwrap())
        .legacy_headers(true)
        .build()
        .unwrap();
    let (c, url) = hello(layer).await;
    let first = fetch(&c, &url, &[]).await;
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"1-per-1m\";q=1;w=60")
    );
    assert_eq!(first.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("0"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let reset: u64 = first.header("x-ratelimit-reset").unwrap().parse().unwrap();
    assert!(
        (now + 59..=now + 61).contains(&reset),
        "reset {reset} vs now {now}"
    );
    let refused = fetch(&c, &url, &[]).await;
    assert_eq!(refused.status, 429);
    // 60 s minus the few ms since the first request, rounded up.
    assert_eq!(refused.header("retry-after"), Some("60"));
    assert_eq!(refused.header("ratelimit"), Some("\"1-per-1m\";r=0;t=60"));
}

#[tokio::test]
async fn several_quotas_one_item_each() {
    let layer = per_ip()
        .limit(
            Limit::token_bucket(Quota::per_second(10).unwrap())
                .unwrap()
                .named("burst")
                .unwrap(),
        )
        .limit(
            Limit::token_bucket(Quota::per_day(3).unwrap())
                .unwrap()
                .named("daily")
                .unwrap(),
        )
        .build()
        .unwrap();
    let (c, url) = hello(layer).await;
    let first = fetch(&c, &url, &[]).await;
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"burst\";q=10;w=1, \"daily\";q=3;w=86400")
    );
    assert_eq!(
        first.header("ratelimit"),
        Some("\"burst\";r=9;t=1, \"daily\";r=2;t=28800")
    );
    fetch(&c, &url, &[]).await;
    fetch(&c, &url, &[]).await;
    let refused = fetch(&c, &url, &[]).await;
    assert_eq!(refused.status, 429);
    let body: serde_json::Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body["violated-policies"], serde_json::json!(["daily"]));
    // The per-second bucket was not charged by the refusal: 7 left after three requests.
    assert!(
        refused
            .header("ratelimit")
            .unwrap()
            .starts_with("\"burst\";r=7;"),
        "{:?}",
        refused.header("ratelimit")
    );
}

#[tokio::test]
async fn per_route_limits_are_independent_and_a_shared_layer_is_one_limit() {
    let quota = Quota::per_minute(2).unwrap();
    let a = per_ip().token_bucket(quota).build().unwrap();
    let b = per_ip().token_bucket(quota).build().unwrap();
    let shared = per_ip().token_bucket(quota).build().unwrap();
    let app = Router::new()
        .route("/a", get(|| async { "a" }).layer(a))
        .route("/b", get(|| async { "b" }).layer(b))
        .route("/c", get(|| async { "c" }).layer(shared.clone()))
        .route("/d", get(|| async { "d" }).layer(shared));
    let addr = serve(app).await;
    let c = client();
    let status = |path: &'static str| {
        let (c, url) = (c.clone(), format!("http://{addr}{path}"));
        async move { fetch(&c, &url, &[]).await.status }
    };
    assert_eq!(
        (status("/a").await, status("/a").await, status("/a").await),
        (200, 200, 429)
    );
    assert_eq!(
        (status("/b").await, status("/b").await),
        (200, 200),
        "/b has its own limit"
    );
    // /c and /d carry one layer value: one limit between them.
    assert_eq!(
        (
            status("/c").await,
            status("/d").await,
            status("/c").await,
            status("/d").await
        ),
        (200, 200, 429, 429)
    );
}

#[tokio::test]
async fn router_layer_and_route_layer_work() {
    let layer = per_ip()
        .token_bucket(Quota::per_minute(1).unwrap())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/x", get(|| async { "x" }))
        .route("/y", get(|| async { "y" }))
        .route_layer(layer);
    let addr = serve(app).await;
    let c = client();
    assert_eq!(
        fetch(&c, &format!("http://{addr}/x"), &[]).await.status,
        200
    );
    assert_eq!(
        fetch(&c, &format!("http://{addr}/y"), &[]).await.status,
        429
    );
    // route_layer does not apply to unmatched paths: a 404 stays a 404.
    assert_eq!(
        fetch(&c, &format!("http://{addr}/nope"), &[]).await.status,
        404
    );
}

#[tokio::test]
async fn cost_that_never_fits_is_refused_without_retry_after() {
    let layer = per_ip()
        .token_bucket(Quota::per_second(5).unwrap())
        .cost(|req: &http::Request<axum::body::Body>| {
            req.headers()
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .build()
        .unwrap();
    let (c, url) = hello(layer).await;
    let big = fetch(&c, &url, &[("x-cost", "6")]).await;
    assert_eq!(big.status, 429);
    assert_eq!(big.header("retry-after"), None);
    assert!(big.body.contains("can ever admit"), "{}", big.body);
    let three = fetch(&c, &url, &[("x-cost", "3")]).await;
    assert_eq!(three.header("ratelimit"), Some("\"5-per-1s\";r=2;t=1"));
}

#[tokio::test]
async fn handlers_read_the_decision_from_extensions() {
    let layer = per_ip()
        .token_bucket(Quota::per_second(5).unwrap())
        .expose_decision(true)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|Extension(d): Extension<Decision>| async move {
                format!("remaining={}", d.remaining())
            }),
        )
        .layer(layer);
    let addr = serve(app).await;
    let c = client();
    assert_eq!(
        fetch(&c, &format!("http://{addr}/"), &[]).await.body,
        "remaining=4"
    );
    assert_eq!(
        fetch(&c, &format!("http://{addr}/"), &[]).await.body,
        "remaining=3"
    );
}

#[tokio::test]
async fn missing_key_policies() {
    use tollgate::key::HeaderKey;
    let default = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key").unwrap())
        .token_bucket(Quota::per_minute(1).unwrap())
        .build()
        .unwrap();
    let shared = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key").unwrap())
        .token_bucket(Quota::per_minute(1).unwrap())
        .on_missing_key(MissingKey::Shared)
        .build()
        .unwrap();
    let reject = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key").unwrap())
        .token_bucket(Quota::per_minute(1).unwrap())
        .on_missing_key(MissingKey::Reject(http::StatusCode::UNAUTHORIZED))
        .build()
        .unwrap();
    let allow = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key").unwrap())
        .token_bucket(Quota::per_minute(1).unwrap())
        .on_missing_key(MissingKey::Allow)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/default", get(|| async { "" }).layer(default))
        .route("/shared", get(|| async { "" }).layer(shared))
        .route("/reject", get(|| async { "" }).layer(reject))
        .route("/allow", get(|| async { "" }).layer(allow));
    let addr = serve(app).await;
    let c = client();
    let s = |p: &str| format!("http://{addr}{p}");
    // Default: keyless requests are refused with 400 (never silently shared or unlimited).
    for _ in 0..3 {
        let refused = fetch(&c, &s("/default"), &[]).await;
        assert_eq!(refused.status, 400);
        assert!(
            refused.body.contains("No rate-limit key"),
            "{}",
            refused.body
        );
    }
    assert_eq!(
        fetch(&c, &s("/default"), &[("x-api-key", "k1")])
            .await
            .status,
        200
    );
    // Shared: keyless requests share one bucket.
    assert_eq!(fetch(&c, &s("/shared"), &[]).await.status, 200);
    assert_eq!(fetch(&c, &s("/shared"), &[]).await.status, 429);
    assert_eq!(
        fetch(&c, &s("/shared"), &[("x-api-key", "k1")])
            .await
            .status,
        200
    );
    assert_eq!(fetch(&c, &s("/reject"), &[]).await.status, 401);
    for _ in 0..3 {
        assert_eq!(fetch(&c, &s("/allow"), &[]).await.status, 200);
    }
}

/// Regression: in memory, a day window began when the process started (a refusal 600 s
/// in said `Retry-After: 85800`), while on Redis windows follow the server's clock. Every
/// store now counts windows from the Unix epoch: day windows are UTC calendar days.
#[tokio::test]
async fn day_windows_end_at_utc_midnight() {
    use std::time::{SystemTime, UNIX_EPOCH};
    let layer = RateLimitLayer::builder()
        .key(tollgate::key::Global::new())
        .limit(Limit::fixed_window(Quota::per_day(1).unwrap()).unwrap())
        .build()
        .unwrap();
    let (c, url) = hello(layer).await;
    assert_eq!(fetch(&c, &url, &[]).await.status, 200);
    let unix = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let before = unix();
    let refused = fetch(&c, &url, &[]).await;
    let after = unix();
    assert_eq!(refused.status, 429);
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    // Seconds to the next 00:00 UTC, rounded up, as seen just before and after.
    let to_midnight = |t: u64| 86_400 - t % 86_400;
    assert!(
        (to_midnight(after)..=to_midnight(before) + 1).contains(&retry),
        "Retry-After {retry}, midnight UTC in {}",
        to_midnight(before)
    );
}

/// Regression: two tollgate layers on one route overwrote each other's fields: a refusal
/// by the inner (daily) layer reached the client with only the outer layer's `RateLimit`
/// item, and the daily policy in no header. Each layer now adds its items.
#[tokio::test]
async fn stacked_layers_each_add_their_fields() {
    let plan = per_ip()
        .limit(
            Limit::token_bucket(Quota::per_minute(10).unwrap())
                .unwrap()
                .named("plan")
                .unwrap(),
        )
        .build()
        .unwrap();
    let daily = per_ip()
        .limit(
            Limit::fixed_window(Quota::per_day(1).unwrap())
                .unwrap()
                .named("daily")
                .unwrap(),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }).layer(daily))
        .layer(plan);
    let addr = serve(app).await;
    let (c, url) = (client(), format!("http://{addr}/"));
    let all = |g: &support::Got, name: &str| {
        g.headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let admitted = fetch(&c, &url, &[]).await;
    assert_eq!(admitted.status, 200);
    assert_eq!(
        all(&admitted, "ratelimit-policy"),
        ["\"daily\";q=1;w=86400", "\"plan\";q=10;w=60"]
    );
    let refused = fetch(&c, &url, &[]).await;
    assert_eq!(refused.status, 429);
    let limits = all(&refused, "ratelimit");
    assert_eq!(limits.len(), 2, "{limits:?}");
    assert!(limits[0].starts_with("\"daily\";r=0;t="), "{limits:?}");
    assert_eq!(limits[1], "\"plan\";r=8;t=6");
    assert_eq!(
        all(&refused, "ratelimit-policy"),
        ["\"daily\";q=1;w=86400", "\"plan\";q=10;w=60"]
    );
    // Retry-After is the daily refusal's, the only refusal.
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!(retry > 0 && retry <= 86_400);
}

/// Regression: a server started without `into_make_service_with_connect_info` put every
/// client into one bucket without a word. The layer now warns, once (and, by default,
/// refuses the keyless requests with `400`).
#[tokio::test]
async fn a_missing_connection_address_is_warned_once_per_layer() {
    use tower::ServiceExt;
    let (events, _guard) = support::Events::capture();
    let layer = per_ip()
        .token_bucket(Quota::per_second(100).unwrap())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    for _ in 0..3 {
        let req = http::Request::new(axum::body::Body::empty());
        assert_eq!(app.clone().oneshot(req).await.unwrap().status(), 400);
    }
    let warnings = events.at("WARN");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("into_make_service_with_connect_info"),
        "{warnings:?}"
    );
    // A request that simply lacks its key (no header) is not a setup problem.
    let (events, _guard) = support::Events::capture();
    let by_header = RateLimitLayer::builder()
        .key(tollgate::key::HeaderKey::new("x-api-key").unwrap())
        .token_bucket(Quota::per_second(100).unwrap())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(by_header);
    let req = http::Request::new(axum::body::Body::empty());
    app.oneshot(req).await.unwrap();
    assert_eq!(events.at("WARN"), Vec::<String>::new());
}

/// Regression: `BearerClaim` keyed by a claim of a token it did not verify, so a client
/// could mint a new identity per request and get a fresh bucket each time. Forged tokens
/// now give no key: refused by default, or sharing the keyless bucket under
/// `MissingKey::Shared`, never a bucket each.
#[cfg(feature = "jwt-rust-crypto")]
#[tokio::test]
async fn forged_tokens_do_not_get_buckets_of_their_own() {
    use tollgate::key::{jwt, BearerClaim};
    let secret = b"the issuer's secret";
    let layer = RateLimitLayer::builder()
        .key(BearerClaim::hs256("sub", secret).unwrap())
        .token_bucket(Quota::per_minute(5).unwrap())
        .on_missing_key(tollgate::key::MissingKey::Shared)
        .build()
        .unwrap();
    let (c, url) = hello(layer).await;
    let exp = jwt::get_current_timestamp() + 600;
    let sign = |sub: String, key: &[u8]| {
        let claims = serde_json::json!({ "sub": sub, "exp": exp });
        let key = jwt::EncodingKey::from_secret(key);
        jwt::encode(&jwt::Header::default(), &claims, &key).unwrap()
    };
    let mut admitted = 0;
    for i in 0..20 {
        let forged = sign(format!("mallory-{i}"), b"a guess");
        let auth = format!("Bearer {forged}");
        admitted += (fetch(&c, &url, &[("authorization", &auth)]).await.status == 200) as u32;
    }
    assert_eq!(admitted, 5, "20 forged identities shared one bucket of 5");
    // A genuine token has its own bucket.
    let auth = format!("Bearer {}", sign("alice".into(), secret));
    assert_eq!(
        fetch(&c, &url, &[("authorization", &auth)]).await.status,
        200
    );
}
