//! Two axum servers on two ports sharing one limit through Redis: 5 requests per second
//! per client IP with a burst of 5, whichever server a request reaches.
//!
//! ```sh
//! redis-server --port 6379 &                      # or set REDIS_URL
//! cargo run --example redis_shared --features redis
//! ```
//!
//! It serves on 127.0.0.1:3001 and 127.0.0.1:3002, sends 8 requests alternating between
//! the two (the 6th is refused although each server saw only 3), then keeps serving until
//! Ctrl-C; `--once` exits after the demonstration.

use std::{net::SocketAddr, time::Duration};

use axum::{routing::get, Router};
use tollgate::key::PeerIp;
use tollgate::store::{FailurePolicy, RedisConnection, RedisStore};
use tollgate::Limit;
use tollgate::Quota;
use tollgate::RateLimitLayer;

async fn instance(
    name: &'static str,
    port: u16,
    url: &str,
) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    // Each instance has its own connection and store; the limit lives in Redis.
    let policy = Limit::token_bucket(Quota::per_second(5)?.with_burst(5)?)?;
    let store = RedisStore::builder("shared", policy)
        .namespace("redis-shared-example")
        .deadline(Duration::from_millis(20))
        .failure_policy(FailurePolicy::LocalFallback { share: 0.5 })
        .build(RedisConnection::connect(url).await?)?;
    let layer = RateLimitLayer::builder()
        .key(PeerIp::new())
        .build_with(store)?;
    let app = Router::new().route(
        "/",
        get(move || async move { format!("served by {name}\n") }).layer(layer),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    Ok(addr)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let a = instance("A", 3001, &url).await?;
    let b = instance("B", 3002, &url).await?;
    println!("instances on http://{a} and http://{b}, sharing one limit in {url}");

    let client = reqwest::Client::new();
    for i in 0..8 {
        let addr = if i % 2 == 0 { a } else { b };
        let res = client.get(format!("http://{addr}/")).send().await?;
        let status = res.status();
        let ratelimit = res
            .headers()
            .get("ratelimit")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        println!(
            "request {} -> {addr}: {status} RateLimit: {ratelimit}",
            i + 1
        );
    }

    if std::env::args().any(|a| a == "--once") {
        return Ok(());
    }
    println!("serving; Ctrl-C to stop");
    tokio::signal::ctrl_c().await?;
    Ok(())
}
