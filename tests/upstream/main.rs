//! The upstream layer through the public API: what it learns from an upstream's answers
//! (pauses, quotas), how callers wait or fail, its retry policy and its doors for jobs;
//! and fleets of clients sharing a Redis against real upstreams.
#![cfg(feature = "upstream")]

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "redis")]
mod fleet;
mod learning;
