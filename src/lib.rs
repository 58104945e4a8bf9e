//! tollgate: rate-limiting middleware for tower and axum.
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

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
    cost_fn, Builder, Cost, CostFn, MissingKey, OnStoreError, RateLimitLayer, UnitCost,
};
pub use quota::Quota;
pub use service::{RateLimit, ResponseFuture};
pub use store::{MemoryStore, Store};

/// The most limits (quotas) one policy may combine.
pub const MAX_LIMITS: usize = 4;

/// A boxed error, as used by tower (`tower::BoxError`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
