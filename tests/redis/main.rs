//! The Redis stores against real servers started for the tests (`support::redis`): the
//! same decisions as in memory, batching, clusters, Sentinel, TLS, and what the stores do
//! while Redis is slow, stopped, killed or failing over.
#![cfg(feature = "redis")]

#[path = "../support/mod.rs"]
mod support;

mod atomicity;
mod batching;
mod budget;
mod chaos;
mod cluster;
mod failover;
mod fallback;
mod fleet;
mod identity;
mod keys;
mod local_first;
mod negative_cache;
mod outage;
mod policies;
mod semantics;
mod sentinel;
mod tls;

/// The scenarios that stop, slow or fail over a server under load (`chaos`, `outage`,
/// `failover`) share the two cores: one at a time in this binary.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
