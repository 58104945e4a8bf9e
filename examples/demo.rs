//! The tollgate demo: four routes, four policies, every response carrying the IETF
//! `RateLimit` / `RateLimit-Policy` fields, refusals with `Retry-After` and a problem+json
//! body.
//!
//! ```sh
//! cargo run --example demo            # serves on 127.0.0.1:3000 (or $PORT)
//! ```
//!
//! - `GET /token`:  5 per second, burst 10, per client IP (token bucket)
//! - `GET /strict`: 5 per second, no burst, per client IP (strict leaky meter)
//! - `GET /queue`:  5 per second, queue of 10, per client IP (delayed, excess refused)
//! - `GET /api`:    5 per second, burst 5, per `x-api-key` header

use std::net::SocketAddr;

use axum::{routing::get, Router};
use tollgate::{
    key::{HeaderKey, PeerIp},
    MissingKey, Quota, RateLimitLayer,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let five = Quota::per_second(5)?;
    let token = RateLimitLayer::builder()
        .key(PeerIp::new())
        .token_bucket(five.with_burst(10)?)
        .build()?;
    let strict = RateLimitLayer::builder()
        .key(PeerIp::new())
        .leaky_meter(five)
        .build()?;
    let queue = RateLimitLayer::builder()
        .key(PeerIp::new())
        .leaky_queue(five, 10)
        .build()?;
    let api = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key")?)
        .token_bucket(five.with_burst(5)?)
        .on_missing_key(MissingKey::Reject(http::StatusCode::UNAUTHORIZED))
        .build()?;

    let app = Router::new()
        .route(
            "/token",
            get(|| async { "token bucket: ok\n" }).layer(token),
        )
        .route(
            "/strict",
            get(|| async { "strict meter: ok\n" }).layer(strict),
        )
        .route("/queue", get(|| async { "queue: served\n" }).layer(queue))
        .route("/api", get(|| async { "api: ok\n" }).layer(api));

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("tollgate demo listening on http://{addr}");
    println!();
    println!("Try:");
    println!("  for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}} ' http://{addr}/token; done; echo");
    println!(
        "  curl -i http://{addr}/strict; curl -i http://{addr}/strict   # the second one is 429"
    );
    println!("  for i in $(seq 12); do curl -s -w ' %{{time_total}}s\\n' http://{addr}/queue & done; wait");
    println!("  curl -i -H 'x-api-key: demo' http://{addr}/api");
    println!();
    println!("Every response carries RateLimit-Policy and RateLimit; refusals add Retry-After and a problem+json body.");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
