//! How the generic layer answers (its flavour of the core): a refusal is a typed error, an
//! admission carries nothing.

use http::StatusCode;

use crate::error::{BoxError, RateLimited, StoreError};
use crate::limiter::{Flavour, Prepare, Screen, Settlement, Verdict};
use crate::policy::{choose::Chooser, Policy, PolicySet};

/// How the generic layer answers: a refusal is an error, an admission carries nothing.
#[derive(Clone, Copy, Debug)]
pub struct Generic;

impl Prepare for Generic {
    type Prepared = ();

    fn prepare(&self, _: Option<&str>, _: &Policy) {}
}

impl<Req> Flavour<Req> for Generic {
    type Refusal = BoxError;
    type Extra = ();

    fn refuse(&self, _: &Req, v: &Verdict<'_, ()>) -> BoxError {
        Box::new(RateLimited::new(*v.decision))
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
    fn screen(&self, _: &Req) -> Screen {
        Screen::Limit
    }

    #[inline]
    fn settles(&self) -> bool {
        false
    }

    fn route<'r>(&self, _: &'r Req) -> Option<&'r str> {
        None
    }

    // Out of line: the common path, without a selector, stays small.
    #[inline(never)]
    fn choose<K: 'static>(
        &self,
        chooser: &Chooser,
        req: &Req,
        key: Option<&K>,
        set: &PolicySet,
    ) -> usize
    where
        Req: 'static,
    {
        chooser
            .get::<RequestSelect<Req, K>>()
            .map_or(0, |select| select(req, key, set))
    }
}

/// The generic layer's selector of a policy, over the request and its key.
pub(crate) type RequestSelect<Req, K> =
    Box<dyn Fn(&Req, Option<&K>, &PolicySet) -> usize + Send + Sync>;
