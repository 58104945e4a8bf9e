//! The stores through their public API: the in-memory store's decisions, memory and
//! eviction, its equivalence with the policies' own functions, the conformance checks a
//! store must pass, and what a layer does when its store fails.

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "conformance")]
mod conformance;
mod equivalence;
mod errors;
mod memory;
