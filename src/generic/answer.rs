//! How the generic layer answers (its flavour of the core): a refusal is a typed error, an
//! admission carries nothing.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use crate::deadline::Deadline;
use crate::error::{BoxError, RateLimited, StoreError};
use crate::policy::Policy;
use crate::ratelimit::limiter::{Flavour, Prepare, Settlement, Verdict};

/// How the generic layer answers: a refusal is an error, an admission carries nothing.
/// Reads a request's deadline with the function its builder was given, if any.
#[derive(Clone, Default)]
pub struct Generic {
    /// A [`RequestDeadline`] of the layer's request type, its type erased.
    pub(crate) deadline: Option<Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Generic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generic")
            .field("deadline", &self.deadline.is_some())
            .finish()
    }
}

/// The generic layer's reader of a request's deadline.
pub(crate) type RequestDeadline<Req> = Box<dyn Fn(&Req) -> Option<Deadline> + Send + Sync>;

impl Prepare for Generic {
    type Prepared = ();

    fn prepare(&self, _: Option<&str>, _: &Policy) {}
}

impl<Req: 'static> Flavour<Req> for Generic {
    type Refusal = BoxError;
    type Extra = ();

    fn refuse(&self, _: &Req, v: &Verdict<'_, ()>) -> BoxError {
        Box::new(RateLimited::new(*v.decision))
    }

    fn late(&self, _: &Req, v: &Verdict<'_, ()>) -> BoxError {
        Box::new(RateLimited::late(*v.decision))
    }

    fn time_left(&self, req: &Req) -> Option<Duration> {
        let read = self
            .deadline
            .as_ref()?
            .downcast_ref::<RequestDeadline<Req>>()?;
        read(req).map(|d| d.remaining())
    }

    fn admit(&self, _: &mut Req, _: &Verdict<'_, ()>, _: Option<Settlement>) -> Option<()> {
        None
    }

    fn failed(&self, _: &Req, error: StoreError) -> BoxError {
        Box::new(error)
    }

    fn keyless(&self, _: &Req, _: StatusCode) -> BoxError {
        Box::new(RateLimited::key_missing())
    }

    fn denied(&self, _: &Req) -> BoxError {
        Box::new(RateLimited::denied())
    }

    #[inline]
    fn settles(&self) -> bool {
        false
    }

    fn route<'r>(&self, _: &'r Req) -> Option<&'r str> {
        None
    }
}
