//! [`ResponseFuture`]: the in-flight layer's response future, deciding later when a
//! request waits for its slot (in a queue, or for a network store), and what an answer
//! becomes (the inner response with the fields added and the slot held by its body, or
//! the layer's own refusal).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_service::Service;

use super::answer::{late, settle, InFlightReplies, Slot};
use super::body::InFlightBody;
use super::store::{Acquired, Acquiring};
use crate::core::{poll_http, Decide, Finish, Machine, Next};
use crate::options::OnStoreError;
use crate::response::OwnAnswer;

pin_project! {
    /// The response future of [`InFlightLimit`](super::InFlightLimit): the inner service's
    /// response, its body holding the slot, with the fields added; or the layer's refusal.
    /// No allocation when the slot is taken at once.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        pub(crate) machine: Machine<S, Request<B>, S::Future, OwnAnswer, Slot, Waiting>,
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
    type Output = Result<Response<InFlightBody<ResBody>>, S::Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        poll_http(self.project().machine, cx)
    }
}

/// A request waiting for its slot (in a queue, or for a network store).
#[allow(missing_debug_implementations)]
pub(crate) struct Waiting {
    pub(crate) acquiring: Acquiring,
    pub(crate) replies: Arc<InFlightReplies>,
    pub(crate) on_error: OnStoreError,
    /// The request's deadline, when it ends the wait before the layer's longest wait.
    pub(crate) deadline: Option<Instant>,
}

impl<B> Decide<Request<B>, OwnAnswer, Slot> for Waiting {
    type Answer = Acquired;

    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Acquired> {
        Pin::new(&mut self.acquiring).poll(cx)
    }

    fn next(self, acquired: Acquired, req: &mut Request<B>) -> Next<OwnAnswer, Slot> {
        // No slot by the request's deadline: refused for it, counted apart.
        if let (Acquired::Full, Some(deadline)) = (&acquired, self.deadline) {
            if Instant::now() >= deadline {
                return Next::Refuse(late(&self.replies, req));
            }
        }
        Next::at_once(settle(acquired, &self.replies, self.on_error, req))
    }
}

impl Finish for Slot {
    type Body<B> = InFlightBody<B>;

    #[inline]
    fn finish<B>(mut response: Response<B>, slot: Option<Self>) -> Response<InFlightBody<B>> {
        let permit = slot.map(|slot| slot.apply(response.headers_mut()));
        response.map(|body| InFlightBody::inner(body, permit))
    }
}
