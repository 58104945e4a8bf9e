//! [`RequestHead`]: the parts of an HTTP request a selector or a hook reads.

use http::{Extensions, HeaderMap, Method, Request, Uri};

/// The head of an HTTP request (method, URI, headers, extensions), borrowed, whatever its
/// body type: what policy selectors and decision hooks of the HTTP layer see.
///
/// ```
/// use tollgate::key::RequestHead;
///
/// let req = http::Request::post("/login").header("x-plan", "pro").body(()).unwrap();
/// let head = RequestHead::of(&req);
/// assert_eq!(head.uri().path(), "/login");
/// assert_eq!(head.headers()["x-plan"], "pro");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct RequestHead<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// The head of `req`.
    pub fn of<B>(req: &'a Request<B>) -> Self {
        RequestHead {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }

    /// The method.
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The URI.
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The extensions (what earlier layers inserted: a user, a plan, axum's matched path).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }

    /// The matched axum route (`/users/{id}`) when the layer runs inside the router, else
    /// the path: what refusal events report as the route.
    pub fn route(&self) -> &'a str {
        #[cfg(feature = "axum")]
        if let Some(p) = self.extensions.get::<axum::extract::MatchedPath>() {
            return p.as_str();
        }
        self.uri.path()
    }
}
