//! Custom keys and weighted costs: 10 units per minute per tenant, `search` costs 5 units.
//!
//! ```sh
//! cargo run --example custom_key                               # 127.0.0.1:3000 (or $PORT)
//! TOLLGATE_EXAMPLE_SELFTEST=1 cargo run --example custom_key   # drive itself and check
//! ```
//!
//! - `/t/{tenant}/items`, `/t/{tenant}/search`: keyed by `TenantFromPath`, a struct that
//!   implements `KeyExtractor<Request<B>>` for every body type `B`.
//! - `/v2/items`, `/v2/search`: keyed by the header pair (`x-org`, `x-project`) with a
//!   `key_fn` closure; a request without both headers is refused with 400.

use std::net::SocketAddr;

use axum::{body::Body, routing::get, Router};
use http::{Request, StatusCode};
use tollgate::key::MissingKey;
use tollgate::key::{key_fn, KeyExtractor};
use tollgate::Quota;
use tollgate::RateLimitLayer;

/// The tenant named by the first path segments `/t/{tenant}/...`.
#[derive(Clone, Copy, Debug)]
struct TenantFromPath;

impl<B> KeyExtractor<Request<B>> for TenantFromPath {
    type Key = String;

    fn extract(&self, req: &Request<B>) -> Option<String> {
        let rest = req.uri().path().strip_prefix("/t/")?;
        let tenant = rest.split('/').next().filter(|t| !t.is_empty())?;
        Some(tenant.to_owned())
    }
}

fn app() -> Result<Router, Box<dyn std::error::Error>> {
    // A closure is typed for one request type: axum's `Request<Body>`.
    let search_costs_5 = |req: &Request<Body>| {
        if req.uri().path().ends_with("/search") {
            5
        } else {
            1
        }
    };
    let by_path = RateLimitLayer::builder()
        .key(TenantFromPath)
        .cost(search_costs_5)
        .token_bucket(Quota::per_minute(10)?)
        .build()?;
    let org_project = key_fn(|req: &Request<Body>| {
        let header = |name| req.headers().get(name)?.to_str().ok().map(str::to_owned);
        Some((header("x-org")?, header("x-project")?))
    });
    let by_headers = RateLimitLayer::builder()
        .key(org_project)
        .cost(search_costs_5)
        .token_bucket(Quota::per_minute(10)?)
        .on_missing_key(MissingKey::Reject(StatusCode::BAD_REQUEST))
        .build_for::<Request<Body>>()?;

    let v1 = Router::new()
        .route("/t/{tenant}/items", get(|| async { "items\n" }))
        .route("/t/{tenant}/search", get(|| async { "results\n" }))
        .layer(by_path);
    let v2 = Router::new()
        .route("/v2/items", get(|| async { "items\n" }))
        .route("/v2/search", get(|| async { "results\n" }))
        .layer(by_headers);
    Ok(v1.merge(v2))
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
    let app = app()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    if selftest {
        return drive(addr).await;
    }
    println!("custom keys listening on http://{addr}");
    println!("  curl -i http://{addr}/t/acme/search    # costs 5 of acme's 10 per minute");
    println!("  curl -i http://{addr}/t/globex/items   # another tenant, another bucket");
    println!("  curl -i -H 'x-org: acme' -H 'x-project: web' http://{addr}/v2/search");
    server.await??;
    Ok(())
}

/// GETs `path` with `headers`, prints the status and the `RateLimit` field.
async fn fetch(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> reqwest::Result<u16> {
    let mut req = reqwest::Client::new().get(format!("http://{addr}{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let res = req.send().await?;
    let ratelimit = res.headers().get("ratelimit").cloned();
    println!("  {path:<17} {headers:?} -> {} {ratelimit:?}", res.status());
    Ok(res.status().as_u16())
}

type Headers = &'static [(&'static str, &'static str)];
const WEB: Headers = &[("x-org", "acme"), ("x-project", "web")];
const API: Headers = &[("x-org", "acme"), ("x-project", "api")];

async fn drive(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let cases: [(&str, Headers, u16); 9] = [
        // acme: two searches (5 + 5) spend its 10 units; even a 1-unit call is then refused.
        ("/t/acme/search", &[], 200),
        ("/t/acme/search", &[], 200),
        ("/t/acme/items", &[], 429),
        // globex has a bucket of its own.
        ("/t/globex/search", &[], 200),
        // The header pair: (acme, web) and (acme, api) are two keys; half a pair is none.
        ("/v2/search", WEB, 200),
        ("/v2/search", WEB, 200),
        ("/v2/items", WEB, 429),
        ("/v2/search", API, 200),
        ("/v2/items", &[("x-org", "acme")], 400),
    ];
    for (path, headers, expected) in cases {
        let status = fetch(addr, path, headers).await?;
        assert_eq!(status, expected, "{path} {headers:?}");
    }
    println!("selftest ok");
    Ok(())
}
