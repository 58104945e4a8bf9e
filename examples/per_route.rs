//! Different limits on different routes, per client IP.
//!
//! ```sh
//! cargo run --example per_route                               # 127.0.0.1:3000 (or $PORT)
//! TOLLGATE_EXAMPLE_SELFTEST=1 cargo run --example per_route   # drive itself and check
//! ```
//!
//! - `POST /login`: its own layer on one route, 3 per minute.
//! - `GET /users` and `GET /users/{id}`: ONE layer value on both routes, so they share one
//!   limit of 5 per minute (a layer value is a limit; clones share its state).
//! - `GET /admin/stats` and `GET /admin/audit`: one `Router::route_layer` over the group,
//!   keyed by `(PeerIp, MatchedRoute)`: 2 per minute per client *per route*. `MatchedRoute`
//!   needs a layer that runs after routing, i.e. `route_layer` or a route's own layer.
//! - `GET /health`: no limit.

use std::net::SocketAddr;

use axum::routing::{get, post};
use axum::Router;
use tollgate::key::{MatchedRoute, PeerIp};
use tollgate::Quota;
use tollgate::RateLimitLayer;

fn app() -> Result<Router, Box<dyn std::error::Error>> {
    let login = RateLimitLayer::builder()
        .key(PeerIp::new())
        .token_bucket(Quota::per_minute(3)?)
        .build()?;
    let users = RateLimitLayer::builder()
        .key(PeerIp::new())
        .token_bucket(Quota::per_minute(5)?)
        .build()?;
    let admin = RateLimitLayer::builder()
        .key((PeerIp::new(), MatchedRoute::new()))
        .token_bucket(Quota::per_minute(2)?)
        .build()?;

    let admin_routes = Router::new()
        .route("/admin/stats", get(|| async { "stats\n" }))
        .route("/admin/audit", get(|| async { "audit log\n" }))
        .route_layer(admin);
    Ok(Router::new()
        .route("/login", post(|| async { "welcome\n" }).layer(login))
        .route(
            "/users",
            get(|| async { "all users\n" }).layer(users.clone()),
        )
        .route("/users/{id}", get(|| async { "one user\n" }).layer(users))
        .merge(admin_routes)
        .route("/health", get(|| async { "ok\n" })))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let selftest = std::env::var("TOLLGATE_EXAMPLE_SELFTEST").as_deref() == Ok("1");
    let port = match std::env::var("PORT").ok().and_then(|p| p.parse().ok()) {
        _ if selftest => 0,
        port => port.unwrap_or(3000),
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let make = app()?.into_make_service_with_connect_info::<SocketAddr>();
    let server = tokio::spawn(async move { axum::serve(listener, make).await });
    if selftest {
        return drive(addr).await;
    }
    println!("per-route limits listening on http://{addr}");
    println!("  for i in 1 2 3 4; do curl -s -o /dev/null -w '%{{http_code}} ' -X POST http://{addr}/login; done; echo");
    println!("  for p in users users/1 users/2 users/3 users/4 users/5; do curl -s -o /dev/null -w '%{{http_code}} ' http://{addr}/$p; done; echo");
    println!("  for p in stats stats stats audit; do curl -s -o /dev/null -w '%{{http_code}} ' http://{addr}/admin/$p; done; echo");
    server.await??;
    Ok(())
}

/// Sends `(method, path)` requests in order and returns their status codes.
async fn statuses(addr: SocketAddr, calls: &[(&str, &str)]) -> reqwest::Result<Vec<u16>> {
    let client = reqwest::Client::new();
    let mut codes = Vec::new();
    for (method, path) in calls {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a valid method");
        let res = client
            .request(method, format!("http://{addr}{path}"))
            .send()
            .await?;
        println!("  {path:<13} {}", res.status());
        codes.push(res.status().as_u16());
    }
    Ok(codes)
}

async fn drive(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    println!("/login has its own limit (3/min):");
    let login = statuses(addr, &[("POST", "/login"); 4]).await?;
    assert_eq!(login, [200, 200, 200, 429]);

    println!("/users and /users/{{id}} share one limit (5/min), untouched by /login's:");
    let users = [
        ("GET", "/users"),
        ("GET", "/users/1"),
        ("GET", "/users"),
        ("GET", "/users/2"),
    ];
    let shared = statuses(addr, &[&users[..], &users[..2]].concat()).await?;
    assert_eq!(shared, [200, 200, 200, 200, 200, 429]);

    println!("/admin/* has one route_layer, but a bucket per route (2/min each):");
    let admin = [("GET", "/admin/stats"); 3];
    let per_route = statuses(addr, &[&admin[..], &[("GET", "/admin/audit")]].concat()).await?;
    assert_eq!(per_route, [200, 200, 429, 200]);

    println!("/health is not limited, and the others are still refused:");
    let rest = [("GET", "/health"), ("POST", "/login"), ("GET", "/users/3")];
    assert_eq!(statuses(addr, &rest).await?, [200, 429, 429]);
    println!("selftest ok");
    Ok(())
}
