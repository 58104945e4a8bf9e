//! The HTTP layer's response future: the core's state machine, and what an answer becomes
//! (the inner response with the fields added, or the layer's own refusal).

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::{
    future::Machine,
    response::{RateLimitBody, ResponseHead, ResponseHeaders},
};

type HttpMachine<S, B> = Machine<
    S,
    Request<B>,
    <S as Service<Request<B>>>::Future,
    Box<Response<Bytes>>,
    ResponseHeaders,
>;

pin_project! {
    /// The response future of [`RateLimit`](super::service::RateLimit). No allocation on the in-memory path.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        pub(super) machine: HttpMachine<S, B>,
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

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().machine.poll_machine(
            cx,
            |result, extra| {
                let mut response = result?.map(RateLimitBody::inner);
                if let Some(mut h) = extra {
                    if let Some(pending) = h.extra.as_mut().and_then(|x| x.settle.take()) {
                        pending.settle(&ResponseHead::of(&response));
                    }
                    h.apply(response.headers_mut());
                }
                Ok(response)
            },
            |response| Ok((*response).map(RateLimitBody::full)),
        )
    }
}
