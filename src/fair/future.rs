//! The fair-sharing layer's response future: the one state machine of
//! [`crate::future`], deciding later when a network store answers, and what an answer
//! becomes (the inner response with the fields added, or the layer's own refusal).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};

use super::answer::{settle, FairReplies, Reported};
use super::share::{FairDecision, Share};
use crate::core::finish::Finish;
use crate::core::machine::{Decide, Next};
use crate::error::StoreError;
use crate::options::OnStoreError;
use crate::response::OwnAnswer;
use crate::response::RateLimitBody;
use crate::store::StoreFuture;

/// A decision coming from a network store.
// Public only as a parameter of the unnameable response future; never seen by users.
#[allow(missing_debug_implementations)]
pub struct Deciding {
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
