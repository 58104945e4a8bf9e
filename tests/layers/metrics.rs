//! Metrics as a dashboard reads them: through a Prometheus exporter's text, from a
//! recorder installed before or after the layers are built, with gauges of what is held
//! now, counts by route on request, and no series a layer's store can never move.
//!
//! Each test sets its recorder as the thread's (tokio's current-thread runtime runs every
//! request on it), so tests do not share one.

use std::convert::Infallible;
use std::time::Duration;

use crate::support;
use axum::{body::Body, routing::get, Router};
use http::{Request, Response, StatusCode};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use tollgate::clock::ManualClock;
use tollgate::key::{Global, HeaderKey};
use tollgate::store::MemoryStore;
use tollgate::{InFlightLimitLayer, Policy, RateLimitLayer};
use tower::{Service, ServiceBuilder, ServiceExt};

const NOW: Duration = Duration::from_secs(1_700_000_000);

/// `GET /items/{id}` and `GET /users/{id}` behind a layer labelled `label` of 2 requests
/// a minute per `x-key`, on a clock that never moves.
fn app(label: &str, by_route: bool) -> Router {
    let store =
        MemoryStore::<Option<tollgate::key::HeaderBytes>, _>::new("1/s".parse::<Policy>().unwrap())
            .with_clock(ManualClock::at(NOW));
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::new("x-key").unwrap())
        .policy("2/min")
        .label(label)
        .route_metrics(by_route)
        .build_with(store)
        .unwrap();
    Router::new()
        .route("/items/{id}", get(|| async { "ok" }))
        .route("/users/{id}", get(|| async { "ok" }))
        .layer(layer)
}

async fn send(app: &Router, path: &str) -> StatusCode {
    support::status_of(app, path, &[("x-key", "k")]).await
}

/// The value of the one sample of `name` whose labels include every `label="value"`.
fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    let found: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    match found.as_slice() {
        [one] => *one,
        _ => panic!("{} samples of {name} {labels:?} in:\n{text}", found.len()),
    }
}

fn recorder() -> PrometheusRecorder {
    PrometheusBuilder::new().build_recorder()
}

/// Regression: the layers registered their handles when built, so a recorder installed
/// afterwards (the usual order in a `main` that builds the router first) got nothing.
#[tokio::test]
async fn a_recorder_installed_after_the_layer_is_built_gets_its_decisions() {
    let app = app("late", false);
    let rec = recorder();
    let _in_force = metrics::set_default_local_recorder(&rec);
    for _ in 0..3 {
        send(&app, "/items/1").await;
    }
    let text = rec.handle().render();
    let requests = "tollgate_rate_limit_requests_total";
    let of = |result| sample(&text, requests, &["tollgate_limiter=\"late\"", result]);
    assert_eq!(of("tollgate_result=\"admitted\""), 2.0, "{text}");
    assert_eq!(of("tollgate_result=\"refused\""), 1.0, "{text}");
}

/// A recorder installed while requests already flow gets their counts after a bounded
/// delay: a thread that found no recorder looks again once every 64 uses.
#[tokio::test]
async fn a_recorder_installed_while_requests_flow_misses_at_most_63_counts() {
    let layer = RateLimitLayer::builder()
        .policy("1000000/s")
        .label("busy")
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    for _ in 0..10 {
        assert_eq!(send(&app, "/").await, StatusCode::OK);
    }
    let rec = recorder();
    let _in_force = metrics::set_default_local_recorder(&rec);
    for _ in 0..200 {
        assert_eq!(send(&app, "/").await, StatusCode::OK);
    }
    let text = rec.handle().render();
    let admitted = sample(
        &text,
        "tollgate_rate_limit_requests_total",
        &["tollgate_limiter=\"busy\"", "tollgate_result=\"admitted\""],
    );
    assert!((137.0..=200.0).contains(&admitted), "{admitted}");
}

/// Prometheus conventions in the exporter's default output: counters end in `_total`,
/// histograms carry their unit.
#[tokio::test]
async fn counters_end_in_total_and_timings_in_seconds_in_the_prometheus_text() {
    let rec = recorder();
    let _in_force = metrics::set_default_local_recorder(&rec);
    let app = app("api", false);
    for _ in 0..3 {
        send(&app, "/items/1").await;
    }
    let text = rec.handle().render();
    let typed: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_once(' ').unwrap())
        .collect();
    assert!(typed.len() >= 4, "{text}");
    for (name, kind) in typed {
        match kind {
            "counter" => assert!(name.ends_with("_total"), "{name}"),
            "summary" | "histogram" => assert!(name.ends_with("_seconds"), "{name}"),
            _ => assert!(!name.ends_with("_total"), "{name}"),
        }
    }
    assert_eq!(
        sample(
            &text,
            "tollgate_rate_limit_requests_total",
            &["tollgate_limiter=\"api\"", "tollgate_result=\"admitted\""]
        ),
        2.0
    );
}

/// A layer on the memory store has no breaker, no network calls and no backend to lose:
/// it exports none of those series.
#[tokio::test]
async fn a_memory_store_layer_exports_no_series_of_a_network_store() {
    let rec = recorder();
    let _in_force = metrics::set_default_local_recorder(&rec);
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::new("x-key").unwrap())
        .policy("2/min")
        .label("mem")
        .build()
        .unwrap();
    let app = Router::new()
        .route("/items/{id}", get(|| async { "ok" }))
        .layer(layer);
    for _ in 0..3 {
        send(&app, "/items/1").await;
    }
    let text = rec.handle().render();
    for absent in [
        "tollgate_store_breaker_state",
        "tollgate_store_errors",
        "tollgate_store_operation_duration",
        "tollgate_rate_limit_degraded_decisions",
    ] {
        assert!(!text.contains(absent), "{absent} in:\n{text}");
    }
    assert_eq!(
        sample(&text, "tollgate_store_keys", &["tollgate_store=\"mem\""]),
        1.0
    );
}

#[tokio::test(start_paused = true)]
async fn queued_requests_are_a_gauge_while_they_wait() {
    let rec = recorder();
    let _in_force = metrics::set_default_local_recorder(&rec);
    // One slot every 100 ms, a queue of 5.
    let layer = RateLimitLayer::builder()
        .policy("queue 10/s 5")
        .label("q")
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) });
    let queued = || {
        sample(
            &rec.handle().render(),
            "tollgate_rate_limit_queued_requests",
            &["tollgate_limiter=\"q\""],
        )
    };
    assert_eq!(queued(), 0.0);
    let mut futures = Vec::new();
    for _ in 0..8 {
        let mut svc = svc.clone();
        futures.push(svc.ready().await.unwrap().call(Request::new(Body::empty())));
    }
    // Decided when called: 1 at once, 5 waiting their slot, 2 refused.
    assert_eq!(queued(), 5.0);
    let mut futures = futures.into_iter();
    futures.next().unwrap().await.unwrap();
    futures.next().unwrap().await.unwrap();
    assert_eq!(queued(), 4.0);
    // A queued request dropped before its slot leaves the queue.
    drop(futures.next().unwrap());
    assert_eq!(queued(), 3.0);
    for f in futures {
        f.await.unwrap();
    }
    assert_eq!(queued(), 0.0);
}

#[tokio::test]
async fn in_flight_leases_are_a_gauge_until_the_response_body_is_dropped() {
    let rec = recorder();
    let _in_force = metrics::set_default_local_recorder(&rec);
    let layer = InFlightLimitLayer::builder(Global::new(), 2)
        .label("exports")
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Body::from("report")))
        });
    let active = || {
        sample(
            &rec.handle().render(),
            "tollgate_in_flight_active_leases",
            &["tollgate_limiter=\"exports\""],
        )
    };
    assert_eq!(active(), 0.0);
    let one = svc
        .clone()
        .oneshot(Request::new(Body::empty()))
        .await
        .unwrap();
    let two = svc
        .clone()
        .oneshot(Request::new(Body::empty()))
        .await
        .unwrap();
    assert_eq!(active(), 2.0);
    let refused = svc
        .clone()
        .oneshot(Request::new(Body::empty()))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(active(), 2.0);
    drop(one);
    assert_eq!(active(), 1.0);
    drop(two);
    assert_eq!(active(), 0.0);
}

/// "Refusals per route" without a counter of one's own: the matched route (a template,
/// never the path) is an attribute once asked for.
#[tokio::test]
async fn decisions_are_counted_by_matched_route_when_asked() {
    let rec = recorder();
    let _in_force = metrics::set_default_local_recorder(&rec);
    let routed = app("routes", true);
    assert_eq!(send(&routed, "/items/1").await, StatusCode::OK);
    assert_eq!(send(&routed, "/items/2").await, StatusCode::OK);
    assert_eq!(
        send(&routed, "/items/3").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&routed, "/users/7").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&routed, "/nowhere").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let text = rec.handle().render();
    let count = |route: &str, result: &str| {
        sample(
            &text,
            "tollgate_rate_limit_requests_total",
            &[
                "tollgate_limiter=\"routes\"",
                &format!("tollgate_route=\"{route}\""),
                &format!("tollgate_result=\"{result}\""),
            ],
        )
    };
    assert_eq!(count("/items/{id}", "admitted"), 2.0);
    assert_eq!(count("/items/{id}", "refused"), 1.0);
    assert_eq!(count("/users/{id}", "refused"), 1.0);
    assert_eq!(count("unmatched", "refused"), 1.0);
    assert!(!text.contains("/items/1"), "a raw path as a label:\n{text}");
    // Without the option, no route attribute.
    let plain = app("plain", false);
    send(&plain, "/items/1").await;
    let text = rec.handle().render();
    let plain_lines: Vec<_> = text
        .lines()
        .filter(|l| l.contains("tollgate_limiter=\"plain\""))
        .collect();
    assert!(!plain_lines.is_empty(), "{text}");
    assert!(
        plain_lines.iter().all(|l| !l.contains("tollgate_route")),
        "{plain_lines:#?}"
    );
}

/// The observability guide: counted by route, a layer keeps 256 routes apart and counts the
/// others as `other` (a bounded set of series, whatever the router holds).
#[tokio::test]
async fn routes_past_256_are_counted_as_other() {
    let rec = recorder();
    let _in_force = metrics::set_default_local_recorder(&rec);
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::new("x-key").unwrap())
        .policy("1000/s")
        .label("many")
        .route_metrics(true)
        .build()
        .unwrap();
    let app = (0..300)
        .fold(Router::new(), |r, i| {
            r.route(&format!("/r{i}"), get(|| async { "ok" }))
        })
        .layer(layer);
    for i in 0..300 {
        assert_eq!(send(&app, &format!("/r{i}")).await, StatusCode::OK);
    }
    let text = rec.handle().render();
    let routes: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| l.contains("tollgate_limiter=\"many\"") && l.contains("admitted"))
        .filter_map(|l| l.split("tollgate_route=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(routes.len(), 257, "{routes:?}");
    assert!(routes.contains("/r0") && routes.contains("/r255"));
    assert!(!routes.contains("/r256"));
    let other = [
        "tollgate_limiter=\"many\"",
        "tollgate_route=\"other\"",
        "tollgate_result=\"admitted\"",
    ];
    assert_eq!(
        sample(&text, "tollgate_rate_limit_requests_total", &other),
        44.0
    );
}
