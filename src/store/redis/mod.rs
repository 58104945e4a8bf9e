#![doc = include_str!("../../docs/redis.md")]

mod batch;
mod builder;
mod cluster;
mod failure;
mod fallback;
mod local_first;
mod local_state;
mod local_sync;
mod negative;
mod script;
mod send;
mod store;

pub use crate::redis::RedisBuilder;
pub use crate::redis::{BreakerState, RedisConnection};
pub use failure::FailurePolicy;
pub use local_first::LocalFirstStore;
pub use store::RedisStore;
