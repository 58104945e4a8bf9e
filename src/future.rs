//! The response futures: one state machine shared by the HTTP and the generic middleware.
//!
//! States: `Refused` (the answer is known), `Checking` (a network store is deciding; the
//! only boxed path), `Waiting` (a queued request sleeps until its slot), `Calling` (the
//! inner service runs). A `Waiting` future that is dropped gives its slot back.

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
        Calling { #[pin] future: F, extra: Option<H> },
        Done,
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

    pub(crate) fn waiting(
        svc: S,
        req: Req,
        wait: Duration,
        extra: H,
        refund: Option<RefundGuard>,
    ) -> Self {
        Machine::Waiting {
            sleep: tokio::time::sleep(wait),
            svc: Some(svc),
            req: Some(req),
            extra: Some(extra),
            refund,
        }
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
            } => Machine::waiting(take_ready(inner), req, wait, extra, refund),
        }
    }

    pub(crate) fn checking(
        check: CheckFuture,
        then: Continuation<Req, O, H>,
        svc: S,
        req: Req,
    ) -> Self {
        Machine::Checking {
            check,
            then: Some(then),
            svc: Some(svc),
            req: Some(req),
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
                MachineProj::Checking {
                    check,
                    then,
                    svc,
                    req,
                } => {
                    let result = ready!(Pin::new(check).poll(cx));
                    let (Some(then), Some(mut r), Some(s)) = (then.take(), req.take(), svc.take())
                    else {
                        self.set(Machine::Done);
                        return Poll::Pending;
                    };
                    match then(result, &mut r) {
                        Next::Refuse(o) => self.set(Machine::Refused { out: Some(o) }),
                        Next::Proceed {
                            wait,
                            extra,
                            refund,
                        } if !wait.is_zero() => {
                            self.set(Machine::waiting(s, r, wait, extra, refund))
                        }
                        Next::Proceed { extra, .. } => self.set(Machine::Ready {
                            svc: Some(s),
                            req: Some(r),
                            extra: Some(extra),
                        }),
                    }
                }
                MachineProj::Waiting {
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
                    self.set(Machine::Ready { svc, req, extra });
                }
                MachineProj::Ready { svc, req, extra } => {
                    let Some(s) = svc.as_mut() else {
                        self.set(Machine::Done);
                        return Poll::Pending;
                    };
                    // Readiness may have lapsed while the request waited: ask again.
                    if let Err(e) = ready!(s.poll_ready(cx)) {
                        let extra = extra.take();
                        self.set(Machine::Done);
                        return Poll::Ready(Finished::Inner(Err(e), extra));
                    }
                    let (Some(r), extra) = (req.take(), extra.take()) else {
                        self.set(Machine::Done);
                        return Poll::Pending;
                    };
                    let future = s.call(r);
                    self.set(Machine::Calling { future, extra });
                }
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
            Machine::Checking { .. } => "Checking",
            Machine::Waiting { .. } => "Waiting",
            Machine::Ready { .. } => "Ready",
            Machine::Calling { .. } => "Calling",
            Machine::Done => "Done",
        };
        f.write_str(state)
    }
}
