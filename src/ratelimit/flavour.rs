//! How a layer answers: the flavour of the core each layer implements.

use http::StatusCode;

use crate::decision::Decision;
use crate::error::StoreError;
use crate::policy::choose::{Chooser, RequestSelect};
use crate::policy::{Policy, PolicySet};
pub(crate) use crate::response::Settlement;
use crate::store::Budget;

/// What a layer prepares for each policy when a set is installed (the HTTP layer's
/// formatted header values), so that no request formats them.
pub(crate) trait Prepare: Send + Sync + 'static {
    type Prepared: Send + Sync + 'static;

    fn prepare(&self, name: Option<&str>, policy: &Policy) -> Self::Prepared;
}

/// A decided request as a flavour sees it.
pub(crate) struct Verdict<'a, P> {
    pub(crate) decision: &'a Decision,
    pub(crate) name: Option<&'a str>,
    pub(crate) prepared: &'a P,
    /// The limits in shadow for this request's key, by index (bit `i`: limit `i`).
    pub(crate) shadow_mask: u8,
}

/// How a layer answers: what a refusal is (a response, an error) and what an admitted
/// request carries to its response.
pub(crate) trait Flavour<Req>: Prepare {
    type Refusal: 'static;
    type Extra: 'static;

    fn refuse(&self, req: &Req, v: &Verdict<'_, Self::Prepared>) -> Self::Refusal;
    /// The refusal of a request whose slot in a queue comes after its deadline (`v`'s
    /// decision: refused, retry after the slot's wait); by default a refusal like any.
    #[cold]
    fn late(&self, req: &Req, v: &Verdict<'_, Self::Prepared>) -> Self::Refusal {
        self.refuse(req, v)
    }
    /// The time `req`'s caller has left, when it says (see [`crate::deadline`]). Asked
    /// only of a request the store admitted with a wait.
    fn time_left(&self, req: &Req) -> Option<std::time::Duration>;
    /// What an admitted request carries to its response (none: the response goes out as
    /// the inner service made it), with the settlement of its cost when the layer settles
    /// costs from responses.
    fn admit(
        &self,
        req: &mut Req,
        v: &Verdict<'_, Self::Prepared>,
        settle: Option<Settlement>,
    ) -> Option<Self::Extra>;
    fn failed(&self, req: &Req, error: StoreError) -> Self::Refusal;
    fn keyless(&self, req: &Req, status: StatusCode) -> Self::Refusal;
    /// The answer to a request on a deny list.
    fn denied(&self, req: &Req) -> Self::Refusal;
    /// Whether admitted requests settle their cost from their response.
    fn settles(&self) -> bool;
    /// The route, for events.
    fn route<'r>(&self, req: &'r Req) -> Option<&'r str>;
    /// The route template the request matched (axum's `MatchedPath`: a bounded set),
    /// for the metrics counted by route.
    fn matched_route<'r>(&self, req: &'r Req) -> Option<&'r str> {
        let _ = req;
        None
    }

    /// The time `req` may still wait for its stores, shared by every layer it passes
    /// (see [`Budget`]), where the request can carry it; by default none.
    fn budget(&self, req: &mut Req) -> Option<Budget> {
        let _ = req;
        None
    }
    /// The index in `set` of the policy the layer's selector picks for `req` and `key`;
    /// by default a [`RequestSelect`] over the request itself. Out of line: the common
    /// path, without a selector, stays small.
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
