//! tollgate: rate-limiting middleware for tower and axum.
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

pub mod error;
pub mod key;

pub use error::ConfigError;

/// The most limits (quotas) one policy may combine.
pub const MAX_LIMITS: usize = 4;
/// Placeholder re-export path for the quota module (filled in by the core).
pub mod quota {
    /// The longest time horizon a bucket may span, in nanoseconds (about 146 years).
    pub const MAX_HORIZON: u64 = 1 << 62;
}
