//! The response futures: one state machine every layer's future wraps (the HTTP and the
//! generic rate limits, the in-flight and the fair-sharing limits).
//!
//! States: `Refused` (the answer is known), `Calling` (the inner service runs), and, boxed
//! so the common path stays small, `Slow`: a decision to come (a [`Decide`]: a network
//! store's answer, or an in-flight slot a queued request waits for), a queued request
//! sleeping until its turn, or the inner service being made ready again after either.
//! The core makes it from a layer's [`Begin`] ([`Machine::start`]); a layer's response
//! future reads its end through [`Machine::poll_machine`].
//! Every transition moves the state's values out (`project_replace`), so no state holds
//! half of its data; a future polled after it completed, or after a panic in the inner
//! service interrupted a transition, panics with a message instead of hanging.
//!
//! A request a rate limit queues is charged when the store admits it. If its future is
//! dropped before the inner service is called with it (a timeout, a client gone), every
//! unit goes back to every limit. When its slot comes it yields once before calling the
//! inner service, so a timeout due at the same instant (`tower::timeout` polls the inner
//! future first, then its timer) wins the tie: the request is dropped unserved and its
//! units go back.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use crate::{decision::Decision, error::StoreError, store::CheckFuture};

const POLLED_AFTER_DONE: &str =
    "tollgate: response future polled after it completed (or after the inner service panicked)";

/// Gives a queued request's units back if it is dropped before the inner service has it.
pub(crate) struct RefundGuard(Option<Box<dyn FnOnce() + Send>>);

impl RefundGuard {
    pub(crate) fn new(refund: impl FnOnce() + Send + 'static) -> Self {
        RefundGuard(Some(Box::new(refund)))
    }

    /// The request reached the inner service (or a job its turn): its units stay
    /// charged.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for RefundGuard {
    fn drop(&mut self) {
        if let Some(refund) = self.0.take() {
            refund();
        }
    }
}

/// How a request starts, as its layer decided it.
pub(crate) enum Begin<O, H, D> {
    /// Decided: refuse, or proceed (perhaps after a wait).
    Now(Next<O, H>),
    /// Decided later (a [`Decide`]: a network store's answer, a slot to wait for).
    Later(D),
    /// No limit applies (exempt, or a keyless request under `MissingKey::Allow`).
    Unlimited,
}

/// What to do once the decision is known.
pub(crate) enum Next<O, H> {
    /// Answer without calling the inner service.
    Refuse(O),
    /// Call the inner service, after `wait`, adding `extra` to its response.
    Proceed {
        wait: Duration,
        extra: Option<H>,
        refund: Option<RefundGuard>,
    },
}

impl<O, H> Next<O, H> {
    /// A decision without a wait (see [`Machine::now`]): call the inner service now,
    /// adding `extra` to its response (`Ok`), or answer (`Err`).
    pub(crate) fn at_once(decided: Result<Option<H>, O>) -> Self {
        match decided {
            Ok(extra) => Next::Proceed {
                wait: Duration::ZERO,
                extra,
                refund: None,
            },
            Err(out) => Next::Refuse(out),
        }
    }
}

/// Turns a store's answer into the next step (built on the slow path only).
pub(crate) type Continuation<Req, O, H> =
    Box<dyn FnOnce(Result<Decision, StoreError>, &mut Req) -> Next<O, H> + Send>;

/// A decision to come, which the machine polls in its boxed slow state: a network store's
/// answer, or a slot a queued request waits for.
pub(crate) trait Decide<Req, O, H> {
    /// What the store answers.
    type Answer;

    /// Polls for the store's answer.
    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Self::Answer>;

    /// What the answer means for the request.
    fn next(self, answer: Self::Answer, req: &mut Req) -> Next<O, H>;
}

/// The rate limits' decision to come: the store's check, and what its answer means.
#[allow(missing_debug_implementations)]
pub(crate) struct Check<Req, O, H> {
    pub(crate) check: CheckFuture,
    pub(crate) then: Continuation<Req, O, H>,
}

impl<Req, O, H> Decide<Req, O, H> for Check<Req, O, H> {
    type Answer = Result<Decision, StoreError>;

    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Self::Answer> {
        Pin::new(&mut self.check).poll(cx)
    }

    fn next(self, answer: Self::Answer, req: &mut Req) -> Next<O, H> {
        (self.then)(answer, req)
    }
}

pin_project! {
    /// The state machine; wrapped by every layer's response future. `O` is an answer
    /// given without calling the inner service, `H` what an admitted request adds to its
    /// response, `D` the decision to come (the rate limits' store check by default).
    #[project = MachineProj]
    #[project_replace = MachineOwned]
    pub(crate) enum Machine<S, Req, F, O, H, D = Check<Req, O, H>> {
        Refused { out: O },
        Slow { slow: Pin<Box<Slow<S, Req, H, D>>> },
        Calling { #[pin] future: F, extra: Option<H> },
        Done,
    }
}

pin_project! {
    /// The states that need the inner service and the request kept aside.
    #[project = SlowProj]
    #[project_replace = SlowOwned]
    pub(crate) enum Slow<S, Req, H, D> {
        Deciding {
            decide: D,
            svc: S,
            req: Req,
        },
        Waiting {
            #[pin]
            sleep: Sleep,
            svc: S,
            req: Req,
            extra: Option<H>,
            refund: Option<RefundGuard>,
        },
        Ready {
            svc: S,
            req: Req,
            extra: Option<H>,
            refund: Option<RefundGuard>,
        },
        // Between two states, while their values move.
        Moving,
    }
}

/// How the slow states end.
enum SlowDone<F, E, O, H> {
    Call(F, Option<H>),
    Refuse(O),
    Failed(E, Option<H>),
}

impl<S, Req, H, D> Slow<S, Req, H, D>
where
    S: Service<Req>,
{
    fn poll_slow<O>(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<SlowDone<S::Future, S::Error, O, H>>
    where
        D: Decide<Req, O, H>,
    {
        loop {
            match self.as_mut().project() {
                SlowProj::Deciding { decide, .. } => {
                    let answer = ready!(decide.poll_answer(cx));
                    let SlowOwned::Deciding {
                        decide,
                        svc,
                        mut req,
                    } = self.as_mut().project_replace(Slow::Moving)
                    else {
                        unreachable!("the state was Deciding")
                    };
                    match decide.next(answer, &mut req) {
                        Next::Refuse(o) => return Poll::Ready(SlowDone::Refuse(o)),
                        Next::Proceed {
                            wait,
                            extra,
                            refund,
                        } if !wait.is_zero() => self.set(Slow::Waiting {
                            sleep: tokio::time::sleep(wait),
                            svc,
                            req,
                            extra,
                            refund,
                        }),
                        Next::Proceed { extra, refund, .. } => self.set(Slow::Ready {
                            svc,
                            req,
                            extra,
                            refund,
                        }),
                    }
                }
                SlowProj::Waiting { sleep, .. } => {
                    ready!(sleep.poll(cx));
                    let SlowOwned::Waiting {
                        svc,
                        req,
                        extra,
                        refund,
                        ..
                    } = self.as_mut().project_replace(Slow::Moving)
                    else {
                        unreachable!("the state was Waiting")
                    };
                    self.set(Slow::Ready {
                        svc,
                        req,
                        extra,
                        refund,
                    });
                    // The slot has come: yield once, so that a timeout due at this same
                    // instant drops the request before it is served (see the module docs).
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                SlowProj::Ready { svc, .. } => {
                    // Readiness may have lapsed while the request waited: ask again.
                    let ready = ready!(svc.poll_ready(cx));
                    let SlowOwned::Ready {
                        mut svc,
                        req,
                        extra,
                        refund,
                    } = self.as_mut().project_replace(Slow::Moving)
                    else {
                        unreachable!("the state was Ready")
                    };
                    // A failed readiness drops the refund guard armed: the units go back.
                    if let Err(e) = ready {
                        return Poll::Ready(SlowDone::Failed(e, extra));
                    }
                    if let Some(refund) = refund {
                        refund.disarm();
                    }
                    return Poll::Ready(SlowDone::Call(svc.call(req), extra));
                }
                SlowProj::Moving => panic!("{POLLED_AFTER_DONE}"),
            }
        }
    }
}

impl<S, Req, O, H, D> Machine<S, Req, S::Future, O, H, D>
where
    S: Service<Req>,
{
    /// The layer's response future for `begin`, `wrap` making it from the state: refused,
    /// called at once, queued, or waiting for a decision. Inlined into the service's
    /// `call`; each branch builds the future itself, so that a request called at once has
    /// its inner future written once, into the caller's future, not into a state first
    /// and then moved.
    #[inline(always)]
    pub(crate) fn start<T>(
        begin: Begin<O, H, D>,
        inner: &mut S,
        req: Req,
        wrap: impl FnOnce(Self) -> T,
    ) -> T
    where
        S: Clone,
    {
        match begin {
            // A zero wait has no refund to arm (only a queued request can be dropped
            // before its turn); matching it as `None` spares the guard's drop.
            Begin::Now(Next::Proceed {
                wait,
                extra,
                refund: None,
            }) if wait.is_zero() => wrap(Machine::Calling {
                future: inner.call(req),
                extra,
            }),
            Begin::Unlimited => wrap(Machine::Calling {
                future: inner.call(req),
                extra: None,
            }),
            Begin::Now(next) => wrap(Self::from_next(next, inner, req)),
            Begin::Later(decide) => wrap(Self::later(decide, take_ready(inner), req)),
        }
    }

    /// The state for a request decided otherwise than called at once (`start` takes
    /// those): refused, or queued (its state built out of line).
    #[inline(always)]
    fn from_next(next: Next<O, H>, inner: &mut S, req: Req) -> Self
    where
        S: Clone,
    {
        match next {
            Next::Refuse(out) => Machine::Refused { out },
            Next::Proceed {
                wait,
                extra,
                refund,
            } => Self::queued(wait, extra, refund, take_ready(inner), req),
        }
    }

    #[inline(never)]
    fn queued(
        wait: Duration,
        extra: Option<H>,
        refund: Option<RefundGuard>,
        svc: S,
        req: Req,
    ) -> Self {
        Machine::Slow {
            slow: Box::pin(Slow::Waiting {
                sleep: tokio::time::sleep(wait),
                svc,
                req,
                extra,
                refund,
            }),
        }
    }

    /// The state for a decision to come; `svc` is a ready service (see [`take_ready`]).
    pub(crate) fn later(decide: D, svc: S, req: Req) -> Self {
        Machine::Slow {
            slow: Box::pin(Slow::Deciding { decide, svc, req }),
        }
    }

    /// Polls to the end: `inner` makes the output from the inner service's result and
    /// the extra, `early` from an answer given without calling it. Taking the two as
    /// closures lets an admitted response move once, from the inner future into the
    /// caller's output, instead of through an intermediate enum.
    #[inline]
    pub(crate) fn poll_machine<T>(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        inner: impl FnOnce(Result<S::Response, S::Error>, Option<H>) -> T,
        early: impl FnOnce(O) -> T,
    ) -> Poll<T>
    where
        D: Decide<Req, O, H>,
    {
        loop {
            match self.as_mut().project() {
                MachineProj::Calling { future, extra } => {
                    let result = ready!(future.poll(cx));
                    let extra = extra.take();
                    self.set(Machine::Done);
                    return Poll::Ready(inner(result, extra));
                }
                MachineProj::Refused { .. } => {
                    let MachineOwned::Refused { out } = self.project_replace(Machine::Done) else {
                        unreachable!("the state was Refused")
                    };
                    return Poll::Ready(early(out));
                }
                MachineProj::Slow { slow } => match ready!(slow.as_mut().poll_slow(cx)) {
                    SlowDone::Call(future, extra) => self.set(Machine::Calling { future, extra }),
                    SlowDone::Refuse(o) => {
                        self.set(Machine::Done);
                        return Poll::Ready(early(o));
                    }
                    SlowDone::Failed(e, extra) => {
                        self.set(Machine::Done);
                        return Poll::Ready(inner(Err(e), extra));
                    }
                },
                MachineProj::Done => panic!("{POLLED_AFTER_DONE}"),
            }
        }
    }
}

/// Moves the service that was driven to readiness into the future, leaving a clone.
pub(crate) fn take_ready<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

impl<S, Req, F, O, H, D> fmt::Debug for Machine<S, Req, F, O, H, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self {
            Machine::Refused { .. } => "Refused",
            Machine::Slow { slow } => match **slow {
                Slow::Deciding { .. } => "Deciding",
                Slow::Waiting { .. } => "Waiting",
                Slow::Ready { .. } => "Ready",
                Slow::Moving => "Moving",
            },
            Machine::Calling { .. } => "Calling",
            Machine::Done => "Done",
        };
        f.write_str(state)
    }
}
