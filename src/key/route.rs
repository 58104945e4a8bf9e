//! [`MatchedRoute`], [`MethodKey`] and [`Global`]: keys that are not about the client.

use http::{Method, Request};

use super::KeyExtractor;

/// Keys requests by the axum route they matched (`/users/{id}`, not `/users/17`), for a
/// limit per endpoint (feature `axum`).
///
/// The key is the route pattern as a `String`, read from axum's
/// [`MatchedPath`](axum::extract::MatchedPath) extension, which axum inserts when a route
/// matches. Add the layer with `Router::route_layer` (or on a route,
/// `get(handler).layer(..)`): it limits the routes and never sees a request no route
/// matched. Added with `Router::layer` it wraps the router's fallback too: matched routes
/// are keyed the same, but a request no route matched has no key (refused with `400` by
/// default instead of its `404`; see [`MissingKey`](super::MissingKey)).
///
/// Combine it with a client key as a tuple, `(ClientIp, MatchedRoute)`, for a limit per
/// client per endpoint.
///
/// See the [module docs](super) for the other extractors.
#[cfg(feature = "axum")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct MatchedRoute;

#[cfg(feature = "axum")]
impl MatchedRoute {
    /// Keys by the matched route.
    pub const fn new() -> Self {
        Self
    }
}

#[cfg(feature = "axum")]
impl<B> KeyExtractor<Request<B>> for MatchedRoute {
    type Key = String;

    fn extract(&self, req: &Request<B>) -> Option<String> {
        req.extensions()
            .get::<axum::extract::MatchedPath>()
            .map(|p| p.as_str().to_owned())
    }

    fn misconfiguration(&self, req: &Request<B>) -> Option<&'static str> {
        let routed = req
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .is_some();
        (!routed).then_some(
            "no matched route: add a `MatchedRoute` layer with `Router::route_layer` or on a \
             route, inside the router, not with `Router::layer`",
        )
    }
}

/// Keys requests by their HTTP method, e.g. a tighter limit on `POST` than on `GET` when
/// combined with another key.
///
/// The key is the [`Method`]; it is never `None`.
///
/// See the [module docs](super) for the other extractors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct MethodKey;

impl MethodKey {
    /// Keys by the request method.
    pub const fn new() -> Self {
        Self
    }
}

impl<B> KeyExtractor<Request<B>> for MethodKey {
    type Key = Method;

    fn extract(&self, req: &Request<B>) -> Option<Method> {
        Some(req.method().clone())
    }
}

/// One key for every request: a single limit shared by all clients (protecting a backend
/// that can take only so much, whoever asks).
///
/// The key is `()`. It works for any request type, not only HTTP.
///
/// See the [module docs](super) for the other extractors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct Global;

impl Global {
    /// One limit for everyone.
    pub const fn new() -> Self {
        Self
    }
}

impl<Req> KeyExtractor<Req> for Global {
    type Key = ();

    fn extract(&self, _req: &Req) -> Option<()> {
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_and_global() {
        let req = Request::post("/x").body(()).unwrap();
        assert_eq!(MethodKey::new().extract(&req), Some(Method::POST));
        assert_eq!(Global::new().extract(&req), Some(()));
        assert_eq!(Global.extract(&42_u32), Some(()));
    }

    #[cfg(feature = "axum")]
    #[tokio::test]
    async fn matched_route_inside_the_router() {
        use std::sync::{Arc, Mutex};

        use axum::{routing::get, Router};
        use tower::ServiceExt as _;

        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let app = Router::new()
            .route("/users/{id}", get(|| async { "ok" }))
            .route_layer(axum::middleware::from_fn(
                move |req: axum::extract::Request, next: axum::middleware::Next| {
                    record.lock().unwrap().push(MatchedRoute.extract(&req));
                    next.run(req)
                },
            ));
        let req = Request::get("/users/17")
            .body(axum::body::Body::empty())
            .unwrap();
        app.oneshot(req).await.unwrap();
        assert_eq!(*seen.lock().unwrap(), [Some("/users/{id}".to_owned())]);
        let plain = Request::get("/").body(()).unwrap();
        assert_eq!(MatchedRoute::new().extract(&plain), None);
    }
}
