//! One limit per client IP address on a whole `Router`: 10 requests per minute, burst 10.
//!
//! ```sh
//! cargo run --example per_ip                                # 127.0.0.1:3000 (or $PORT)
//! TRUSTED_PROXIES=10.0.0.0/8 cargo run --example per_ip     # behind a reverse proxy
//! TOLLGATE_EXAMPLE_SELFTEST=1 cargo run --example per_ip    # drive itself and check
//! ```
//!
//! `PeerIp` needs the TCP peer address, so the app is served with
//! `into_make_service_with_connect_info::<SocketAddr>()`. Behind a reverse proxy every peer
//! is the proxy: `ClientIp::trusting([..])` keys by the client the trusted proxies wrote into
//! `X-Forwarded-For`, walking it from the right so a client cannot pick its own key.

use std::{io, net::SocketAddr};

use axum::{routing::get, Router};
use tokio::task::JoinHandle;
use tollgate::key::{ClientIp, PeerIp};
use tollgate::Quota;
use tollgate::RateLimitLayer;

fn routes() -> Router {
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/other", get(|| async { "same limit, same client\n" }))
}

/// The app keyed by the TCP peer, or by the forwarded client when proxies are trusted.
fn app(trusted_proxies: Option<&str>) -> Result<Router, Box<dyn std::error::Error>> {
    let quota = Quota::per_minute(10)?;
    Ok(match trusted_proxies {
        None => routes().layer(
            RateLimitLayer::builder()
                .key(PeerIp::new())
                .token_bucket(quota)
                .build()?,
        ),
        Some(list) => routes().layer(
            RateLimitLayer::builder()
                .key(ClientIp::trusting(list.split(',').map(str::trim))?)
                .token_bucket(quota)
                .build()?,
        ),
    })
}

/// Binds `127.0.0.1:port` and serves `app` with the peer address `PeerIp` reads.
async fn serve(app: Router, port: u16) -> io::Result<(SocketAddr, JoinHandle<io::Result<()>>)> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let make = app.into_make_service_with_connect_info::<SocketAddr>();
    Ok((
        listener.local_addr()?,
        tokio::spawn(async move { axum::serve(listener, make).await }),
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var("TOLLGATE_EXAMPLE_SELFTEST").as_deref() == Ok("1") {
        return selftest().await;
    }
    let port = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let trusted = std::env::var("TRUSTED_PROXIES").ok();
    let (addr, server) = serve(app(trusted.as_deref())?, port).await?;
    println!("per-IP limit (10/min) listening on http://{addr}");
    println!("  for i in $(seq 11); do curl -s -o /dev/null -w '%{{http_code}} ' http://{addr}/; done; echo");
    println!("  # the 11th is 429; /other shares the limit: curl -i http://{addr}/other");
    if trusted.is_some() {
        println!("  curl -i -H 'x-forwarded-for: 203.0.113.9' http://{addr}/  # via a proxy");
    }
    server.await??;
    Ok(())
}

async fn selftest() -> Result<(), Box<dyn std::error::Error>> {
    let client = reqwest::Client::new();
    let fetch =
        |url: String, xff: &'static str| client.get(url).header("x-forwarded-for", xff).send();

    // Direct clients: every request comes from 127.0.0.1 (the header is ignored, since no
    // proxy is trusted), across both routes.
    let (addr, _) = serve(app(None)?, 0).await?;
    let mut codes = Vec::new();
    for i in 0..11 {
        let path = ["/", "/other"][i % 2];
        let res = fetch(format!("http://{addr}{path}"), "192.0.2.1").await?;
        let header = |name| res.headers().get(name).cloned();
        let (ratelimit, retry) = (header("ratelimit"), header("retry-after"));
        println!(
            "#{:<2} {path:<6} {} {ratelimit:?} {retry:?}",
            i + 1,
            res.status()
        );
        codes.push(res.status().as_u16());
    }
    assert_eq!(
        codes,
        [[200; 10].as_slice(), &[429]].concat(),
        "the 11th request from one IP is refused"
    );

    // Behind a proxy: 127.0.0.1 is the trusted proxy, the client is in X-Forwarded-For.
    let (addr, _) = serve(app(Some("127.0.0.1"))?, 0).await?;
    let url = || format!("http://{addr}/");
    for _ in 0..10 {
        assert_eq!(fetch(url(), "203.0.113.9").await?.status(), 200);
    }
    let a = fetch(url(), "203.0.113.9").await?.status().as_u16();
    // A forged leftmost entry changes nothing: the walk stops at the entry the proxy appended.
    let forged = fetch(url(), "6.6.6.6, 203.0.113.9").await?.status();
    let forged = forged.as_u16();
    let b = fetch(url(), "198.51.100.4").await?.status().as_u16();
    println!("behind a proxy: client A's 11th {a}, A with a forged entry {forged}, client B {b}");
    assert_eq!((a, forged, b), (429, 429, 200));
    println!("selftest ok");
    Ok(())
}
