//! The HTTP rate-limit layer: [`RateLimitLayer`] and its [`Builder`].
//!
//! A request's way through it: the service's `call` asks the core
//! (`limiter`) for a decision, which screens the request (`access`), extracts its key,
//! picks its policy, asks the store and hands the decision to the HTTP flavour (`answer`):
//! the fields for an admitted response, or a refusal. The response future (`future`)
//! calls the inner service, or waits first (a queue, a network store), and adds the
//! fields to its response.
//!
//! ```
//! use axum::{routing::get, Router};
//! use tollgate::{key::PeerIp, RateLimitLayer};
//!
//! let layer = RateLimitLayer::builder()
//!     .key(PeerIp::new())
//!     .policy("5/s burst 10")
//!     .build()?;
//! let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

mod access;
mod answer;
mod builder;
mod flavour;
mod future;
mod http_builder;
mod layer;
pub(crate) mod limiter;
mod service;
mod settings;

pub use self::answer::DecisionEvent;
pub use self::builder::Builder;
pub use self::future::ResponseFuture;
pub use self::layer::RateLimitLayer;
pub use self::service::RateLimit;
