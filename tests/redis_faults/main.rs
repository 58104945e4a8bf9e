//! Redis failing under load, with real servers started for the tests (`support::redis`):
//! killed, stopped, slowed, its scripts flushed, restarted, demoted behind its clients
//! (`chaos`, `failover`), and a fleet of instances holding a hot key's limit through an
//! outage (`outage`). Each scenario measures latency and counts against real time, so they
//! run one at a time, in a binary of their own.
#![cfg(feature = "redis")]

#[path = "../support/mod.rs"]
mod support;

mod chaos;
mod failover;
mod outage;

/// The scenarios share the two cores: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
