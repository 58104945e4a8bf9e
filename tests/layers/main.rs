//! The layers' behaviour through the public API: the HTTP and generic rate limits, the
//! in-flight and fair layers, as services and behind real servers (HTTP, gRPC, beside
//! tower-http's layers), their fields, deadlines, metrics and events, and each refusal of
//! a bad configuration.

#[path = "../support/mod.rs"]
mod support;

mod config_errors;
#[cfg(feature = "json")] // the login routes read the user from the body; addresses need `axum`
mod counting;
mod deadlines;
mod fair;
mod fair_retry;
mod fields;
mod grpc;
mod http_e2e;
mod inflight;
mod limit_by_name;
#[cfg(feature = "metrics")]
mod metrics;
mod observe;
#[cfg(feature = "axum")]
mod proxy;
mod remaining;
mod service;
mod tower_http;
