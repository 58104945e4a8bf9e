//! [`ResponseHead`]: the parts of an HTTP response a settlement rule reads.

use http::{Extensions, HeaderMap, Response, StatusCode};

/// The head of an HTTP response (status, headers, extensions), borrowed, whatever its
/// body type: what [`Builder::count_when`](crate::ratelimit::Builder::count_when) and
/// [`Builder::settle_cost`](crate::ratelimit::Builder::settle_cost) see.
///
/// ```
/// use tollgate::response::ResponseHead;
///
/// let res = http::Response::builder().status(401).header("x-rows", "7").body(()).unwrap();
/// let head = ResponseHead::of(&res);
/// assert_eq!(head.status(), 401);
/// assert_eq!(head.header_u64("x-rows"), Some(7));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ResponseHead<'a> {
    status: StatusCode,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> ResponseHead<'a> {
    /// The head of `res`.
    pub fn of<B>(res: &'a Response<B>) -> Self {
        ResponseHead {
            status: res.status(),
            headers: res.headers(),
            extensions: res.extensions(),
        }
    }

    /// The status code.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The extensions (what the handler or an inner layer inserted).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }

    /// A header's value as a whole number (`Content-Length`, a row count, tokens used);
    /// `None` when it is absent or malformed.
    pub fn header_u64(&self, name: &str) -> Option<u64> {
        self.headers.get(name)?.to_str().ok()?.trim().parse().ok()
    }
}
