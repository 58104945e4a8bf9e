//! The layers' own answers besides the fields: a quota refusal's head (`429` or a gRPC
//! `RESOURCE_EXHAUSTED`, `Cache-Control`, `Retry-After`) and the problem answers that are
//! not about a quota (no key, a deny list, a failed store).

use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use super::grpc;
use super::values::{problem_body, retry_after_secs, seconds_value};

pub(crate) const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");
pub(crate) const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");

/// A quota refusal before its rate-limit fields: `429` with `body` as a problem body
/// (none: an empty body without a content type), or, given a gRPC `message`,
/// `RESOURCE_EXHAUSTED` with the delay in a `RetryInfo`; either way `Cache-Control:
/// no-store` and `Retry-After` (the wait rounded up) when there is a wait. The header map
/// is sized once for these and the `more` fields the caller adds next (a map of up to six
/// stays below the allocator's small-size caches' limit). Shared by every layer's
/// refusal.
#[inline]
pub(crate) fn quota_refusal(
    body: Option<Bytes>,
    grpc_message: Option<&str>,
    wait: Option<Duration>,
    more: usize,
) -> Response<Bytes> {
    let room = 1 + usize::from(wait.is_some()) + more;
    let mut r = match grpc_message {
        Some(message) => {
            let mut r = grpc::status(grpc::Code::ResourceExhausted, message, wait);
            r.headers_mut().reserve(room);
            r
        }
        None => {
            let problem = body.is_some();
            let mut r = Response::new(body.unwrap_or_default());
            *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            let h = r.headers_mut();
            h.reserve(room + usize::from(problem));
            if problem {
                h.insert(CONTENT_TYPE, PROBLEM_JSON);
            }
            r
        }
    };
    let h = r.headers_mut();
    h.insert(CACHE_CONTROL, NO_STORE);
    if let Some(wait) = wait {
        h.insert(RETRY_AFTER, seconds_value(retry_after_secs(wait)));
    }
    r
}

/// A response of the middleware's own that is not a rate-limit refusal (no key, a deny
/// list, a failed store under fail-closed): a problem body, or for a gRPC call the status
/// of the same meaning.
pub(crate) fn own_answer(grpc: bool, status: StatusCode, detail: &str) -> Response<Bytes> {
    if grpc {
        grpc::status(grpc::Code::of(status), detail, None)
    } else {
        plain(status, detail)
    }
}

/// A response of the middleware's own that is not a rate-limit refusal (no key under
/// `MissingKey::Reject`, a failed store under fail-closed).
pub(crate) fn plain(status: StatusCode, detail: &str) -> Response<Bytes> {
    let title = status.canonical_reason().unwrap_or("Error");
    let typ = (status == StatusCode::SERVICE_UNAVAILABLE)
        .then_some("https://iana.org/assignments/http-problem-types#temporary-reduced-capacity");
    let body = problem_body(status.as_u16(), title, detail, &[], typ);
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    r.headers_mut().insert(CACHE_CONTROL, NO_STORE);
    r
}
