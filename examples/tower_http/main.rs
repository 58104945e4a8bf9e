//! tollgate beside tower-http: `TraceLayer`, `CorsLayer` and `TimeoutLayer` around a rate
//! limit, and a page on another origin that reads the limit's fields and its 429.
//!
//! ```sh
//! cargo run --example tower_http            # API on 127.0.0.1:3000 (or $PORT), page on the next port
//! TOLLGATE_EXAMPLE_SELFTEST=1 cargo run --example tower_http # drive itself and check
//! ```
//!
//! Open the page in a browser: its script calls the API three times (2 per minute per
//! client IP) and shows the status, `RateLimit`, `RateLimit-Policy` and `Retry-After` of
//! each answer. A browser lets a script on another origin read these fields only when
//! the API's CORS answer lists them in `Access-Control-Expose-Headers`; the layers and
//! their order are explained in `app.rs` and in the crate's cookbook. `TraceLayer` reports
//! through `tracing`: an app installs its own subscriber (e.g. `tracing-subscriber`) to see
//! a span per request with its status and latency.

use std::net::SocketAddr;

use axum::http::HeaderValue;
use tokio::net::TcpListener;

mod app;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let selftest = std::env::var("TOLLGATE_EXAMPLE_SELFTEST").as_deref() == Ok("1");
    let port: u16 = match std::env::var("PORT").ok().and_then(|p| p.parse().ok()) {
        _ if selftest => 0,
        port => port.unwrap_or(3000),
    };
    let api_listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let page_port = if selftest { 0 } else { port.saturating_add(1) };
    let page_listener = TcpListener::bind(("127.0.0.1", page_port)).await?;
    let (api_addr, page_addr) = (api_listener.local_addr()?, page_listener.local_addr()?);

    let page_origin = HeaderValue::try_from(format!("http://{page_addr}"))?;
    let api = app::api(app::cors(page_origin.clone()))?
        .into_make_service_with_connect_info::<SocketAddr>();
    let site = app::site(app::page(&[format!("http://{api_addr}")]), |findings| {
        println!("the page read:\n{findings}")
    });
    let api_server = tokio::spawn(async move { axum::serve(api_listener, api).await });
    tokio::spawn(async move { axum::serve(page_listener, site).await });
    if selftest {
        return drive(api_addr, page_origin).await;
    }
    println!("API listening on http://{api_addr}/api/hello");
    println!("open http://{page_addr}/ in a browser: the page calls the API from another origin");
    println!("  curl -si -H 'origin: http://{page_addr}' http://{api_addr}/api/hello");
    api_server.await??;
    Ok(())
}

/// What a browser relies on, checked with plain requests carrying the page's `Origin`.
async fn drive(api: SocketAddr, origin: HeaderValue) -> Result<(), Box<dyn std::error::Error>> {
    let client = reqwest::Client::new();
    let url = format!("http://{api}/api/hello");
    let origin = origin.to_str()?;

    println!("preflights are answered by CorsLayer, outside the limit (never charged):");
    for _ in 0..3 {
        let res = client
            .request(reqwest::Method::OPTIONS, &url)
            .header("origin", origin)
            .header("access-control-request-method", "GET")
            .send()
            .await?;
        println!("  OPTIONS {}", res.status());
        assert!(res.status().is_success());
        assert_eq!(res.headers()["access-control-allow-origin"], origin);
    }

    println!("three calls from the page's origin ({}):", app::POLICY);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let res = client.get(&url).header("origin", origin).send().await?;
        let h = res.headers();
        let field = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("-");
        println!(
            "  {} ratelimit: {} | retry-after: {} | expose: {}",
            res.status(),
            field("ratelimit"),
            field("retry-after"),
            field("access-control-expose-headers"),
        );
        // Every answer, the 429 too, carries the CORS fields a browser needs to hand the
        // response and its rate-limit fields to the page's script.
        assert_eq!(field("access-control-allow-origin"), origin);
        let exposed = field("access-control-expose-headers").to_ascii_lowercase();
        for name in app::exposed_headers() {
            assert!(exposed.contains(name.as_str()), "{name} not exposed");
        }
        assert!(h.contains_key("ratelimit") && h.contains_key("ratelimit-policy"));
        statuses.push(res.status().as_u16());
        if res.status() == 429 {
            assert!(h.contains_key("retry-after"));
        }
    }
    assert_eq!(statuses, [200, 200, 429]);
    println!("selftest ok");
    Ok(())
}
