//! The API of the `tower_http` example and the page that calls it from another origin.
//! `tests/browser.rs` serves these same routers to a headless Chromium.

use std::time::Duration;

use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use tollgate::key::PeerIp;
use tollgate::{ConfigError, RateLimitLayer};
use tower::ServiceBuilder;
use tower_http::cors::CorsLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

/// The API's limit: 2 requests per minute per client IP, so a page's third call is
/// refused with a 429 and `Retry-After`.
pub(crate) const POLICY: &str = "2/min";

/// The response fields a page on another origin may read: the rate-limit fields are not
/// on the CORS safelist, so without this list `fetch` shows them as absent.
pub(crate) fn exposed_headers() -> [HeaderName; 3] {
    [
        HeaderName::from_static("ratelimit"),
        HeaderName::from_static("ratelimit-policy"),
        RETRY_AFTER,
    ]
}

/// CORS for the page's origin, exposing the rate-limit fields.
pub(crate) fn cors(page_origin: HeaderValue) -> CorsLayer {
    CorsLayer::new()
        .allow_origin(page_origin)
        .allow_methods([Method::GET])
        .expose_headers(exposed_headers())
}

/// The API (`GET /api/hello`) behind tower-http's layers and the rate limit, outermost
/// first:
///
/// 1. `TraceLayer`: every request is traced with its final status and latency, refusals
///    and CORS preflights included.
/// 2. `CorsLayer`: adds `Access-Control-Allow-Origin` and the exposed fields to every
///    response, the 429s the limit answers too (inside the limit, a refusal would carry
///    no CORS header and the page would see a network error instead of a 429), and
///    answers preflight `OPTIONS` requests itself, so they are never charged.
/// 3. the rate limit: refuses at once, before any work starts.
/// 4. `TimeoutLayer`: bounds the handler's work alone; a refusal never waits on it.
pub(crate) fn api(cors: CorsLayer) -> Result<Router, ConfigError> {
    let limit = RateLimitLayer::builder()
        .key(PeerIp::new())
        .policy(POLICY)
        .build()?;
    let layers = ServiceBuilder::new()
        .layer(TraceLayer::new_for_http())
        .layer(cors)
        .layer(limit)
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            Duration::from_secs(10),
        ));
    Ok(Router::new()
        .route("/api/hello", get(|| async { "hello\n" }))
        .layer(layers))
}

/// A page that calls `GET /api/hello` three times on each API in `apis` (base URLs on
/// other origins), shows what its script could read, and posts the same findings as JSON
/// to `/report` on its own origin: `{ "<api>": [ {status, ratelimit, policy, retry_after}
/// or {error}, .. ], .. }`.
pub(crate) fn page(apis: &[String]) -> String {
    let apis = apis
        .iter()
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    PAGE.replace("__APIS__", &apis)
}

const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>tollgate beside tower-http</title></head>
<body>
<h1>Calls to the API on another origin</h1>
<pre id="out">running...</pre>
<script>
const apis = [__APIS__];
async function probe(api) {
  const seen = [];
  for (let i = 0; i < 3; i++) {
    try {
      const res = await fetch(api + "/api/hello", { cache: "no-store" });
      seen.push({
        status: res.status,
        ratelimit: res.headers.get("ratelimit"),
        policy: res.headers.get("ratelimit-policy"),
        retry_after: res.headers.get("retry-after"),
      });
    } catch (e) {
      seen.push({ error: String(e) });
    }
  }
  return seen;
}
(async () => {
  const findings = {};
  for (const api of apis) findings[api] = await probe(api);
  const text = JSON.stringify(findings, null, 1);
  document.getElementById("out").textContent = text;
  await fetch("/report", { method: "POST", body: text });
})();
</script>
</body></html>
"#;

/// The page's own origin: `GET /` serves `page`, `POST /report` hands the findings to
/// `on_report`.
pub(crate) fn site(
    page: String,
    on_report: impl Fn(String) + Clone + Send + Sync + 'static,
) -> Router {
    Router::new()
        .route(
            "/",
            get(move || {
                let page = page.clone();
                async move { ([(CONTENT_TYPE, "text/html; charset=utf-8")], page) }
            }),
        )
        .route(
            "/report",
            post(move |body: String| {
                on_report(body);
                async { StatusCode::NO_CONTENT }
            }),
        )
}
