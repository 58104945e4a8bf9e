//! A client-side limiter in front of an outbound HTTP client: calls to a third-party API
//! that allows 5 requests per second wait for their slot instead of failing.
//!
//! ```sh
//! cargo run --example client_side   # runs to completion (TOLLGATE_EXAMPLE_SELFTEST=1 too)
//! ```
//!
//! A `tower::service_fn` wraps a `reqwest::Client`; the generic tollgate layer keys each
//! `reqwest::Request` by its URL's authority (`host:port`) with `key_fn`, and a leaky-bucket
//! queue (5 per second, up to 20 waiting) spaces the calls to each API 200 ms apart. Two
//! tiny local axum servers play two third-party APIs and record when each call arrives.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::{routing::get, Router};
use tokio::time::Instant;
use tollgate::{key::key_fn, Quota};
use tower::BoxError;
use tower::{service_fn, ServiceBuilder, ServiceExt};

type Arrivals = Arc<Mutex<Vec<Duration>>>;

/// Starts a fake third-party API on `127.0.0.1:0` that records each call's arrival time.
async fn fake_api(started: Instant) -> std::io::Result<(SocketAddr, Arrivals)> {
    let arrivals = Arrivals::default();
    let record = arrivals.clone();
    let app = Router::new().route(
        "/v1/quote",
        get(move || async move {
            record.lock().unwrap().push(started.elapsed());
            "{\"price\":42}"
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((addr, arrivals))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let started = Instant::now();
    let (api_a, arrivals_a) = fake_api(started).await?;
    let (api_b, arrivals_b) = fake_api(started).await?;

    let client = reqwest::Client::new();
    let http = service_fn(move |req: reqwest::Request| {
        let client = client.clone();
        async move { client.execute(req).await }
    });
    let per_host = tollgate::generic::RateLimitLayer::builder()
        .key(key_fn(|req: &reqwest::Request| {
            Some(req.url().authority().to_owned())
        }))
        .leaky_queue(Quota::per_second(5)?, 20)
        .build::<reqwest::Request>()?;
    let api = ServiceBuilder::new().layer(per_host).service(http);

    // Ten calls at once, five to each API: they queue per API instead of failing.
    let mut calls = Vec::new();
    for (i, addr) in [api_a, api_b].into_iter().cycle().take(10).enumerate() {
        let req = reqwest::Request::new(
            reqwest::Method::GET,
            format!("http://{addr}/v1/quote").parse()?,
        );
        let api = api.clone();
        calls.push(tokio::spawn(async move {
            let res = api.oneshot(req).await?;
            let at = started.elapsed().as_millis();
            println!("  t={at:>4} ms  call {i} to {addr}: {}", res.status());
            Ok::<_, BoxError>(res.status().as_u16())
        }));
    }
    for call in calls {
        assert_eq!(call.await??, 200, "every call is served, none refused");
    }
    let total = started.elapsed();

    for (name, arrivals) in [("A", arrivals_a), ("B", arrivals_b)] {
        let mut times = arrivals.lock().unwrap().clone();
        times.sort();
        let ms: Vec<_> = times.iter().map(Duration::as_millis).collect();
        let gaps: Vec<_> = ms.windows(2).map(|w| w[1] - w[0]).collect();
        println!("API {name} saw calls at {ms:?} ms (gaps {gaps:?} ms)");
        assert_eq!(times.len(), 5);
        // 200 ms apart, give or take timer and scheduling jitter.
        assert!(gaps.iter().all(|&g| g >= 170), "gaps {gaps:?}");
        assert!(times[4] - times[0] >= Duration::from_millis(790));
    }
    // The two APIs have separate queues: 5 calls each take ~0.8 s, not 10 calls ~1.8 s.
    println!("all 10 calls done after {total:?}");
    assert!(total < Duration::from_millis(1500), "{total:?}");
    println!("ok");
    Ok(())
}
