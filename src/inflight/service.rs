//! [`InFlightLimit`]: the service made by [`InFlightLimitLayer`](super::InFlightLimitLayer),
//! and its [`ResponseFuture`].

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
};

use bytes::Bytes;
use http::{response::Parts, Request, Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{
    answer::{Answers, Counted},
    body::InFlightBody,
    store::{Acquiring, Attempt, InFlightStore, Limits, Outcome, Permit},
};
use crate::{
    future::take_ready,
    gate::{Admission, Decide, GateFuture},
    key::KeyExtractor,
    observe::KeylessWarning,
    options::{MissingKey, OnStoreError},
    response::{grpc, own_answer},
};

/// What every service of one layer shares.
pub(crate) struct Shared<X, St> {
    pub(crate) key: X,
    pub(crate) store: St,
    pub(crate) limits: Limits,
    pub(crate) missing: MissingKey,
    pub(crate) on_error: OnStoreError,
    pub(crate) answers: Arc<Answers>,
    /// Whether the extractor's misconfiguration was logged already (once per layer).
    pub(crate) warned: KeylessWarning,
}

/// The in-flight limit service. Made by [`InFlightLimitLayer`](super::InFlightLimitLayer);
/// see the [module docs](super).
///
/// It keeps the inner service's error type and answers refusals with a response, so an
/// axum `Router` stays infallible. `poll_ready` only forwards to the inner service; a slot
/// is taken in `call`.
pub struct InFlightLimit<S, X, St> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<Shared<X, St>>,
}

impl<S: Clone, X, St> Clone for InFlightLimit<S, X, St> {
    fn clone(&self) -> Self {
        InFlightLimit {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, X, St> fmt::Debug for InFlightLimit<S, X, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLimit")
            .field("inner", &self.inner)
            .field("max_in_flight", &self.shared.limits.max)
            .finish_non_exhaustive()
    }
}

/// An admitted request: its slot (none when a failed store let it through) and what its
/// response reports.
pub(crate) struct Admitted {
    permit: Option<Permit>,
    fields: Option<(Arc<Answers>, u32)>,
}

impl Admitted {
    fn slot(permit: Permit, remaining: u32, answers: &Arc<Answers>) -> Self {
        Admitted {
            permit: Some(permit),
            fields: Some((Arc::clone(answers), remaining)),
        }
    }

    const UNLIMITED: Admitted = Admitted {
        permit: None,
        fields: None,
    };
}

/// What an outcome means for the request: proceed with its slot, or an early answer.
/// `grpc` says, when asked, whether the request is a gRPC call (read only for a refusal).
fn settle(
    outcome: Outcome,
    answers: &Arc<Answers>,
    on_error: OnStoreError,
    grpc: impl FnOnce() -> bool,
) -> Result<Admitted, Box<Response<Bytes>>> {
    match outcome {
        Outcome::Admitted { permit, remaining } => {
            answers.count(Counted::Admitted);
            Ok(Admitted::slot(permit, remaining, answers))
        }
        Outcome::Full => {
            answers.count(Counted::Refused);
            tracing::info!(target: "tollgate", limiter = %answers.label, "in-flight limit refused a request");
            Err(Box::new(answers.refusal(grpc())))
        }
        Outcome::Failed(_) => failed(answers, on_error, grpc),
    }
}

/// A failed store (which logged the failure): `OnStoreError` decides.
#[cold]
fn failed(
    answers: &Answers,
    on_error: OnStoreError,
    grpc: impl FnOnce() -> bool,
) -> Result<Admitted, Box<Response<Bytes>>> {
    match on_error {
        OnStoreError::FailClosed => {
            answers.count(Counted::FailClosed);
            Err(Box::new(own_answer(
                grpc(),
                StatusCode::SERVICE_UNAVAILABLE,
                "The in-flight limiter's store is unavailable.",
            )))
        }
        _ => {
            answers.count(Counted::FailOpen);
            Ok(Admitted::UNLIMITED)
        }
    }
}

impl Admission for Admitted {
    type Body<B> = InFlightBody<B>;

    fn respond<B>(self, parts: &mut Parts, body: B) -> InFlightBody<B> {
        if let Some((answers, remaining)) = &self.fields {
            answers.apply(&mut parts.headers, *remaining);
        }
        InFlightBody::inner(body, self.permit)
    }

    fn own<B>(data: Bytes) -> InFlightBody<B> {
        InFlightBody::full(data)
    }
}

/// A request waiting for its slot (in a queue, or for a network store).
pub(crate) struct Waiting {
    acquiring: Acquiring,
    answers: Arc<Answers>,
    on_error: OnStoreError,
    grpc: bool,
}

impl Decide for Waiting {
    type Admitted = Admitted;

    fn poll_decide(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Admitted, Box<Response<Bytes>>>> {
        let outcome = ready!(Pin::new(&mut self.acquiring).poll(cx));
        let grpc = self.grpc;
        Poll::Ready(settle(outcome, &self.answers, self.on_error, || grpc))
    }
}

pin_project! {
    /// The response future of [`InFlightLimit`]. No allocation when the decision is made
    /// at once (the in-memory store, a slot free or the queue full).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        inner: GateFuture<S, B, Waiting>,
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ResponseFuture")
            .field(&self.inner.state_name())
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
        self.project().inner.poll(cx)
    }
}

impl<S, X, St> InFlightLimit<S, X, St> {
    /// A request without a key: logged once per layer when the extractor says why, then
    /// `MissingKey` decides.
    #[cold]
    fn keyless<Req>(&self, req: &Req) -> MissingKey
    where
        X: KeyExtractor<Req>,
    {
        let s = &*self.shared;
        s.warned
            .keyless(&s.key, req, &s.answers.label, s.missing, "in-flight limit");
        s.missing
    }
}

impl<S, X, St, B, ResBody> Service<Request<B>> for InFlightLimit<S, X, St>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    X: KeyExtractor<Request<B>>,
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
        let s = &*self.shared;
        let key = match s.key.extract(&req) {
            Some(k) => Some(k),
            None => match self.keyless(&req) {
                MissingKey::Allow => {
                    let future = self.inner.call(req);
                    return ResponseFuture {
                        inner: GateFuture::calling(future, Admitted::UNLIMITED),
                    };
                }
                MissingKey::Reject(status) => {
                    let response = own_answer(
                        grpc::is_grpc(req.headers()),
                        status,
                        "No in-flight limit key could be extracted from this request.",
                    );
                    return ResponseFuture {
                        inner: GateFuture::answered(response),
                    };
                }
                _ => None,
            },
        };
        let inner = match s.store.acquire(key, &s.limits) {
            Attempt::Now(outcome) => match settle(outcome, &s.answers, s.on_error, || {
                grpc::is_grpc(req.headers())
            }) {
                Ok(admitted) => GateFuture::calling(self.inner.call(req), admitted),
                Err(response) => GateFuture::answered(*response),
            },
            Attempt::Later(acquiring) => {
                let waiting = Waiting {
                    acquiring,
                    answers: Arc::clone(&s.answers),
                    on_error: s.on_error,
                    grpc: grpc::is_grpc(req.headers()),
                };
                GateFuture::deciding(waiting, take_ready(&mut self.inner), req)
            }
        };
        ResponseFuture { inner }
    }
}
