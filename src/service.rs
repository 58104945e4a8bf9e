//! [`RateLimit`]: the HTTP middleware service made by [`crate::RateLimitLayer`].

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::{
    future::{take_ready, Finished, Machine},
    key::KeyExtractor,
    layer::{missing_key_refusal, Cost, Shared, Start},
    response::{RateLimitBody, ResponseHeaders},
    store::Store,
};

/// The HTTP rate-limit service. Made by [`crate::RateLimitLayer`]; see the
/// [crate docs](crate).
///
/// It keeps the inner service's error type and answers refusals with a response, so an
/// axum `Router` stays infallible. `poll_ready` only forwards to the inner service; the
/// decision is made in `call`.
pub struct RateLimit<S, X, St, C> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<Shared<X, St, C>>,
}

impl<S: Clone, X, St, C> Clone for RateLimit<S, X, St, C> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, X, St, C> fmt::Debug for RateLimit<S, X, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

type HttpMachine<S, B> = Machine<
    S,
    Request<B>,
    <S as Service<Request<B>>>::Future,
    Box<Response<Bytes>>,
    ResponseHeaders,
>;

pin_project! {
    /// The response future of [`RateLimit`]. No allocation on the in-memory path.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        machine: HttpMachine<S, B>,
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ResponseFuture")
            .field(&self.machine)
            .finish()
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<RateLimitBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(match ready!(self.project().machine.poll_machine(cx)) {
            Finished::Inner(Ok(response), extra) => {
                let mut response = response.map(RateLimitBody::inner);
                if let Some(h) = extra {
                    h.apply(response.headers_mut());
                }
                Ok(response)
            }
            Finished::Inner(Err(e), _) => Err(e),
            Finished::Early(response) => Ok((*response).map(RateLimitBody::full)),
        })
    }
}

impl<S, X, St, C, B, ResBody> Service<Request<B>> for RateLimit<S, X, St, C>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    B: Send + 'static,
    ResBody: 'static,
    X: KeyExtractor<Request<B>> + Send + Sync + 'static,
    X::Key: Clone + Send + Sync + 'static,
    St: Store<Option<X::Key>>,
    C: Cost<Request<B>> + Send + Sync + 'static,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let shared = &self.shared;
        let machine = match shared.start(&req) {
            Start::Decided {
                key,
                cost,
                decision,
            } => {
                let next = shared.next(&key, cost, &decision, refuse, allow);
                expose(shared, &mut req, &decision);
                Machine::from_next(next, &mut self.inner, req)
            }
            Start::Pending { key, cost, check } => {
                let then = shared.continuation(key, cost, refuse, allow, expose);
                Machine::checking(check, then, take_ready(&mut self.inner), req)
            }
            Start::Failed(e) => Machine::refused(refuse(shared, Err(e))),
            Start::Unlimited => Machine::calling(self.inner.call(req), None),
            Start::Reject(status) => {
                Machine::refused(Box::new(missing_key_refusal(&shared.responder, status)))
            }
        };
        ResponseFuture { machine }
    }
}

fn expose<X, St, C, B>(shared: &Shared<X, St, C>, req: &mut Request<B>, d: &crate::Decision) {
    if shared.expose {
        req.extensions_mut().insert(*d);
    }
}

fn refuse<X, St, C>(
    shared: &Shared<X, St, C>,
    decision: Result<&crate::Decision, crate::StoreError>,
) -> Box<Response<Bytes>> {
    Box::new(match decision {
        Ok(d) => shared.responder.refusal(d),
        Err(_) => shared.responder.plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "The rate limiter's store is unavailable.",
        ),
    })
}

fn allow<X, St, C>(shared: &Shared<X, St, C>, d: &crate::Decision) -> ResponseHeaders {
    shared.responder.headers(d)
}
