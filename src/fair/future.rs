//! [`ResponseFuture`]: the fair-sharing layer's response future, deciding later when a
//! network store answers, and what an answer becomes (the inner response with the fields
//! added, or the layer's own refusal).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::answer::{settle, FairReplies, Reported};
use super::share::{FairDecision, Share};
use crate::core::{poll_http, Decide, Finish, Machine, Next};
use crate::error::StoreError;
use crate::options::OnStoreError;
use crate::response::OwnAnswer;
use crate::response::RateLimitBody;
use crate::store::StoreFuture;

pin_project! {
    /// The response future of [`FairLimit`](super::FairLimit): the inner service's
    /// response with the fields added, or the layer's refusal. No allocation when the
    /// store decides at once.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        pub(crate) machine: Machine<S, Request<B>, S::Future, OwnAnswer, Reported, Deciding>,
    }
}

impl<S: Service<Request<B>>, B> std::fmt::Debug for ResponseFuture<S, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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

/// A decision coming from a network store.
#[allow(missing_debug_implementations)]
pub(crate) struct Deciding {
    pub(crate) deciding: StoreFuture<FairDecision>,
    pub(crate) replies: Arc<FairReplies>,
    pub(crate) share: Share,
    pub(crate) on_error: OnStoreError,
}

impl<B> Decide<Request<B>, OwnAnswer, Reported> for Deciding {
    type Answer = Result<FairDecision, StoreError>;

    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Self::Answer> {
        Pin::new(&mut self.deciding).poll(cx)
    }

    fn next(self, answer: Self::Answer, req: &mut Request<B>) -> Next<OwnAnswer, Reported> {
        Next::at_once(settle(
            answer,
            &self.replies,
            self.share,
            self.on_error,
            req,
        ))
    }
}

impl Finish for Reported {
    type Body<B> = RateLimitBody<B>;

    #[inline]
    fn finish<B>(response: Response<B>, reported: Option<Self>) -> Response<RateLimitBody<B>> {
        let mut response = response.map(RateLimitBody::inner);
        if let Some(reported) = reported {
            reported.apply(response.headers_mut());
        }
        response
    }
}
