//! The HTTP layer's response future: the core's state machine, and what an answer becomes
//! (the inner response with the fields added, or the layer's own refusal).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::response::OwnAnswer;
use crate::response::{RateLimitBody, ResponseHead, ResponseHeaders};

impl<S, B, ResBody> Future for ResponseFuture<S, Request<B>, OwnAnswer, ResponseHeaders>
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
