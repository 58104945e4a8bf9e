//! The generic layer's response future: the core's state machine, with a refusal as an
//! error.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use pin_project_lite::pin_project;
use tower_service::Service;

use crate::{error::BoxError, future::Machine};

type GenericMachine<S, Req> = Machine<S, Req, <S as Service<Req>>::Future, BoxError, ()>;

pin_project! {
    /// The response future of the generic [`RateLimit`](super::service::RateLimit).
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        pub(super) machine: GenericMachine<S, Req>,
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

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project()
            .machine
            .poll_machine(cx, |result, _| result.map_err(Into::into), Err)
    }
}
