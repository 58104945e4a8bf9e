#![doc = include_str!("../docs/inflight.md")]

mod answer;
mod body;
mod future;
mod layer;
mod memory;
#[cfg(feature = "redis")]
mod redis;
mod service;
mod store;

pub use body::InFlightBody;
pub use future::ResponseFuture;
pub use layer::{InFlightLimitBuilder, InFlightLimitLayer};
pub use memory::MemoryInFlight;
#[cfg(feature = "redis")]
pub use redis::RedisInFlight;
pub use service::InFlightLimit;
pub use store::InFlightStore;
