//! Rate limiting for any `tower::Service`, not only HTTP.
//!
//! [`RateLimitLayer`] limits a service of any request type: a job runner, an outbound
//! client, a gRPC stub. A refusal is an error, [`RateLimited`], boxed into
//! `tower::BoxError`; downcast it to read the exact retry-after. So it composes
//! with `tower::timeout` and `tower::retry`. For a client calling a third-party API, a
//! leaky-bucket queue makes calls wait for their slot instead of failing.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{generic::{RateLimitLayer, RateLimited}, key::key_fn, Quota};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), tower::BoxError> {
//! struct Job { tenant: u32 }
//! let layer = RateLimitLayer::builder()
//!     .key(key_fn(|job: &Job| Some(job.tenant)))
//!     .token_bucket(Quota::per_second(1)?)
//!     .build::<Job>()?;
//! let mut svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|job: Job| async move { Ok::<_, tower::BoxError>(job.tenant) });
//!
//! assert_eq!(svc.ready().await?.call(Job { tenant: 1 }).await?, 1);
//! let err = svc.ready().await?.call(Job { tenant: 1 }).await.unwrap_err();
//! let limited = err.downcast_ref::<RateLimited>().expect("a rate-limit refusal");
//! assert_eq!(limited.retry_after(), Some(Duration::from_secs(1)));
//! # Ok(()) }
//! ```

mod answer;
mod future;
mod layer;
mod service;

pub use self::layer::RateLimitLayer;

/// Configures a generic [`RateLimitLayer`]: made by [`RateLimitLayer::builder`]. The
/// setters every rate-limit layer has, and this layer's own `select`, key lists and
/// `build`, are listed below.
pub type Builder<X, C> = crate::ratelimit::Builder<X, C, answer::Generic>;
pub use crate::error::{KeyMissing, RateLimited};
