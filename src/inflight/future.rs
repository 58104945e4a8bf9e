//! The in-flight layer's response future: the one state machine of [`crate::future`],
//! deciding later when a request waits for its slot (in a queue, or for a network store),
//! and what an answer becomes (the inner response with the fields added and the slot held
//! by its body, or the layer's own refusal).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::time::Instant;

use super::answer::{late, settle, InFlightReplies, Slot};
use super::body::InFlightBody;
use super::store::{Acquired, Acquiring};
use crate::core::finish::Finish;
use crate::core::machine::{Decide, Next};
use crate::options::OnStoreError;
use crate::response::OwnAnswer;

/// A request waiting for its slot (in a queue, or for a network store).
// Public only as a parameter of the unnameable response future; never seen by users.
#[allow(missing_debug_implementations)]
pub struct Waiting {
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
