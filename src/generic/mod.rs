#![doc = include_str!("../docs/generic.md")]

mod answer;
mod future;
mod layer;
mod service;

pub use self::future::ResponseFuture;
pub use self::layer::RateLimitLayer;
pub use self::service::RateLimit;

pub use crate::error::RateLimited;
