//! [`Upstream`]: the service an [`UpstreamLayer`](super::UpstreamLayer) makes, and its
//! [`ResponseFuture`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::pacer::{Learn, Pace, Pacer};
use crate::core::{Core, Machine};
use crate::error::BoxError;
use crate::key::{Host, KeyBytes, KeyExtractor};
use crate::store::{MemoryStore, Store};

/// The upstream limit's service: an outbound client `S` whose calls wait for their
/// partition's slot and whose responses teach the limit what the upstream allows. A call
/// given no slot within the layer's `max_wait` is not sent: its error is a
/// [`RateLimited`](crate::generic::RateLimited) with the time to wait. Every clone shares
/// the layer's state.
///
/// See the [module docs](super).
pub struct Upstream<S, X = Host, St = MemoryStore<Option<String>>> {
    inner: S,
    core: Arc<Core<X, Pacer<St>>>,
}

impl<S, X, St> Upstream<S, X, St> {
    pub(crate) fn new(inner: S, core: &Arc<Core<X, Pacer<St>>>) -> Self {
        Upstream {
            inner,
            core: Arc::clone(core),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, without the limit.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, X, St> Clone for Upstream<S, X, St> {
    fn clone(&self) -> Self {
        Upstream::new(self.inner.clone(), &self.core)
    }
}

impl<S: fmt::Debug, X, St> fmt::Debug for Upstream<S, X, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("inner", &self.inner)
            .field("label", &self.core.common.label)
            .finish_non_exhaustive()
    }
}

impl<S, X, St, B, ResBody> Service<Request<B>> for Upstream<S, X, St>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
    X: KeyExtractor<Request<B>> + Send + Sync + 'static,
    X::Key: KeyBytes + Clone + Send + Sync + 'static,
    St: Store<Option<X::Key>>,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = ResponseFuture<S, B>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.core
            .call(&mut self.inner, req, |machine| ResponseFuture { machine })
    }
}

pin_project! {
    /// The response future of [`Upstream`]: the upstream's response (read for what it
    /// says of its limits), or a [`RateLimited`](crate::generic::RateLimited) error for a
    /// call not sent.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        machine: Machine<S, Request<B>, S::Future, BoxError, Learn, Pace>,
    }
}

impl<S: Service<Request<B>>, B> fmt::Debug for ResponseFuture<S, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ResponseFuture")
            .field(&self.machine)
            .finish()
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<ResBody>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().machine.poll_machine(
            cx,
            |result, learn| {
                let response = result.map_err(Into::into)?;
                if let Some(learn) = learn {
                    learn.hear(response.status(), response.headers());
                }
                Ok(response)
            },
            Err,
        )
    }
}
