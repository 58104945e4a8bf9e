//! What every Redis-backed store uses (feature `redis`): the connection, the deadline of a
//! call (and a request's budget across layers), the circuit breaker, the count of the
//! fleet, key naming, script invocation, and the settings and setters every store's
//! builder shares. The stores themselves are the rate store ([`crate::store::redis`]), the
//! in-flight store ([`crate::inflight::RedisInFlight`]) and the fair-share store
//! ([`crate::fair::RedisFair`]).

mod breaker;
mod builder;
mod claims;
mod connection;
mod deadline;
mod fleet;
mod keys;
mod node;
mod script;
mod target;

pub(crate) use breaker::Breaker;
pub use breaker::BreakerState;
pub(crate) use builder::Common;
pub(crate) use builder::OwnClock;
pub use builder::RedisBuilder;
pub(crate) use claims::{policies_claim, Claim};
pub(crate) use connection::Conn;
pub use connection::RedisConnection;
pub(crate) use deadline::within;
pub(crate) use fleet::Fleet;
pub(crate) use keys::{push_sha1_hex, store_prefix, KeyNames};
pub(crate) use script::{run, Invocation};
