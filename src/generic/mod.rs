#![doc = include_str!("../docs/generic.md")]

mod layer;
mod service;

pub use self::layer::{Builder, RateLimitLayer};
pub use self::service::{RateLimit, ResponseFuture};
pub use crate::error::{KeyMissing, RateLimited};
