//! [`ResponseFuture`]: the response future of [`RateLimit`](super::RateLimit), and what
//! its answer makes of the inner service's response: the fields added, and a cost settled
//! from the response when the layer counts that way.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::core::{poll_http, Check, Finish, Machine};
use crate::response::{OwnResponse, RateLimitBody, ResponseHead, ResponseHeaders};

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): the inner service's
    /// response with the rate-limit fields added, or the layer's refusal. No allocation
    /// when the decision is made at once.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        pub(crate) machine: Machine<
            S,
            Request<B>,
            S::Future,
            OwnResponse,
            ResponseHeaders,
            Check<Request<B>, OwnResponse, ResponseHeaders>,
        >,
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
    ResBody: Body<Data = Bytes>,
{
    type Output = Result<Response<RateLimitBody<ResBody>>, S::Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        poll_http(self.project().machine, cx)
    }
}

impl Finish for ResponseHeaders {
    type Body<B> = RateLimitBody<B>;

    #[inline]
    fn finish<B>(response: Response<B>, extra: Option<Self>) -> Response<RateLimitBody<B>> {
        let mut response = response.map(RateLimitBody::inner);
        if let Some(mut h) = extra {
            if let Some(pending) = h.extra.as_mut().and_then(|x| x.settle.take()) {
                pending.settle(&ResponseHead::of(&response));
            }
            h.apply(response.headers_mut());
        }
        response
    }
}
