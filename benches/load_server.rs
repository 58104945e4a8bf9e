//! Target for the HTTP load benchmark (`bench/http_load.sh`): an axum hello-world, bare or
//! behind tollgate.
//!
//! ```sh
//! cargo run --release -p tollgate-benches --example load_server -- bare 8081      # no limiter
//! cargo run --release -p tollgate-benches --example load_server -- limited 8082   # token bucket per peer IP,
//!                                                             # admits everything, IETF headers on
//! cargo run --release -p tollgate-benches --example load_server -- limited-noheaders 8084  # same, headers off
//! cargo run --release -p tollgate-benches --example load_server -- refusing 8083  # same, but nearly all refused
//! cargo run --release -p tollgate-benches --example load_server -- noop 8085      # a layer doing nothing
//! cargo run --release -p tollgate-benches --example load_server -- governor 8086  # tower_governor, per peer IP,
//!                                                             # admits everything, no headers
//! cargo run --release -p tollgate-benches --example load_server -- governor-headers 8087  # same, its headers on
//! WORKERS=1 cargo run --release -p tollgate-benches --example load_server -- bare 8081  # one worker thread
//! ```

use std::net::SocketAddr;

use axum::{routing::get, Router};
use tollgate::{key::PeerIp, Quota, RateLimitLayer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `WORKERS=1` runs the server on one thread (the benchmark pins it to its own core).
    let workers = std::env::var("WORKERS").ok().and_then(|w| w.parse().ok());
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        rt.worker_threads(n);
    }
    rt.enable_all().build()?.block_on(serve())
}

async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "bare".into());
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(8081);
    let app = Router::new().route("/", get(|| async { "Hello, World!" }));
    let app = match mode.as_str() {
        "bare" => app,
        "limited" => app.layer(
            RateLimitLayer::builder()
                .key(PeerIp::new())
                .token_bucket(Quota::per_second(1_000_000_000)?.with_burst(1_000_000)?)
                .build()?,
        ),
        // The peer, for the instruction counts of `bench/http_instructions.sh`: tower_governor
        // keyed by peer IP, a limit nothing exhausts, without and with its headers.
        "governor" => app.layer(tower_governor::GovernorLayer::new(
            governor_config().finish().ok_or("tower_governor config")?,
        )),
        "governor-headers" => app.layer(tower_governor::GovernorLayer::new(
            governor_config()
                .use_headers()
                .finish()
                .ok_or("tower_governor config")?,
        )),
        // Any layer at all, doing nothing: what axum's `Router::layer` itself costs.
        "noop" => app.layer(tower::util::MapResponseLayer::new(|r| r)),
        "limited-noheaders" => app.layer(
            RateLimitLayer::builder()
                .key(PeerIp::new())
                .token_bucket(Quota::per_second(1_000_000_000)?.with_burst(1_000_000)?)
                .ietf_headers(false)
                .build()?,
        ),
        "refusing" => app.layer(
            RateLimitLayer::builder()
                .key(PeerIp::new())
                .token_bucket(Quota::per_minute(1)?)
                .build()?,
        ),
        other => {
            return Err(format!(
                "unknown mode {other:?}: bare | limited | limited-noheaders | refusing | noop | governor | governor-headers"
            )
            .into())
        }
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    eprintln!("load_server {mode} on {}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// tower_governor keyed by peer IP (its default) with a limit nothing exhausts.
fn governor_config() -> tower_governor::governor::GovernorConfigBuilder<
    tower_governor::key_extractor::PeerIpKeyExtractor,
    governor::middleware::NoOpMiddleware<governor::clock::QuantaInstant>,
> {
    let mut config = tower_governor::governor::GovernorConfigBuilder::default();
    config
        .period(std::time::Duration::from_nanos(1))
        .burst_size(1_000_000);
    config
}
