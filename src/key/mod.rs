//! Who is limited: key extractors.
//!
//! A [`KeyExtractor`] reads a request and returns the key the limit is counted against, or
//! `None` when the request carries no usable key (what happens then is the layer's
//! `on_missing_key` setting, see the crate docs). Extractors are generic over the whole
//! request type, so the same trait serves HTTP requests (`http::Request<B>`) and any other
//! `tower::Service` request.
//!
//! # Built-in extractors
//!
//! | extractor | key | what it reads |
//! |---|---|---|
//! | [`PeerIp`] | [`IpAddr`](std::net::IpAddr) | the TCP peer's address (axum's or, feature `tonic`, tonic's connect info); IPv6 grouped by /56 |
//! | [`ClientIp`] | [`IpAddr`](std::net::IpAddr) | the client behind trusted proxies (`X-Forwarded-For` or `Forwarded`) |
//! | [`HeaderKey`] | [`HeaderBytes`] | a header such as `x-api-key` (gRPC metadata too), length-capped |
//! | [`ExtensionKey`] / `ExtensionMap` | `T` / `K` | a value an auth layer put in the extensions |
//! | `BearerClaim` (feature `jwt`) | `String` | a claim of the bearer JWT, verified |
//! | `JsonField::key()` (feature `json`) | `JsonField` | a JSON body's field, read by `JsonFieldLayer` on the routes it wraps |
//! | `MatchedRoute` (feature `axum`) | `String` | the matched axum route pattern |
//! | [`GrpcMethod`] | `String` | a gRPC call's method, `/package.Service/Method` |
//! | [`MethodKey`] | [`Method`](http::Method) | the request method |
//! | [`Global`] | `()` | nothing: one limit for everyone |
//! | `KeyFn` ([`key_fn`]) | any | your closure |
//!
//! Combine them: a tuple of up to four extractors is an extractor whose key is the tuple
//! of keys (`None` if any part is `None`), e.g. `(ClientIp, MatchedRoute)` for a limit per
//! client per endpoint; [`KeyExtractorExt::or`] falls back to a second extractor with the
//! same key type (`Or`).
//!
//! # Client addresses
//!
//! Behind a reverse proxy, the TCP peer is the proxy. [`ClientIp`] reads the forwarding
//! header, but only the entries your trusted proxies appended: it walks the header from
//! the right and stops at the first address that is not a trusted proxy. The leftmost
//! `X-Forwarded-For` entry is whatever the client wrote and is never trusted as such.
//!
//! ```
//! use std::net::{IpAddr, SocketAddr};
//! use tollgate::key::{ClientIp, KeyExtractor};
//!
//! let client_ip = ClientIp::trusting(["10.0.0.0/8"])?;
//!
//! // The load balancer (10.0.0.2) connected to us; the client wrote a fake first entry.
//! let mut req = http::Request::builder()
//!     .header("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.7")
//!     .body(())?;
//! req.extensions_mut().insert("10.0.0.2:50000".parse::<SocketAddr>()?);
//! assert_eq!(client_ip.extract(&req), Some("203.0.113.9".parse::<IpAddr>()?));
//!
//! // A client connecting directly cannot choose its key with the header.
//! req.extensions_mut().insert("198.51.100.4:50000".parse::<SocketAddr>()?);
//! assert_eq!(client_ip.extract(&req), Some("198.51.100.4".parse::<IpAddr>()?));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Custom extractors
//!
//! ```
//! use tollgate::key::{key_fn, KeyExtractor};
//!
//! // A custom extractor from a closure: the tenant id of a job.
//! struct Job { tenant: u32 }
//! let by_tenant = key_fn(|job: &Job| Some(job.tenant));
//! assert_eq!(by_tenant.extract(&Job { tenant: 7 }), Some(7));
//! ```

pub(crate) mod cidr;
mod client_ip;
mod composite;
mod extension;
mod forwarded;
mod grpc;
mod head;
mod header;
pub(crate) mod peer_ip;
mod route;

#[cfg(feature = "jwt")]
mod claim;
#[cfg(feature = "json")]
mod json;

#[cfg(feature = "jwt")]
pub use self::claim::{jwt, BearerClaim};
pub use self::client_ip::{ClientIp, ForwardedHeader};
pub use self::composite::{key_fn, KeyExtractorExt};
pub use self::extension::ExtensionKey;
pub use self::grpc::GrpcMethod;
pub use self::head::RequestHead;
pub use self::header::{HeaderBytes, HeaderKey};
#[cfg(feature = "json")]
pub use self::json::{JsonField, JsonFieldKey, JsonFieldLayer};
pub use self::peer_ip::PeerIp;
#[cfg(feature = "axum")]
pub use self::route::MatchedRoute;
pub use self::route::{Global, MethodKey};
pub use crate::options::MissingKey;

/// Reads the rate-limit key out of a request.
///
/// Implement it for your own type, or adapt a closure with [`key_fn`]. Returning `None`
/// means "this request has no key"; it is never an error and never a panic: a malformed
/// header, for example, is treated as absent.
///
/// See the [module docs](self) for the built-in extractors.
pub trait KeyExtractor<Req> {
    /// The key type. It is hashed for the in-memory store and encoded for the Redis store.
    type Key;

    /// Extracts the key, or `None` when the request carries none.
    fn extract(&self, req: &Req) -> Option<Self::Key>;

    /// Called after [`extract`](KeyExtractor::extract) gave `None`: a one-line
    /// explanation when the key is missing because the server is not set up to provide
    /// what this extractor reads (no connection address, no matched route), rather than
    /// because this request lacks it. The layer logs it once (a `tracing` warning), since
    /// such a setup quietly puts every client into one bucket. The default says nothing.
    fn misconfiguration(&self, req: &Req) -> Option<&'static str> {
        let _ = req;
        None
    }
}

/// What [`PeerIp`] and [`ClientIp`] say when a request carries no connection address.
pub(crate) const NO_PEER_ADDRESS: &str = "the request carries no connection address; serve \
     the app with `into_make_service_with_connect_info::<SocketAddr>()`, enable tollgate's \
     `tonic` feature for a tonic server, or insert the peer `SocketAddr` into the request \
     extensions";
