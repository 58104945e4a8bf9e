//! [`InFlightLimit`]: the service an [`InFlightLimitLayer`](super::InFlightLimitLayer)
//! makes, and the layer's part of the core: a slot taken for the request's key.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use tokio::time::Instant;
use tower_service::Service;

use super::answer::{settle, InFlightReplies, Slot};
use super::body::InFlightBody;
use super::future::{ResponseFuture, Waiting};
use super::memory::MemoryInFlight;
use super::store::{Attempt, InFlightStore, Limits};
use crate::core::{Begin, Common, Core, Next, Part};
use crate::deadline::DeadlineSources;
use crate::key::{Global, KeyExtractor};
use crate::response::OwnAnswer;
use crate::store::Budget;

/// The in-flight layer's part of the core: its store, its limits and its answers.
#[allow(missing_debug_implementations)]
pub(crate) struct Slots<St> {
    pub(crate) store: St,
    pub(crate) limits: Limits,
    pub(crate) replies: Arc<InFlightReplies>,
    /// Where a request's deadline is read.
    pub(crate) deadlines: DeadlineSources,
}

impl<B, K, St: InFlightStore<K>> Part<Request<B>, K> for Slots<St> {
    type Answer = OwnAnswer;
    type Extra = Slot;
    type Later = Waiting;

    #[inline]
    fn decide<X: Send + Sync + 'static>(
        core: &Arc<Core<X, Self>>,
        key: Option<K>,
        req: &mut Request<B>,
    ) -> Begin<OwnAnswer, Slot, Waiting> {
        let part = &core.part;
        // A request never waits past its deadline: the wait ends there, refused.
        let mut limits = part.limits;
        let deadline = match part.deadlines.left(req) {
            Some(left) if left < limits.max_wait => {
                limits.max_wait = left;
                Some(Instant::now() + left)
            }
            _ => None,
        };
        let on_error = core.common.on_error();
        let budget = req.extensions().get::<Budget>();
        match part.store.acquire(key, &limits, budget) {
            Attempt::Now(acquired) => Begin::Now(Next::at_once(settle(
                acquired,
                &part.replies,
                on_error,
                req,
            ))),
            Attempt::Later(acquiring) => Begin::Later(Waiting {
                acquiring,
                replies: Arc::clone(&part.replies),
                on_error,
                deadline,
            }),
        }
    }

    fn keyless(&self, common: &Common, req: &Request<B>, status: StatusCode) -> OwnAnswer {
        common.keyless_answer(req, status)
    }
}

/// The in-flight limit's service: the inner service `S` behind the limit of the
/// [`InFlightLimitLayer`](super::InFlightLimitLayer) that made it. An admitted request
/// holds its slot until its response body ends (or is dropped); a refusal is a `429` (or
/// a gRPC status) of the layer's own. Every clone shares the layer's counts.
///
/// See the [module docs](super).
pub struct InFlightLimit<S, X = Global, St = MemoryInFlight<()>> {
    inner: S,
    core: Arc<Core<X, Slots<St>>>,
}

impl<S, X, St> InFlightLimit<S, X, St> {
    pub(crate) fn new(inner: S, core: &Arc<Core<X, Slots<St>>>) -> Self {
        InFlightLimit {
            inner,
            core: Arc::clone(core),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, without the limit.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, X, St> Clone for InFlightLimit<S, X, St> {
    fn clone(&self) -> Self {
        InFlightLimit::new(self.inner.clone(), &self.core)
    }
}

impl<S: fmt::Debug, X, St> fmt::Debug for InFlightLimit<S, X, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLimit")
            .field("inner", &self.inner)
            .field("label", &self.core.common.label)
            .finish_non_exhaustive()
    }
}

impl<S, X, St, B, ResBody> Service<Request<B>> for InFlightLimit<S, X, St>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    X: KeyExtractor<Request<B>> + Send + Sync + 'static,
    St: InFlightStore<X::Key>,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<InFlightBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.core
            .call(&mut self.inner, req, |machine| ResponseFuture { machine })
    }
}
