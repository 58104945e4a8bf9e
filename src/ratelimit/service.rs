//! The HTTP rate-limit service made by [`RateLimitLayer`](super::RateLimitLayer): the
//! shared [`Limited`] service on the HTTP flavour of the limiter.

use std::hash::Hash;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::answer::Http;
use crate::core::machine::{Machine, ResponseFuture};
use crate::core::service::Limited;
use crate::cost::Cost;
use crate::key::KeyExtractor;
use crate::ratelimit::limiter::Limiter;
use crate::response::OwnResponse;
use crate::response::{RateLimitBody, ResponseHeaders};
use crate::store::Store;

/// The HTTP rate-limit service: it keeps the inner service's error type and answers
/// refusals with a response, so an axum `Router` stays infallible.
impl<S, X, St, C, B, ResBody> Service<Request<B>> for Limited<S, Limiter<X, St, C, Http>>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    B: Send + 'static,
    ResBody: 'static,
    X: KeyExtractor<Request<B>> + Send + Sync + 'static,
    X::Key: Hash + Clone + Send + Sync + 'static,
    St: Store<Option<X::Key>>,
    C: Cost<Request<B>> + Send + Sync + 'static,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Request<B>, OwnResponse, ResponseHeaders>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let begin = self.shared.begin(&mut req);
        Machine::start(begin, &mut self.inner, req, |machine| ResponseFuture {
            machine,
        })
    }
}
