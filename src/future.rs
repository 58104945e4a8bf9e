//! The response futures: one state machine shared by the HTTP and the generic middleware.
//!
//! States: `Refused` (the answer is known), `Calling` (the inner service runs), and, boxed
//! so the common path stays small, `Slow`: a network store deciding, a queued request
//! sleeping until its slot, or the inner service being made ready again after either. A
//! waiting future that is dropped gives its slot back.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{ready, Context, Poll},
    time::Duration,
};

use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use crate::{decision::Decision, error::StoreError, store::CheckFuture};

/// Gives a queued request's slot back if it is dropped before its turn.
pub(crate) struct RefundGuard(Option<Box<dyn FnOnce() + Send>>);

impl RefundGuard {
    pub(crate) fn new(refund: impl FnOnce() + Send + 'static) -> Self {
        RefundGuard(Some(Box::new(refund)))
    }

    fn disarm(&mut self) {
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

/// What to do once the decision is known.
pub(crate) enum Next<O, H> {
    /// Answer without calling the inner service.
    Refuse(O),
    /// Call the inner service, after `wait`, adding `extra` to its response.
    Proceed {
        wait: Duration,
        extra: H,
        refund: Option<RefundGuard>,
    },
}

/// Turns a store's answer into the next step (built on the slow path only).
pub(crate) type Continuation<Req, O, H> =
    Box<dyn FnOnce(Result<Decision, StoreError>, &mut Req) -> Next<O, H> + Send>;

/// What the machine yields: the inner result with its extra, or an early answer.
pub(crate) enum Finished<R, E, O, H> {
    Inner(Result<R, E>, Option<H>),
    Early(O),
}

pin_project! {
    /// The state machine; wrapped by the public futures.
    #[project = MachineProj]
    pub(crate) enum Machine<S, Req, F, O, H> {
        Refused { out: Option<O> },
        Slow { slow: Pin<Box<Slow<S, Req, O, H>>> },
        Calling { #[pin] future: F, extra: Option<H> },
        Done,
    }
}

pin_project! {
    /// The states that need the inner service and the request kept aside.
    #[project = SlowProj]
    pub(crate) enum Slow<S, Req, O, H> {
        Checking {
            check: CheckFuture,
            then: Option<Continuation<Req, O, H>>,
            svc: Option<S>,
            req: Option<Req>,
        },
        Waiting {
            #[pin]
            sleep: Sleep,
            svc: Option<S>,
            req: Option<Req>,
            extra: Option<H>,
            refund: Option<RefundGuard>,
        },
        Ready {
            svc: Option<S>,
            req: Option<Req>,
            extra: Option<H>,
        },
    }
}

/// How the slow states end.
enum SlowDone<F, E, O, H> {
    Call(F, Option<H>),
    Refuse(O),
    Failed(E, Option<H>),
    Gone,
}

impl<S, Req, O, H> Slow<S, Req, O, H>
where
    S: Service<Req>,
{
    fn poll_slow(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<SlowDone<S::Future, S::Error, O, H>> {
        loop {
            match self.as_mut().project() {
                SlowProj::Checking {
                    check,
                    then,
                    svc,
                    req,
                } => {
                    let result = ready!(Pin::new(check).poll(cx));
                    let (Some(then), Some(mut r), Some(s)) = (then.take(), req.take(), svc.take())
                    else {
                        return Poll::Ready(SlowDone::Gone);
                    };
                    match then(result, &mut r) {
                        Next::Refuse(o) => return Poll::Ready(SlowDone::Refuse(o)),
                        Next::Proceed {
                            wait,
                            extra,
                            refund,
                        } if !wait.is_zero() => self.set(Slow::Waiting {
                            sleep: tokio::time::sleep(wait),
                            svc: Some(s),
                            req: Some(r),
                            extra: Some(extra),
                            refund,
                        }),
                        Next::Proceed { extra, .. } => self.set(Slow::Ready {
                            svc: Some(s),
                            req: Some(r),
                            extra: Some(extra),
                        }),
                    }
                }
                SlowProj::Waiting {
                    sleep,
                    svc,
                    req,
                    extra,
                    refund,
                } => {
                    ready!(sleep.poll(cx));
                    // The slot has come: the request is served, nothing to give back.
                    if let Some(mut g) = refund.take() {
                        g.disarm();
                    }
                    let (svc, req, extra) = (svc.take(), req.take(), extra.take());
                    self.set(Slow::Ready { svc, req, extra });
                }
                SlowProj::Ready { svc, req, extra } => {
                    let Some(s) = svc.as_mut() else {
                        return Poll::Ready(SlowDone::Gone);
                    };
                    // Readiness may have lapsed while the request waited: ask again.
                    if let Err(e) = ready!(s.poll_ready(cx)) {
                        return Poll::Ready(SlowDone::Failed(e, extra.take()));
                    }
                    let Some(r) = req.take() else {
                        return Poll::Ready(SlowDone::Gone);
                    };
                    return Poll::Ready(SlowDone::Call(s.call(r), extra.take()));
                }
            }
        }
    }
}

impl<S, Req, O, H> Machine<S, Req, S::Future, O, H>
where
    S: Service<Req>,
{
    pub(crate) fn refused(out: O) -> Self {
        Machine::Refused { out: Some(out) }
    }

    pub(crate) fn calling(future: S::Future, extra: Option<H>) -> Self {
        Machine::Calling { future, extra }
    }

    /// The state for a decided request: refused, called at once, or queued.
    pub(crate) fn from_next(next: Next<O, H>, inner: &mut S, req: Req) -> Self
    where
        S: Clone,
    {
        match next {
            Next::Refuse(out) => Machine::refused(out),
            Next::Proceed { wait, extra, .. } if wait.is_zero() => {
                Machine::calling(inner.call(req), Some(extra))
            }
            Next::Proceed {
                wait,
                extra,
                refund,
            } => Machine::Slow {
                slow: Box::pin(Slow::Waiting {
                    sleep: tokio::time::sleep(wait),
                    svc: Some(take_ready(inner)),
                    req: Some(req),
                    extra: Some(extra),
                    refund,
                }),
            },
        }
    }

    pub(crate) fn checking(
        check: CheckFuture,
        then: Continuation<Req, O, H>,
        svc: S,
        req: Req,
    ) -> Self {
        Machine::Slow {
            slow: Box::pin(Slow::Checking {
                check,
                then: Some(then),
                svc: Some(svc),
                req: Some(req),
            }),
        }
    }

    pub(crate) fn poll_machine(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Finished<S::Response, S::Error, O, H>> {
        loop {
            match self.as_mut().project() {
                MachineProj::Refused { out } => {
                    let out = out.take();
                    self.set(Machine::Done);
                    match out {
                        Some(o) => return Poll::Ready(Finished::Early(o)),
                        None => return Poll::Pending,
                    }
                }
                MachineProj::Slow { slow } => match ready!(slow.as_mut().poll_slow(cx)) {
                    SlowDone::Call(future, extra) => self.set(Machine::Calling { future, extra }),
                    SlowDone::Refuse(o) => {
                        self.set(Machine::Done);
                        return Poll::Ready(Finished::Early(o));
                    }
                    SlowDone::Failed(e, extra) => {
                        self.set(Machine::Done);
                        return Poll::Ready(Finished::Inner(Err(e), extra));
                    }
                    SlowDone::Gone => {
                        self.set(Machine::Done);
                        return Poll::Pending;
                    }
                },
                MachineProj::Calling { future, extra } => {
                    let result = ready!(future.poll(cx));
                    let extra = extra.take();
                    self.set(Machine::Done);
                    return Poll::Ready(Finished::Inner(result, extra));
                }
                // Polled after completion: never resolves again (the Future contract allows
                // any behaviour but a panic is what we promise not to do).
                MachineProj::Done => return Poll::Pending,
            }
        }
    }
}

/// Moves the service that was driven to readiness into the future, leaving a clone.
pub(crate) fn take_ready<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

impl<S, Req, F, O, H> fmt::Debug for Machine<S, Req, F, O, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self {
            Machine::Refused { .. } => "Refused",
            Machine::Slow { slow } => match **slow {
                Slow::Checking { .. } => "Checking",
                Slow::Waiting { .. } => "Waiting",
                Slow::Ready { .. } => "Ready",
            },
            Machine::Calling { .. } => "Calling",
            Machine::Done => "Done",
        };
        f.write_str(state)
    }
}
