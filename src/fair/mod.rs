#![doc = include_str!("../docs/fair.md")]

mod layer;
mod memory;
#[cfg(feature = "redis")]
mod redis;
mod share;
mod store;

pub use layer::{FairLimit, FairLimitBuilder, FairLimitLayer, ResponseFuture};
pub use memory::MemoryFair;
#[cfg(feature = "redis")]
pub use redis::{RedisFair, RedisFairBuilder};
pub use share::Share;
pub use store::FairStore;
