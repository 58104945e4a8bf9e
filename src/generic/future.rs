//! The generic layer's response future: the core's state machine, with a refusal as an
//! error.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower_service::Service;

use crate::{core::machine::ResponseFuture, error::BoxError};

impl<S, Req> Future for ResponseFuture<S, Req, BoxError, ()>
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
