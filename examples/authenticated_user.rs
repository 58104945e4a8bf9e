//! A limit per authenticated user: 5 requests per minute per user, keyed by the `UserId`
//! an auth middleware put in the request extensions.
//!
//! ```sh
//! cargo run --example authenticated_user                               # 127.0.0.1:3000 (or $PORT)
//! TOLLGATE_EXAMPLE_SELFTEST=1 cargo run --example authenticated_user   # drive itself and check
//! ```
//!
//! Layer order matters: in axum, a layer added later wraps the ones added before it, so
//! `.layer(rate_limit).layer(from_fn(auth))` runs `auth` first and the limiter sees its
//! `UserId`. A request with no `UserId` (no token) is refused with 401 by the limiter
//! (`MissingKey::Reject`); a wrong token is refused with 401 by `auth` itself. The handler
//! reads the limiter's `Decision` (`.expose_decision(true)`) to report the quota left.

use std::net::SocketAddr;

use axum::{
    extract::Request,
    http::{
        header::{AUTHORIZATION, WWW_AUTHENTICATE},
        HeaderValue, StatusCode,
    },
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::get,
    Extension, Router,
};
use tollgate::{key::ExtensionKey, key::MissingKey, Decision, Quota, RateLimitLayer};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct UserId(&'static str);

/// The "user database": bearer token -> user.
const TOKENS: [(&str, UserId); 2] = [
    ("alice-token", UserId("alice")),
    ("bob-token", UserId("bob")),
];

/// Puts the token's `UserId` into the extensions; lets anonymous requests through without one.
async fn auth(mut req: Request, next: Next) -> Response {
    const CHALLENGE: HeaderValue = HeaderValue::from_static("Bearer");
    if let Some(value) = req.headers().get(AUTHORIZATION) {
        let token = value.to_str().ok().and_then(|v| v.strip_prefix("Bearer "));
        match TOKENS.iter().find(|(t, _)| Some(*t) == token) {
            Some((_, user)) => req.extensions_mut().insert(user.clone()),
            None => {
                let challenge = [(WWW_AUTHENTICATE, CHALLENGE)];
                return (StatusCode::UNAUTHORIZED, challenge, "unknown token\n").into_response();
            }
        };
    }
    let mut res = next.run(req).await;
    // A 401 must carry `WWW-Authenticate` (RFC 9110); the limiter's keyless refusal has none.
    if res.status() == StatusCode::UNAUTHORIZED {
        res.headers_mut()
            .entry(WWW_AUTHENTICATE)
            .or_insert(CHALLENGE);
    }
    res
}

async fn me(Extension(user): Extension<UserId>, Extension(d): Extension<Decision>) -> String {
    format!("hello {}, {} requests left\n", user.0, d.remaining())
}

fn app() -> Result<Router, Box<dyn std::error::Error>> {
    let per_user = RateLimitLayer::builder()
        .key(ExtensionKey::<UserId>::new())
        .token_bucket(Quota::per_minute(5)?)
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .expose_decision(true)
        .build()?;
    Ok(Router::new()
        .route("/me", get(me))
        .layer(per_user) // runs second
        .layer(middleware::from_fn(auth))) // added last: runs first
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
    println!("per-user limit (5/min) listening on http://{addr}");
    println!("  curl -i -H 'authorization: Bearer alice-token' http://{addr}/me");
    println!("  curl -i -H 'authorization: Bearer bob-token' http://{addr}/me");
    println!("  curl -i http://{addr}/me   # no token: 401");
    server.await??;
    Ok(())
}

/// GETs `/me`; returns the status, whether there was a `WWW-Authenticate`, and the body.
async fn me_as(addr: SocketAddr, token: Option<&str>) -> reqwest::Result<(u16, bool, String)> {
    let mut req = reqwest::Client::new().get(format!("http://{addr}/me"));
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let res = req.send().await?;
    let status = res.status().as_u16();
    let challenged = res.headers().contains_key("www-authenticate");
    let body = res.text().await?;
    let who = token.unwrap_or("(no token)");
    println!("  {who:<12} -> {status} {}", body.trim_end());
    Ok((status, challenged, body))
}

async fn drive(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let (a, b) = (Some("alice-token"), Some("bob-token"));
    let mut seen = Vec::new();
    for token in [a, a, a, a, a, a, b, None, Some("mallory")] {
        seen.push(me_as(addr, token).await?);
    }
    let statuses: Vec<u16> = seen.iter().map(|s| s.0).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 200, 401, 401]);
    for (i, (_, _, body)) in seen[..5].iter().enumerate() {
        let expected = format!("alice, {} requests left", 4 - i);
        assert!(body.contains(&expected), "{body}");
    }
    assert!(seen[6].2.contains("bob, 4 requests left"), "bob's own");
    assert!(seen[7].1 && seen[8].1, "401s carry a challenge");
    println!("selftest ok");
    Ok(())
}
