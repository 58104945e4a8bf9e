//! The generic [`RateLimit`] service, its future, and how the generic layer answers.

use std::{
    fmt,
    future::Future,
    hash::Hash,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::StatusCode;
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::{
    cost::Cost,
    error::{Denied, KeyMissing, RateLimited, StoreError},
    future::Machine,
    key::KeyExtractor,
    limiter::{Flavour, Limiter, Prepare, Screen, Settlement, Verdict},
    policy::Policy,
    store::Store,
    BoxError,
};

/// How the generic layer answers: a refusal is an error, an admission carries nothing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plain;

impl Prepare for Plain {
    type Prepared = ();

    fn prepare(&self, _: Option<&str>, _: &Policy) {}
}

impl<Req> Flavour<Req> for Plain {
    type Refusal = BoxError;
    type Extra = ();

    fn refuse(&self, _: &Req, v: &Verdict<'_, ()>) -> BoxError {
        Box::new(RateLimited::new(*v.decision))
    }

    fn admit(&self, _: &mut Req, _: &Verdict<'_, ()>, _: Option<Settlement>) -> Option<()> {
        None
    }

    fn failed(&self, _: &Req, error: StoreError) -> BoxError {
        Box::new(error)
    }

    fn keyless(&self, _: &Req, _: StatusCode) -> BoxError {
        Box::new(KeyMissing)
    }

    fn denied(&self, _: &Req) -> BoxError {
        Box::new(Denied)
    }

    #[inline]
    fn screen(&self, _: &Req) -> Screen {
        Screen::Limit
    }

    #[inline]
    fn settles(&self) -> bool {
        false
    }

    fn route<'r>(&self, _: &'r Req) -> Option<&'r str> {
        None
    }
}

/// The generic rate-limit service. See the [module docs](super).
pub struct RateLimit<S, X, St, C> {
    pub(crate) inner: S,
    pub(crate) limiter: Arc<Limiter<X, St, C, Plain>>,
}

impl<S: Clone, X, St, C> Clone for RateLimit<S, X, St, C> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<S: fmt::Debug, X, St, C> fmt::Debug for RateLimit<S, X, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("generic::RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

type GenericMachine<S, Req> = Machine<S, Req, <S as Service<Req>>::Future, BoxError, ()>;

pin_project! {
    /// The response future of the generic [`RateLimit`].
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        machine: GenericMachine<S, Req>,
    }
}

impl<S: Service<Req>, Req> fmt::Debug for ResponseFuture<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("generic::ResponseFuture")
            .field(&self.machine)
            .finish()
    }
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project()
            .machine
            .poll_machine(cx, |result, _| result.map_err(Into::into), Err)
    }
}

impl<S, X, St, C, Req> Service<Req> for RateLimit<S, X, St, C>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    X: KeyExtractor<Req> + Send + Sync + 'static,
    X::Key: Hash + Clone + Send + Sync + 'static,
    St: Store<Option<X::Key>>,
    C: Cost<Req> + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let begin = self.limiter.begin(&mut req);
        Machine::start(begin, &mut self.inner, req, |machine| ResponseFuture {
            machine,
        })
    }
}
