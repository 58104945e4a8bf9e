#![doc = include_str!("../docs/upstream.md")]

mod fields;
mod layer;
mod pacer;
mod retry;
mod service;

pub use self::layer::{UpstreamBuilder, UpstreamLayer};
pub use self::retry::RetryAfter;
pub use self::service::{ResponseFuture, Upstream};
