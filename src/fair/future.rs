//! The fair-sharing layer's response future: the one state machine of
//! [`crate::future`], deciding later when a network store answers, and what an answer
//! becomes (the inner response with the fields added, or the layer's own refusal).

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{
    answer::{settle, FairReplies, Reported},
    share::{FairDecision, Share},
};
use crate::{
    error::StoreError,
    future::{Decide, Machine, Next},
    gate::OwnAnswer,
    options::OnStoreError,
    response::RateLimitBody,
    store::StoreFuture,
};

/// A decision coming from a network store.
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

type FairMachine<S, B> =
    Machine<S, Request<B>, <S as Service<Request<B>>>::Future, OwnAnswer, Reported, Deciding>;

pin_project! {
    /// The response future of the fair-sharing layer's service. No allocation when the
    /// decision is made at once (the in-memory store).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        pub(super) machine: FairMachine<S, B>,
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("fair::ResponseFuture")
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
            |result, reported| {
                let mut response = result?.map(RateLimitBody::inner);
                if let Some(reported) = reported {
                    reported.apply(response.headers_mut());
                }
                Ok(response)
            },
            |response| Ok((*response).map(RateLimitBody::full)),
        )
    }
}
