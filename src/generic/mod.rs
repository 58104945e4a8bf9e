#![doc = include_str!("../docs/generic.md")]

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
