//! tollgate: rate-limiting middleware for tower and axum.
#![cfg_attr(docsrs, feature(doc_auto_cfg))]
#![forbid(unsafe_code)]

pub mod algorithm;
pub mod clock;
pub mod decision;
pub mod error;
pub mod key;
pub mod quota;
pub mod store;

pub use algorithm::{Algorithm, Limit, Policy};
pub use decision::{Decision, LimitReport, Outcome, Source};
pub use error::{ConfigError, StoreError};
pub use quota::Quota;
pub use store::{MemoryStore, Store};

/// The most limits (quotas) one policy may combine.
pub const MAX_LIMITS: usize = 4;
