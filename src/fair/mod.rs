#![doc = include_str!("../docs/fair.md")]

mod answer;
mod future;
mod layer;
mod memory;
#[cfg(feature = "redis")]
mod redis;
mod service;
mod share;
mod store;

pub use future::ResponseFuture;
pub use layer::{FairLimitBuilder, FairLimitLayer};
pub use memory::MemoryFair;
#[cfg(feature = "redis")]
pub use redis::RedisFair;
pub use service::FairLimit;
pub use share::Share;
pub use store::FairStore;
