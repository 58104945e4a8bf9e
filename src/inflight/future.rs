//! The in-flight layer's response future: the one state machine of [`crate::future`],
//! deciding later when a request waits for its slot (in a queue, or for a network store),
//! and what an answer becomes (the inner response with the fields added and the slot held
//! by its body, or the layer's own refusal).

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
    answer::{settle, InFlightReplies, Slot},
    body::InFlightBody,
    store::{Acquired, Acquiring},
};
use crate::gate::OwnAnswer;
use crate::{
    future::{Decide, Machine, Next},
    options::OnStoreError,
};

/// A request waiting for its slot (in a queue, or for a network store).
pub(crate) struct Waiting {
    pub(crate) acquiring: Acquiring,
    pub(crate) replies: Arc<InFlightReplies>,
    pub(crate) on_error: OnStoreError,
}

impl<B> Decide<Request<B>, OwnAnswer, Slot> for Waiting {
    type Answer = Acquired;

    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Acquired> {
        Pin::new(&mut self.acquiring).poll(cx)
    }

    fn next(self, acquired: Acquired, req: &mut Request<B>) -> Next<OwnAnswer, Slot> {
        Next::at_once(settle(acquired, &self.replies, self.on_error, req))
    }
}

type InFlightMachine<S, B> =
    Machine<S, Request<B>, <S as Service<Request<B>>>::Future, OwnAnswer, Slot, Waiting>;

pin_project! {
    /// The response future of the in-flight layer's service. No allocation when
    /// the decision is made at once (the in-memory store, a slot free or the queue full).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        pub(super) machine: InFlightMachine<S, B>,
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("inflight::ResponseFuture")
            .field(&self.machine)
            .finish()
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<InFlightBody<ResBody>>, S::Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().machine.poll_machine(
            cx,
            |result, slot| {
                // An error drops the slot here.
                let mut response = result?;
                let permit = slot.map(|slot| slot.apply(response.headers_mut()));
                Ok(response.map(|body| InFlightBody::inner(body, permit)))
            },
            |response| Ok((*response).map(InFlightBody::full)),
        )
    }
}
