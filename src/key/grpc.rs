//! [`GrpcMethod`]: the gRPC method a request calls.

use http::Request;

use super::KeyExtractor;
use crate::response::grpc::is_grpc;

/// Keys gRPC requests by the method they call: the path `/package.Service/Method`
/// (`/helloworld.Greeter/SayHello`), for a limit per method of a tonic server.
///
/// The key is the path as a `String`; it is `None` for a request that is not a gRPC call
/// (its `content-type` does not start with `application/grpc`). Combine it with a client
/// key as a tuple, `(PeerIp, GrpcMethod)`, for a limit per client per method. gRPC
/// metadata are HTTP/2 headers: [`HeaderKey::new("x-api-key")`](super::HeaderKey) keys by
/// an API key sent as metadata.
///
/// See the [module docs](super) for the other extractors.
///
/// ```
/// use tollgate::key::{GrpcMethod, KeyExtractor};
///
/// let call = http::Request::post("/helloworld.Greeter/SayHello")
///     .header("content-type", "application/grpc")
///     .body(())?;
/// assert_eq!(GrpcMethod::new().extract(&call).as_deref(), Some("/helloworld.Greeter/SayHello"));
/// let page = http::Request::get("/index.html").body(())?;
/// assert_eq!(GrpcMethod::new().extract(&page), None);
/// # Ok::<(), http::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct GrpcMethod;

impl GrpcMethod {
    /// Keys gRPC calls by their method's path.
    pub const fn new() -> Self {
        Self
    }
}

impl<B> KeyExtractor<Request<B>> for GrpcMethod {
    type Key = String;

    fn extract(&self, req: &Request<B>) -> Option<String> {
        is_grpc(req.headers()).then(|| req.uri().path().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_calls_only() {
        let call = |ct: &str| {
            Request::post("/pkg.Svc/Do")
                .header("content-type", ct)
                .body(())
                .unwrap()
        };
        let m = GrpcMethod::new();
        assert_eq!(
            m.extract(&call("application/grpc+proto")).unwrap(),
            "/pkg.Svc/Do"
        );
        assert_eq!(m.extract(&call("application/json")), None);
    }
}
