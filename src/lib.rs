//! Rate-limiting middleware for [tower](https://docs.rs/tower) and
//! [axum](https://docs.rs/axum).
//!
//! Put `.layer(RateLimitLayer::...)` on an axum `Router`, on one route, or on any tower
//! `Service`; choose **who** is limited (a [key extractor](key)), **how** (token bucket,
//! strict leaky meter, leaky-bucket delay queue, fixed or sliding window, several quotas at
//! once, weighted costs), **which policy** applies to each request (plans), and get
//! standard refusals: `429` with `Retry-After` rounded up, the IETF `RateLimit` /
//! `RateLimit-Policy` fields and an RFC 9457 problem body.
//!
//! # Quick start
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{routing::get, Router};
//! use tollgate::{key::PeerIp, Limit, Quota, RateLimitLayer};
//!
//! # fn main() -> Result<(), tollgate::ConfigError> {
//! // 5 requests per second per client IP, bursts of up to 10.
//! let limit = RateLimitLayer::new(
//!     PeerIp::new(),
//!     Limit::token_bucket(Quota::per_second(5)?.with_burst(10)?)?,
//! );
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(limit);
//! // Serve with `app.into_make_service_with_connect_info::<SocketAddr>()` so the peer
//! // address is known.
//! # let _ = app.into_make_service_with_connect_info::<SocketAddr>();
//! # Ok(()) }
//! ```
//!
//! [`RateLimitLayer::new`] takes values already validated and cannot fail;
//! [`RateLimitLayer::builder`] sets everything else (and reports a bad limit when the
//! layer is built).
//!
//! # Choosing how
//!
//! | builder method | algorithm | a rested client sends 20 at once against 5/s |
//! |---|---|---|
//! | [`Builder::token_bucket`](crate::ratelimit::Builder::token_bucket) | GCRA / token bucket | up to the burst pass at once |
//! | [`Builder::leaky_meter`](crate::ratelimit::Builder::leaky_meter) | leaky bucket as a meter | 1 passes, the rest are refused |
//! | [`Builder::leaky_queue`](crate::ratelimit::Builder::leaky_queue) | leaky bucket as a queue (nginx `limit_req`) | each waits for its 200 ms slot, up to the queue size; the excess is refused |
//! | [`Builder::limit`](crate::ratelimit::Builder::limit) with [`Limit::fixed_window`] / [`Limit::sliding_window`] | windows | up to the window's limit |
//!
//! Several `.limit(..)` calls combine: a request passes only if every limit admits it, and
//! only then is every limit charged. [`cost::cost_fn`] weighs requests (by route, header,
//! body size). All decisions are exact functions of the state and the time
//! ([`algorithm`]); `Retry-After` is the exact wait rounded up to whole seconds. Policies
//! can be written as text: `"100/s burst 200"`, `"1000/day window"` ([`policy`]).
//!
//! # Choosing who
//!
//! See [`key`]: the peer IP (IPv6 grouped by /56), the client IP behind *trusted* proxies
//! only, a header (API key), a value an auth layer put in the extensions (user id,
//! tenant), a verified bearer-token claim, the route, the method, one global key, or a
//! combination. Requests without a key follow [`key::MissingKey`]; the default shares
//! one bucket among them and is never silently unlimited.
//!
//! # Plans, live changes, shadow limits
//!
//! A layer can hold several named policies and pick one per request
//! ([`Builder::named_policy`](crate::ratelimit::Builder::named_policy), [`Builder::select`](crate::ratelimit::Builder::select)): a free key gets 10 per minute, a pro
//! key 100, every key also 1 000 per day, in one layer, with one state per key that
//! carries over when its plan changes. [`RateLimitLayer::policy_handle`] swaps the whole
//! set while requests flow, keeping every key's state (see [`policy`] for how state
//! carries over to other quotas). [`Limit::shadow`] runs a limit without refusing (and
//! [`Limit::enforce_percent`] for a share of keys) to watch what it would do first.
//!
//! # Counting what matters
//!
//! [`Builder::skip`](crate::ratelimit::Builder::skip), [`Builder::allow_ips`](crate::ratelimit::Builder::allow_ips) and [`Builder::allow_keys`](crate::ratelimit::Builder::allow_keys) exempt health
//! checks and internal callers (never limited, no fields); [`Builder::deny_ips`](crate::ratelimit::Builder::deny_ips) and
//! [`Builder::deny_keys`](crate::ratelimit::Builder::deny_keys) answer `403`. [`Builder::count_when`](crate::ratelimit::Builder::count_when) counts only the responses
//! that match (failed logins: each request is charged when admitted and refunded from its
//! response, so concurrent attempts cannot overrun the limit), [`Builder::ban`](crate::ratelimit::Builder::ban) bans a key
//! once a counted response takes its last unit, and [`Builder::settle_cost`](crate::ratelimit::Builder::settle_cost) charges or
//! refunds the difference between an estimated cost and the one the response reports.
//! [`RateLimitLayer::reset`] forgets a key's state. [`InFlightLimitLayer`] bounds the
//! requests of each key in flight at once (see [`inflight`]).
//!
//! # Fair sharing
//!
//! [`FairLimitLayer`] shares a pool among keys the way Linux's HTB shares a link: each
//! key is guaranteed a rate and borrows the pool's spare capacity up to a ceiling, spare
//! capacity going to the keys in proportion to their guarantees (see [`fair`]).
//!
//! # Responses
//!
//! See [`response`]. Every response carries `RateLimit-Policy` and `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers-10), one item per limit, from every tollgate
//! layer on the route; the legacy `X-RateLimit-*` trio is opt-in. A refusal is
//! `429 Too Many Requests` with `Retry-After`, `Cache-Control: no-store` and an
//! `application/problem+json` body of type `quota-exceeded` naming the violated limits;
//! [`Builder::on_rejection`](crate::ratelimit::Builder::on_rejection) replaces it and [`response::refusal`] builds it for a
//! handler that decides by hand. [`Builder::on_decision`](crate::ratelimit::Builder::on_decision) sees every decision with the
//! request's head. The [`Decision`] can be put into the request extensions for handlers
//! ([`Builder::expose_decision`](crate::ratelimit::Builder::expose_decision)).
//!
//! # Watching
//!
//! Every refusal, every request a limit in shadow would have refused, and every store
//! failure is a `tracing` event (target `tollgate`): refusals at `INFO` with the layer's
//! label, the policy, the route, a hash of the key (never the key) and the retry-after in
//! ms; store failures, and decisions a store made without its backend, at `WARN` for the
//! first of each second per layer and `DEBUG` for the others, so an outage does not log
//! every request. A swap of a layer's policies is logged at `INFO`.
//!
//! With the feature `metrics` (default), decisions are counted through the
//! [`metrics`](https://docs.rs/metrics) facade: install any recorder (a Prometheus or
//! OpenTelemetry exporter) *before* building layers, whose handles are registered then.
//! Names, units and attributes follow the OpenTelemetry conventions (ASP.NET Core's
//! `aspnetcore.rate_limiting.*` is the nearest precedent); keys never become attributes.
//!
//! | metric | kind, unit | attributes |
//! |---|---|---|
//! | `tollgate.rate_limit.requests` | counter | `tollgate.limiter`, `tollgate.policy`, `tollgate.result` (`admitted`, `delayed`, `refused`, `shadow_refused`) |
//! | `tollgate.in_flight.requests` | counter | `tollgate.limiter` (the in-flight layer's label), `tollgate.result` (`admitted`, `refused`, `fail_open`, `fail_closed`) |
//! | `tollgate.rate_limit.screened` | counter | `tollgate.limiter`, `tollgate.result` (`exempt`: skipped or on an allow list; `denied`: on a deny list) |
//! | `tollgate.rate_limit.request.time_in_queue` | histogram, seconds | `tollgate.limiter`, `tollgate.policy` |
//! | `tollgate.rate_limit.degraded_decisions` | counter | `tollgate.limiter`, `tollgate.source` (`negative_cache`, `fallback`, `fail_open`, `fail_closed`) |
//! | `tollgate.store.operation.duration` | histogram, seconds | `tollgate.store`, `tollgate.outcome` (`ok`, `error`) |
//! | `tollgate.store.errors` | counter | `tollgate.store`, `error.type` (`timeout`, `circuit_open`, `backend`) |
//! | `tollgate.store.breaker.state` | gauge (0 closed, 1 half-open, 2 open) | `tollgate.store` |
//! | `tollgate.store.keys` | gauge | `tollgate.store` |
//! | `tollgate.store.evictions` | counter | `tollgate.store`, `tollgate.state` (`fresh`, `with_state`: evicted to fit the budget) |
//!
//! `tollgate.limiter` is the layer's label ([`Builder::label`](crate::ratelimit::Builder::label), default `tollgate`),
//! `tollgate.policy` the policy's name in its set (`default` for a layer of one unnamed
//! policy), `tollgate.store` the store's label (the layer's for the store a layer builds).
//! A request refused for lack of a key ([`key::MissingKey::Reject`]) or by a failed
//! store under [`store::OnStoreError::FailClosed`] is not a rate-limit decision: the
//! first counts nowhere, the second in `degraded_decisions`.
//!
//! # gRPC
//!
//! A tonic server is a tower HTTP service: `Server::builder().layer(RateLimitLayer::...)`
//! limits it. A refused call is the gRPC status `RESOURCE_EXHAUSTED` with the exact retry
//! delay in a `google.rpc.RetryInfo` (see [`response`](response#grpc)); key by the peer
//! ([`key::PeerIp`], feature `tonic`), by metadata ([`key::HeaderKey`]`::new("x-api-key")`)
//! or by method ([`key::GrpcMethod`]). See the `grpc` example.
//!
//! # Any tower service
//!
//! [`generic::RateLimitLayer`] limits a service of any request type; a refusal is the
//! typed error [`generic::RateLimited`] (boxed in `tower::BoxError`) carrying the exact
//! retry-after, so a `tower::retry` policy can wait exactly that long. A leaky queue makes a
//! client wait for its slot instead, the usual choice in front of a third-party API.
//!
//! # Shared limits across instances (feature `redis`)
//!
//! `store::RedisStore` decides every request with one Lua script, atomically on the Redis
//! server and on the server's clock, so N instances enforce one limit; plug it in with
//! [`Builder::build_with`](crate::ratelimit::Builder::build_with). Every call has a deadline (default 20 ms) and a circuit
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
//! The in-memory [`store::MemoryStore`] keeps one `u64` per key for a token bucket (and a
//! 4-byte tag of the policy that wrote it),
//! updates it with one compare-and-swap under a shard's shared lock, forgets keys whose
//! state is back to fresh as part of normal inserts, and holds at most a memory budget
//! (32 MiB by default) under a flood. See `BENCHMARKS.md` in the repository for measured
//! figures.
//!
//! # Features
//!
//! - `axum` (default): `ConnectInfo` peer addresses and `MatchedPath` route keys.
//! - `json` (default): `key::JsonFieldLayer`, a key from a JSON request body's field.
//! - `jwt`: `key::BearerClaim`, a key from a verified bearer token's claim.
//! - `redis`: limits shared across instances through Redis.
//! - `metrics` (default): metrics through the `metrics` facade (see Watching).
//! - `serde`: policies and policy sets read from configuration files.
//! - `tsc`: `clock::TscClock`, the CPU's time-stamp counter as an opt-in clock.
//! - `tonic`: [`key::PeerIp`] reads the peer address a tonic server inserts.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

// The layers, then what they share, top down: a module uses those below it.
pub mod fair;
pub mod generic;
pub mod inflight;
pub mod ratelimit;

mod future;
mod gate;
mod limiter;
mod observe;
mod options;

pub mod algorithm;
pub mod clock;
pub mod cost;
pub mod decision;
pub mod error;
pub mod key;
pub mod policy;
pub mod quota;
#[cfg(feature = "redis")]
mod redis;
pub mod response;
pub mod store;

pub use algorithm::Limit;
pub use decision::Decision;
pub use error::ConfigError;
pub use fair::FairLimitLayer;
pub use inflight::InFlightLimitLayer;
pub use policy::Policy;
pub use quota::Quota;
pub use ratelimit::RateLimitLayer;

/// The README's snippets, compiled and run as doctests.
#[cfg(all(doctest, feature = "axum", feature = "json", feature = "redis"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
