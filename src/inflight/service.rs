//! [`InFlightLimit`]: the service made by [`InFlightLimitLayer`](super::InFlightLimitLayer).

use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::{
    answer::{settle, InFlightReplies},
    body::InFlightBody,
    future::{ResponseFuture, Waiting},
    store::{Attempt, InFlightStore, Limits},
};
use crate::gate::{Common, Decided};
use crate::key::KeyExtractor;

/// What every service of one layer shares.
pub(crate) struct Shared<X, St> {
    pub(crate) common: Common<X>,
    pub(crate) store: St,
    pub(crate) limits: Limits,
    pub(crate) replies: Arc<InFlightReplies>,
}

/// The in-flight limit service. Made by [`InFlightLimitLayer`](super::InFlightLimitLayer);
/// see the [module docs](super).
///
/// It keeps the inner service's error type and answers refusals with a response, so an
/// axum `Router` stays infallible. `poll_ready` only forwards to the inner service; a slot
/// is taken in `call`.
pub struct InFlightLimit<S, X, St> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<Shared<X, St>>,
}

impl<S: Clone, X, St> Clone for InFlightLimit<S, X, St> {
    fn clone(&self) -> Self {
        InFlightLimit {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, X, St> fmt::Debug for InFlightLimit<S, X, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLimit")
            .field("inner", &self.inner)
            .field("max_in_flight", &self.shared.limits.max)
            .finish_non_exhaustive()
    }
}

impl<S, X, St, B, ResBody> Service<Request<B>> for InFlightLimit<S, X, St>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    X: KeyExtractor<Request<B>>,
    St: InFlightStore<X::Key>,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<InFlightBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let s = &*self.shared;
        let on_error = s.common.on_error;
        let machine = s.common.call(&mut self.inner, req, |key, req| {
            match s.store.acquire(key, &s.limits) {
                Attempt::Now(acquired) => Decided::Now(settle(acquired, &s.replies, on_error, req)),
                Attempt::Later(acquiring) => Decided::Later(Waiting {
                    acquiring,
                    replies: Arc::clone(&s.replies),
                    on_error,
                }),
            }
        });
        ResponseFuture { machine }
    }
}
