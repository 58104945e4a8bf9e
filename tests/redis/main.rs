//! The Redis stores against real servers started for the tests (`support::redis`): the
//! same decisions as in memory, batching, clusters, names, the fleet and its fallback,
//! local-first, Sentinel and TLS. The scenarios that stop, slow or fail over a server under
//! load are in `tests/redis_faults`, one at a time.
#![cfg(feature = "redis")]

#[path = "../support/mod.rs"]
mod support;

mod atomicity;
mod batching;
mod budget;
mod cluster;
mod fallback;
mod fleet;
mod identity;
mod keys;
mod local_first;
mod negative_cache;
mod policies;
mod semantics;
mod sentinel;
mod tls;
