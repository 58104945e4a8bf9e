//! Rate-limiting middleware for [tower](https://docs.rs/tower) and
//! [axum](https://docs.rs/axum).
//!
//! Put `.layer(RateLimitLayer::...)` on an axum `Router`, on one route, or on any tower
//! `Service`; choose **who** is limited (a [key extractor](key)), **how** (token bucket,
//! strict leaky meter, leaky-bucket delay queue, fixed or sliding window, several quotas at
//! once, weighted costs) and get standard refusals: `429` with `Retry-After` rounded up, the
//! IETF `RateLimit` / `RateLimit-Policy` fields and an RFC 9457 problem body.
//!
//! # Quick start
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{routing::get, Router};
//! use tollgate::{key::PeerIp, Quota, RateLimitLayer};
//!
//! # fn main() -> Result<(), tollgate::ConfigError> {
//! // 5 requests per second per client IP, bursts of up to 10.
//! let limit = RateLimitLayer::builder()
//!     .key(PeerIp::new())
//!     .token_bucket(Quota::per_second(5)?.with_burst(10)?)
//!     .build()?;
//!
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(limit);
//! // Serve with `app.into_make_service_with_connect_info::<SocketAddr>()` so the peer
//! // address is known.
//! # let _ = app.into_make_service_with_connect_info::<SocketAddr>();
//! # Ok(()) }
//! ```
//!
//! # Choosing how
//!
//! | builder method | algorithm | a rested client sends 20 at once against 5/s |
//! |---|---|---|
//! | [`Builder::token_bucket`] | GCRA / token bucket | up to the burst pass at once |
//! | [`Builder::leaky_meter`] | leaky bucket as a meter | 1 passes, the rest are refused |
//! | [`Builder::leaky_queue`] | leaky bucket as a queue (nginx `limit_req`) | each waits for its 200 ms slot, up to the queue size; the excess is refused |
//! | [`Builder::limit`] with [`Limit::fixed_window`] / [`Limit::sliding_window`] | windows | up to the window's limit |
//!
//! Several `.limit(..)` calls combine: a request passes only if every limit admits it, and
//! only then is every limit charged. [`Builder::cost`] weighs requests (by route, header,
//! body size). All decisions are exact functions of the state and the time
//! ([`algorithm`]); `Retry-After` is the exact wait rounded up to whole seconds.
//!
//! # Choosing who
//!
//! See [`key`]: the peer IP (IPv6 grouped by /56), the client IP behind *trusted* proxies
//! only, a header (API key), a value an auth layer put in the extensions (user id,
//! tenant), a bearer-token claim, the route, the method, one global key, or a combination.
//! Requests without a key follow [`MissingKey`]; the default shares one bucket among them
//! and is never silently unlimited.
//!
//! # Responses
//!
//! See [`response`]. Every response carries `RateLimit-Policy` and `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers-10), one item per limit; the legacy
//! `X-RateLimit-*` trio is opt-in. A refusal is `429 Too Many Requests` with
//! `Retry-After`, `Cache-Control: no-store` and an `application/problem+json` body of type
//! `quota-exceeded` naming the violated limits; [`Builder::on_rejection`] replaces it. The
//! [`Decision`] can be put into the request extensions for handlers
//! ([`Builder::expose_decision`]).
//!
//! # Any tower service
//!
//! [`RateLimitLayer::generic`] limits a service of any request type; a refusal is the
//! typed error [`generic::RateLimited`] (boxed in [`BoxError`]) carrying the exact
//! retry-after, so a `tower::retry` policy can wait exactly that long. A leaky queue makes a
//! client wait for its slot instead, the usual choice in front of a third-party API.
//!
//! # Shared limits across instances (feature `redis`)
//!
//! `store::RedisStore` decides every request with one Lua script, atomically on the Redis
//! server and on the server's clock, so N instances enforce one limit; plug it in with
//! [`Builder::build_with`]. Every call has a deadline (default 20 ms) and a circuit
//! breaker; on failure it fails open, fails closed, or falls back to a local limiter at a
//! share of the quota (`store::FailurePolicy`); a refused client is refused locally until
//! its retry-after without a Redis call. `store::LocalFirstStore` keeps Redis off the
//! request path and reconciles in the background. The decision's [`Decision::source`]
//! says which of these decided. See the `store::redis` module docs.
//!
//! # Differences from `tower::limit::RateLimit`
//!
//! `tower::limit::RateLimit` is one fixed-window counter for the whole service that makes
//! callers wait in `poll_ready`, so it cannot key by client and holds back every caller
//! behind one slow window. tollgate decides per key in `call`, never reserves capacity in
//! `poll_ready` (readiness is forwarded), refuses or queues per request, and reports the
//! decision in standard headers. A layer value is one limit, shared by all its clones.
//!
//! # Memory and speed
//!
//! The in-memory [`MemoryStore`] keeps one `u64` per key for GCRA-based limits, updates
//! it with one compare-and-swap under a shard's shared lock, forgets keys whose state is
//! back to "fresh" as part of normal inserts, and caps the number of keys (default 2^20)
//! under a flood. See `BENCHMARKS.md` in the repository for measured figures.
//!
//! # Features
//!
//! - `axum` (default): `ConnectInfo` peer addresses and `MatchedPath` route keys.
//! - `jwt`: `key::BearerClaim`, a key from a bearer token's claim.
//! - `redis`: limits shared across instances through Redis.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

pub mod algorithm;
pub mod clock;
pub mod decision;
pub mod error;
mod future;
pub mod generic;
pub mod key;
mod layer;
pub mod quota;
pub mod response;
mod service;
pub mod store;

pub use algorithm::{Algorithm, Limit, Policy};
pub use decision::{Decision, LimitReport, Outcome, Source};
pub use error::{ConfigError, StoreError};
pub use layer::{
    cost_fn, Builder, Cost, CostFn, DefaultStore, MissingKey, OnStoreError, RateLimitLayer,
    UnitCost,
};
pub use quota::Quota;
pub use service::{RateLimit, ResponseFuture};
pub use store::{MemoryStore, Store};

/// The most limits (quotas) one policy may combine.
pub const MAX_LIMITS: usize = 4;

/// The README's snippets, compiled and run as doctests.
#[cfg(all(doctest, feature = "axum", feature = "redis"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// A boxed error, as used by tower (`tower::BoxError`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
