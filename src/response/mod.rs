//! Refusals and rate-limit header fields.
//!
//! - `429 Too Many Requests` (RFC 6585) with `Retry-After` in whole seconds rounded *up*
//!   (a 300 ms wait is `Retry-After: 1`, never `0`) and `Cache-Control: no-store`.
//! - The IETF fields of draft-ietf-httpapi-ratelimit-headers-10 on every response, one
//!   item per limit: `RateLimit-Policy: "100-per-1s";q=100;w=1` (static, formatted once when
//!   the layer is built) and `RateLimit: "100-per-1s";r=42;t=1` (`r` remaining, `t` seconds
//!   until one more unit is available, rounded up).
//! - Optionally the legacy `X-RateLimit-Limit` / `-Remaining` / `-Reset` trio read by
//!   GitHub-style clients (`Reset` is a Unix time in seconds, as GitHub sends it), about the
//!   limit with the fewest units left.
//! - A body of RFC 9457 `application/problem+json` of type `quota-exceeded` naming the
//!   `violated-policies` (the default), or a custom rejection closure.
//!
//! # gRPC
//!
//! A request whose `content-type` starts with `application/grpc` (a tonic service is a
//! tower HTTP service) is refused the way gRPC clients and their retry policies read: a
//! trailers-only response (HTTP `200`, one HEADERS frame, no body) with
//! `grpc-status: 8` (`RESOURCE_EXHAUSTED`), a `grpc-message`, and `grpc-status-details-bin`
//! holding a `google.rpc.Status` whose details carry a `google.rpc.RetryInfo` with the
//! exact retry delay, to the nanosecond. `Retry-After` and the IETF fields are sent too, as
//! metadata. The layer's other answers to a gRPC request are statuses as well: a failed
//! store under fail-closed is `UNAVAILABLE`, a deny list `PERMISSION_DENIED`, and a keyless
//! request under [`MissingKey::Reject`](crate::key::MissingKey::Reject) the code that means what the HTTP status
//! means (`401` `UNAUTHENTICATED`, `400` `INVALID_ARGUMENT`, `403` `PERMISSION_DENIED`).
//! A custom rejection closure ([`Builder::on_rejection`](crate::ratelimit::Builder::on_rejection)) answers HTTP requests only; turn the gRPC
//! answers off with [`Builder::grpc_status`](crate::ratelimit::Builder::grpc_status)`(false)` to have it answer everything.
//!
//! ```
//! use http_body_util::Empty;
//! use tollgate::{key::HeaderKey, Limit, Quota, RateLimitLayer};
//! use tower::{ServiceBuilder, ServiceExt as _};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let svc = ServiceBuilder::new()
//!     .layer(RateLimitLayer::new(HeaderKey::new("x-api-key")?, Limit::token_bucket(Quota::per_second(1)?)?))
//!     .service_fn(|_| async { Ok::<_, std::convert::Infallible>(http::Response::new(Empty::<bytes::Bytes>::new())) });
//! let call = || {
//!     http::Request::post("/helloworld.Greeter/SayHello")
//!         .header("content-type", "application/grpc")
//!         .header("x-api-key", "k1")
//!         .body(Empty::<bytes::Bytes>::new())
//!         .unwrap()
//! };
//! svc.clone().oneshot(call()).await?;
//! let refused = svc.oneshot(call()).await?;
//! assert_eq!(refused.status(), 200); // a trailers-only gRPC response
//! assert_eq!(refused.headers()["grpc-status"], "8"); // RESOURCE_EXHAUSTED
//! assert!(refused.headers().contains_key("grpc-status-details-bin")); // RetryInfo: 1 s
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod body;
mod format;
pub(crate) mod grpc;
mod head;
mod settle;
mod values;

pub use body::RateLimitBody;
#[cfg(feature = "json")]
pub(crate) use format::plain;
pub use format::refusal;
pub(crate) use format::{
    own_answer, problem_body, quota_refusal, Answers, Extra, Fields, Rejection, ResponseHeaders,
    QUOTA_EXCEEDED, RATELIMIT, RATELIMIT_POLICY,
};
pub use head::ResponseHead;
pub(crate) use settle::{Pending, SettleRule};
pub(crate) use values::{
    prefixed_value, rate_limit_item, retry_after_secs, sf_string, shared_value,
};
