#![doc = include_str!("docs/crate.md")]
#![doc = include_str!("docs/counting.md")]
#![doc = include_str!("docs/observability.md")]
#![doc = include_str!("docs/cookbook.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod access;
pub mod algorithm;
pub mod clock;
pub mod cost;
pub mod decision;
pub mod error;
pub mod fair;
mod future;
mod gate;
pub mod generic;
pub mod inflight;
pub mod key;
mod layer;
pub mod limiter;
mod observe;
pub mod policy;
pub mod quota;
pub mod response;
mod service;
pub mod store;

pub use algorithm::Limit;
pub use decision::Decision;
pub use error::ConfigError;
pub use fair::FairLimitLayer;
pub use inflight::InFlightLimitLayer;
pub use layer::{Builder, DecisionEvent, DefaultStore, RateLimitLayer};
pub use policy::Policy;
pub use quota::Quota;
pub use service::{RateLimit, ResponseFuture};

/// The most limits (quotas) one policy may combine.
pub const MAX_LIMITS: usize = 4;

/// The README's snippets, compiled and run as doctests.
#[cfg(all(doctest, feature = "axum", feature = "json", feature = "redis"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// A boxed error, as used by tower (`tower::BoxError`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
