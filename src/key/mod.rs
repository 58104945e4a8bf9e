#![doc = include_str!("../docs/keys.md")]

mod bytes;
pub(crate) mod cidr;
mod client_ip;
mod composite;
mod extension;
mod forwarded;
mod grpc;
mod head;
mod header;
mod host;
pub(crate) mod peer_ip;
mod route;

#[cfg(feature = "json")]
mod body;
#[cfg(feature = "jwt")]
mod claim;

#[cfg(feature = "json")]
pub use self::body::{BodyField, BodyFieldKey, BodyFieldLayer};
pub use self::bytes::KeyBytes;
#[cfg(feature = "jwt")]
pub use self::claim::{jwt, BearerClaim};
pub use self::client_ip::{ClientIp, ForwardedHeader};
pub use self::composite::{key_fn, KeyExtractorExt};
pub use self::extension::ExtensionKey;
pub use self::grpc::GrpcMethod;
pub use self::head::RequestHead;
pub use self::header::{HeaderBytes, HeaderKey};
pub use self::host::Host;
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
