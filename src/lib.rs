#![doc = include_str!("docs/crate.md")]
#![doc = include_str!("docs/counting.md")]
#![doc = include_str!("docs/observability.md")]
#![doc = include_str!("docs/cookbook.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

// The layers; the machinery they share (crate-private); the building blocks.
pub mod fair;
pub mod generic;
pub mod inflight;
pub mod ratelimit;
#[cfg(feature = "upstream")]
#[cfg_attr(docsrs, doc(cfg(feature = "upstream")))]
pub mod upstream;

mod core;
mod observe;
mod options;

pub mod algorithm;
pub mod clock;
pub mod cost;
mod deadline;
pub mod decision;
pub mod error;
pub mod key;
#[cfg(feature = "listener")]
pub mod listener;
pub mod policy;
pub mod quota;
#[cfg(feature = "redis")]
mod redis;
pub mod response;
pub mod store;

pub use algorithm::Limit;
pub use deadline::Deadline;
pub use decision::Decision;
pub use error::ConfigError;
pub use fair::FairLimitLayer;
pub use inflight::InFlightLimitLayer;
pub use policy::Policy;
pub use quota::Quota;
pub use ratelimit::RateLimitLayer;

/// The README's snippets, compiled and run as doctests.
#[cfg(all(
    doctest,
    feature = "axum",
    feature = "json",
    feature = "listener",
    feature = "redis",
    feature = "upstream"
))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
