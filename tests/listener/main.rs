//! The listener (`tollgate::listener`): connection limits at accept, and the README's
//! quick start under floods of slow connections.
#![cfg(feature = "listener")]

mod connections;
#[cfg(target_os = "linux")]
mod flood;
