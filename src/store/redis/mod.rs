#![doc = include_str!("../../docs/redis.md")]

mod batch;
mod breaker;
mod failure;
pub(crate) mod keys;
mod local_first;
mod negative;
mod script;
mod store;

pub use breaker::BreakerState;
pub(crate) use breaker::{within, Breaker};
pub use failure::FailurePolicy;
pub use local_first::{LocalFirstStore, SyncTask};
pub use store::{RedisConnection, RedisStore, RedisStoreBuilder};
