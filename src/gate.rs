//! The response future of the layers that decide before calling and answer a refusal
//! themselves (the in-flight and fair-sharing layers): a refusal ready at once, a decision
//! pending on a store (then the inner service's readiness), or the inner call, whose
//! response gets what the admission carries (fields, a slot held by the body).

use std::{
    future::Future,
    pin::Pin,
    task::{ready, Context, Poll},
};

use bytes::Bytes;
use http::{response::Parts, Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

const POLLED_AFTER_DONE: &str = "tollgate: response future polled after it completed";

/// What an admitted request carries to its response, and the body the layer answers with.
pub(crate) trait Admission: Sized {
    /// The response body: the inner service's, wrapped, or the layer's own.
    type Body<B>;

    /// The response of an admitted request: its fields added, its body wrapped.
    fn respond<B>(self, parts: &mut Parts, body: B) -> Self::Body<B>;

    /// The body of the layer's own answer (a refusal).
    fn own<B>(data: Bytes) -> Self::Body<B>;
}

/// A decision still to come (from a queue or a network store).
pub(crate) trait Decide {
    type Admitted: Admission;

    /// The admission, or the layer's own answer.
    fn poll_decide(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Admitted, Box<Response<Bytes>>>>;
}

pin_project! {
    /// The future. No allocation when the decision is made at once.
    pub(crate) struct GateFuture<S, B, D>
    where
        S: Service<Request<B>>,
        D: Decide,
    {
        #[pin]
        state: State<S, B, S::Future, D>,
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateOwned]
    enum State<S, B, F, D>
    where
        D: Decide,
    {
        Answered { response: Box<Response<Bytes>> },
        Deciding { slow: Box<Slow<S, B, D>> },
        Calling { #[pin] future: F, admitted: D::Admitted },
        Done,
    }
}

/// A request waiting for its decision, then for the inner service to be ready.
struct Slow<S, B, D: Decide> {
    decide: D,
    admitted: Option<D::Admitted>,
    svc: S,
    req: Option<Request<B>>,
}

enum Next<F, A, E> {
    Call(F, A),
    Answer(Box<Response<Bytes>>),
    Failed(E),
}

impl<S, B, D> Slow<S, B, D>
where
    S: Service<Request<B>>,
    D: Decide,
{
    fn poll_slow(&mut self, cx: &mut Context<'_>) -> Poll<Next<S::Future, D::Admitted, S::Error>> {
        if self.admitted.is_none() {
            match ready!(self.decide.poll_decide(cx)) {
                Ok(admitted) => self.admitted = Some(admitted),
                Err(response) => return Poll::Ready(Next::Answer(response)),
            }
        }
        // Readiness may have lapsed while the request waited: ask again. A failure drops
        // the admission (and a slot it holds) with this state.
        if let Err(e) = ready!(self.svc.poll_ready(cx)) {
            return Poll::Ready(Next::Failed(e));
        }
        match (self.req.take(), self.admitted.take()) {
            (Some(req), Some(admitted)) => Poll::Ready(Next::Call(self.svc.call(req), admitted)),
            _ => panic!("{POLLED_AFTER_DONE}"),
        }
    }
}

impl<S, B, D> GateFuture<S, B, D>
where
    S: Service<Request<B>>,
    D: Decide,
{
    /// Answered by the layer.
    pub(crate) fn answered(response: Response<Bytes>) -> Self {
        GateFuture {
            state: State::Answered {
                response: Box::new(response),
            },
        }
    }

    /// Admitted at once: the inner call is made.
    pub(crate) fn calling(future: S::Future, admitted: D::Admitted) -> Self {
        GateFuture {
            state: State::Calling { future, admitted },
        }
    }

    /// Decided later; `svc` is a ready service (see `take_ready`).
    pub(crate) fn deciding(decide: D, svc: S, req: Request<B>) -> Self {
        GateFuture {
            state: State::Deciding {
                slow: Box::new(Slow {
                    decide,
                    admitted: None,
                    svc,
                    req: Some(req),
                }),
            },
        }
    }

    /// The state's name, for `Debug`.
    pub(crate) fn state_name(&self) -> &'static str {
        match &self.state {
            State::Answered { .. } => "Answered",
            State::Deciding { .. } => "Deciding",
            State::Calling { .. } => "Calling",
            State::Done => "Done",
        }
    }
}

impl<S, B, D, ResBody> Future for GateFuture<S, B, D>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    D: Decide,
{
    type Output = Result<Response<<D::Admitted as Admission>::Body<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Answered { .. } => {
                    let StateOwned::Answered { response } = state.project_replace(State::Done)
                    else {
                        unreachable!("the state was Answered")
                    };
                    return Poll::Ready(Ok((*response).map(D::Admitted::own)));
                }
                StateProj::Deciding { slow } => match ready!(slow.poll_slow(cx)) {
                    Next::Call(future, admitted) => state.set(State::Calling { future, admitted }),
                    Next::Answer(response) => {
                        state.set(State::Done);
                        return Poll::Ready(Ok((*response).map(D::Admitted::own)));
                    }
                    Next::Failed(e) => {
                        state.set(State::Done);
                        return Poll::Ready(Err(e));
                    }
                },
                StateProj::Calling { future, .. } => {
                    let result = ready!(future.poll(cx));
                    let StateOwned::Calling { admitted, .. } = state.project_replace(State::Done)
                    else {
                        unreachable!("the state was Calling")
                    };
                    // An error drops the admission here.
                    let (mut parts, body) = result?.into_parts();
                    let body = admitted.respond(&mut parts, body);
                    return Poll::Ready(Ok(Response::from_parts(parts, body)));
                }
                StateProj::Done => panic!("{POLLED_AFTER_DONE}"),
            }
        }
    }
}
