//! In-flight (concurrency) limits: at most N requests of each key in flight at once.
//!
//! A rate limit counts requests *started* per unit of time; an in-flight limit counts
//! requests *not yet finished*, whatever their rate: Stripe's concurrent-requests
//! limiter, ASP.NET Core's `ConcurrencyLimiter`, nginx's `limit_conn`. It suits slow,
//! expensive endpoints (exports, reports, uploads) where a client's tenth parallel request
//! hurts more than its thousandth quick one.
//!
//! ```
//! use axum::{routing::get, Router};
//! use tollgate::{key::PeerIp, InFlightLimitLayer};
//!
//! async fn export() -> &'static str {
//!     "a large CSV"
//! }
//!
//! // At most 2 exports per client IP at once; a third is refused with 429.
//! let app: Router = Router::new()
//!     .route("/export", get(export))
//!     .layer(InFlightLimitLayer::new(PeerIp::new(), 2));
//! # let _ = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
//! ```
//!
//! # When a slot is held
//!
//! A request takes a slot of its key when it is admitted, and holds it until its
//! response *body* ends (its last frame is read, or it fails) or the response, its body
//! or the response future is dropped (the client left, a timeout fired). A streamed
//! download holds its slot as long as it streams. Any key extractor of [`crate::key`]
//! chooses the key; requests without one follow [`MissingKey`](crate::key::MissingKey)
//! ([`InFlightLimitBuilder::on_missing_key`]; by default they share one set of slots).
//!
//! ```
//! use std::convert::Infallible;
//! use axum::body::Body;
//! use http::{Request, Response};
//! use tollgate::{key::Global, InFlightLimitLayer};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//! let svc = ServiceBuilder::new()
//!     .layer(InFlightLimitLayer::new(Global::new(), 1))
//!     .service_fn(|_: Request<Body>| async {
//!         Ok::<_, Infallible>(Response::new(Body::from("report")))
//!     });
//! let get = || Request::new(Body::empty());
//!
//! let first = svc.clone().oneshot(get()).await?;
//! assert_eq!(first.headers()["ratelimit"], "\"inflight\";r=0");
//! // The first response's body has not ended: its request is still in flight.
//! let second = svc.clone().oneshot(get()).await?;
//! assert_eq!(second.status(), 429);
//! assert_eq!(second.headers()["retry-after"], "1");
//!
//! drop(first); // the client went away: the slot is back
//! assert_eq!(svc.clone().oneshot(get()).await?.status(), 200);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Queueing
//!
//! By default a request over the limit is refused at once. With
//! [`InFlightLimitBuilder::queue`], up to that many requests per key wait for a slot,
//! first come first served; a slot given back goes straight to the oldest waiter. A
//! waiter is refused after [`InFlightLimitBuilder::max_wait`] (default 10 s), and one
//! whose future is dropped leaves the queue.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{key::HeaderKey, InFlightLimitLayer};
//!
//! let limit = InFlightLimitLayer::builder(HeaderKey::new("x-api-key")?, 4)
//!     .queue(8)
//!     .max_wait(Duration::from_secs(5))
//!     .label("reports")
//!     .build()?;
//! # let _: axum::Router = axum::Router::new().layer(limit);
//! # Ok::<(), tollgate::ConfigError>(())
//! ```
//!
//! # Responses
//!
//! An admitted response carries the limit as items of the IETF fields
//! (draft-ietf-httpapi-ratelimit-headers), appended beside those of other tollgate layers:
//! `RateLimit-Policy: "inflight";q=2;qu="concurrent-requests"` and
//! `RateLimit: "inflight";r=1`, `r` being the key's free slots once this request took
//! its own. A refusal is `429 Too Many Requests` with `RateLimit: "inflight";r=0`,
//! `Cache-Control: no-store`, an `application/problem+json` body of type
//! `quota-exceeded` naming the limit in `violated-policies`, and `Retry-After: 1`: a
//! slot frees when some response ends, which cannot be known in advance, so the answer is
//! the shortest wait a client can be told (never `0`, which invites a client to retry in
//! a tight loop). The `RateLimit` item has no `t` for the same reason. A refused gRPC call
//! (`content-type: application/grpc...`) gets `RESOURCE_EXHAUSTED` with a one-second
//! `RetryInfo` instead, the same fields riding along as metadata.
//!
//! # Shared through Redis (feature `redis`)
//!
//! `RedisInFlight` counts in Redis, so the limit holds across instances. Each request in
//! flight is a *lease*: a member of one sorted set per key
//! (`{namespace}:inflight:v1:{#sha1}`, the key hashed as in the Redis rate store), scored
//! with its expiry on the Redis server's clock. One Lua script drops expired leases and
//! admits a request while fewer than N remain; the response's end removes its lease. While
//! leases are held, a background task renews them every third of their TTL (default
//! 30 s, `RedisInFlightBuilder::lease_ttl`): an instance that dies holding leases stops
//! renewing them, and other instances have its slots back within one TTL.
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tollgate::{inflight::RedisInFlight, key::PeerIp, store::RedisConnection, InFlightLimitLayer};
//!
//! let store = RedisInFlight::builder()
//!     .namespace("myapp")
//!     .lease_ttl(Duration::from_secs(30))
//!     .deadline(Duration::from_millis(20))
//!     .breaker(3, Duration::from_millis(500)) // the defaults, spelled out
//!     .build(RedisConnection::connect("redis://127.0.0.1:6379").await?)?;
//! let limit = InFlightLimitLayer::builder(PeerIp::new(), 2).build_with(store)?;
//! # let _: axum::Router = axum::Router::new().layer(limit);
//! # Ok(()) }
//! ```
//!
//! Every Redis call has a deadline (default 20 ms); a call that fails or misses it
//! follows the layer's [`OnStoreError`](crate::store::OnStoreError): by default the
//! request goes through without a slot (fail open), or it is answered `503` (fail
//! closed). After 3 such failures in a row (`RedisInFlightBuilder::breaker`) a circuit
//! breaker stops calling Redis for 500 ms, so that during an outage requests get that
//! answer at once rather than each after the deadline; then one probe call closes it
//! again if Redis answers. Leases are given back whatever the breaker's state.
//!
//! A queued request on Redis retries the script with a short growing backoff (10 ms,
//! doubling up to 100 ms) until it is admitted or its `max_wait` has passed, so waiters
//! of different instances are not served strictly in order; the queue length bounds the
//! waiters of each key on each instance.
//!
//! # Deployment caveats
//!
//! - The memory store counts per process: N instances admit up to N times the limit.
//! - A lease outlives a frozen instance by up to one TTL: a short TTL gives slots back
//!   sooner after a crash, at the price of more renewal calls. An instance that cannot
//!   reach Redis to renew for longer than the TTL loses its leases; the requests keep
//!   running, and others may be admitted in their place.

mod answer;
mod body;
mod future;
mod layer;
mod memory;
#[cfg(feature = "redis")]
mod redis;
mod service;
mod store;

pub use body::InFlightBody;
pub use layer::{InFlightLimitBuilder, InFlightLimitLayer};
pub use memory::MemoryInFlight;
#[cfg(feature = "redis")]
pub use redis::{RedisInFlight, RedisInFlightBuilder};
pub use service::InFlightLimit;
pub use store::InFlightStore;
