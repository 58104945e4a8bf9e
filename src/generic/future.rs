//! [`ResponseFuture`]: the response future of the generic [`RateLimit`](super::RateLimit),
//! a refusal as an error.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_service::Service;

use crate::core::{Check, Machine};
use crate::error::BoxError;

pin_project! {
    /// The response future of the generic [`RateLimit`](super::RateLimit): the inner
    /// service's response, or a [`RateLimited`](super::RateLimited) error. No allocation
    /// when the decision is made at once.
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        pub(crate) machine: Machine<S, Req, S::Future, BoxError, (), Check<Req, BoxError, ()>>,
    }
}

impl<S: Service<Req>, Req> fmt::Debug for ResponseFuture<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ResponseFuture")
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

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project()
            .machine
            .poll_machine(cx, |result, _| result.map_err(Into::into), Err)
    }
}
