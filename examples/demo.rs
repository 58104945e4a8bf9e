//! The tollgate demo: four routes, four policies, every response carrying the IETF
//! `RateLimit` / `RateLimit-Policy` fields, refusals with `Retry-After` and a problem+json
//! body.
//!
//! ```sh
//! cargo run --example demo            # in-memory store, serves on 127.0.0.1:3000 (or $PORT)
//! # the same limits shared by every instance through Redis:
//! TOLLGATE_REDIS_URL=redis://127.0.0.1:6379 cargo run --example demo --features redis
//! ```
//!
//! - `GET /token`:  5 per second, burst 10, per client IP (token bucket)
//! - `GET /strict`: 5 per second, no burst, per client IP (strict leaky meter)
//! - `GET /queue`:  5 per second, queue of 10, per client IP (delayed, excess refused)
//! - `GET /api`:    5 per second, burst 5, per `x-api-key` header (keyless callers share
//!   one bucket)

use std::{hash::Hash, net::SocketAddr, sync::Arc};

use axum::{routing::get, Router};
use tollgate::{
    clock::TokioClock,
    key::{HeaderKey, PeerIp},
    store::KeyBytes,
    store::MemoryStore,
    store::Store,
    ConfigError, Limit, Quota, RateLimitLayer,
};

/// Where limits live: this process, or Redis when `TOLLGATE_REDIS_URL` is set.
#[derive(Clone)]
struct Stores {
    #[cfg(feature = "redis")]
    redis: Option<tollgate::store::RedisConnection>,
}

impl Stores {
    async fn from_env() -> Result<Self, Box<dyn std::error::Error>> {
        #[cfg(feature = "redis")]
        if let Ok(url) = std::env::var("TOLLGATE_REDIS_URL") {
            println!("store: Redis at {url}");
            let conn = tollgate::store::RedisConnection::connect(&url).await?;
            return Ok(Stores { redis: Some(conn) });
        }
        if std::env::var("TOLLGATE_REDIS_URL").is_ok() {
            return Err("TOLLGATE_REDIS_URL is set: run with --features redis".into());
        }
        println!("store: in memory");
        Ok(Stores {
            #[cfg(feature = "redis")]
            redis: None,
        })
    }

    fn store<K>(&self, limit: Limit) -> Result<Arc<dyn Store<Option<K>>>, ConfigError>
    where
        K: Hash + Eq + Clone + Send + Sync + KeyBytes + 'static,
    {
        #[cfg(feature = "redis")]
        if let Some(conn) = &self.redis {
            let store = tollgate::store::RedisStore::builder(limit)
                .namespace("tollgate-demo")
                .build(conn.clone())?;
            return Ok(Arc::new(store));
        }
        Ok(Arc::new(
            MemoryStore::new(limit).with_clock(TokioClock::new()),
        ))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stores = Stores::from_env().await?;
    let five = Quota::per_second(5)?;
    let per_ip = |limit| -> Result<_, ConfigError> {
        RateLimitLayer::builder()
            .key(PeerIp::new())
            .build_with(stores.store(limit)?)
    };
    let token = per_ip(Limit::token_bucket(five.with_burst(10)?)?)?;
    let strict = per_ip(Limit::leaky_meter(five)?)?;
    let queue = per_ip(Limit::leaky_queue(five, 10)?)?;
    let api = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key")?)
        .build_with(stores.store(Limit::token_bucket(five.with_burst(5)?)?)?)?;

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
