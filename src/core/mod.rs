//! The core every layer uses: a request's key and what a request without one becomes
//! ([`Common`]), the layer's own decision ([`Part`], the one trait each layer implements:
//! what its store is asked and what the answer means), and the response machine that
//! calls the inner service, waits, or answers ([`Machine`]).
//!
//! A request's way, the same through every layer: the layer's service (its access rules
//! first, for the HTTP rate limit) hands it to [`Core::call`], which reads its key, asks
//! the layer's [`Part`] (which asks its store) and starts the machine from the answer; the
//! layer's response future polls the machine to the inner service's response, adding
//! what the decision left for it ([`Finish`]), or to the layer's own answer.

mod common;
mod finish;
mod machine;

use std::sync::Arc;

use http::StatusCode;
use tower_service::Service;

pub(crate) use self::common::{store_failed, Common, CommonOptions, Keyed, Verdict, Wording};
pub(crate) use self::finish::{poll_http, Finish, OwnBody};
pub(crate) use self::machine::RefundGuard;
pub(crate) use self::machine::{Begin, Check, Continuation, Decide, Machine, Next};
use crate::key::KeyExtractor;

/// One layer's shared state: who is limited (`key`), the options every layer has
/// (`common`), and the layer's own part of the decision (`part`). One layer value is one
/// `Arc<Core>`, shared by every service it makes.
pub(crate) struct Core<X, P> {
    pub(crate) key: X,
    pub(crate) common: Common,
    pub(crate) part: P,
}

/// What a layer decides of a request once its key is read: a small trait each layer
/// implements (the rate limits, the in-flight limit, fair sharing). `K` is the key's type.
pub(crate) trait Part<Req, K>: Sized {
    /// An answer of the layer's own (a refusal).
    type Answer;
    /// What an admitted request leaves for its response.
    type Extra;
    /// A decision to come.
    type Later: Decide<Req, Self::Answer, Self::Extra>;

    /// Decides `req` for `key` (`None`: the state keyless requests share). `core` is the
    /// layer's state, which a decision to come may keep.
    fn decide<X: Send + Sync + 'static>(
        core: &Arc<Core<X, Self>>,
        key: Option<K>,
        req: &mut Req,
    ) -> Begin<Self::Answer, Self::Extra, Self::Later>;

    /// The answer to a request without a key, refused with `status`.
    fn keyless(&self, common: &Common, req: &Req, status: StatusCode) -> Self::Answer;
}

/// A layer's machine for one request, as its service's `call` makes it.
pub(crate) type MachineOf<S, Req, P, K> = Machine<
    S,
    Req,
    <S as Service<Req>>::Future,
    <P as Part<Req, K>>::Answer,
    <P as Part<Req, K>>::Extra,
    <P as Part<Req, K>>::Later,
>;

/// What a layer's part makes of a request before the machine starts.
pub(crate) type BeginOf<Req, P, K> =
    Begin<<P as Part<Req, K>>::Answer, <P as Part<Req, K>>::Extra, <P as Part<Req, K>>::Later>;

impl<X, P> Core<X, P> {
    /// `req`'s response future: its key read, its layer's decision, and `inner` called
    /// now, later or never. `future` is the layer's response future around the machine
    /// (its constructor: the future is built in place, see [`Machine::start`]).
    #[inline(always)]
    pub(crate) fn call<S, Req, F>(
        self: &Arc<Self>,
        inner: &mut S,
        mut req: Req,
        future: impl FnOnce(MachineOf<S, Req, P, X::Key>) -> F,
    ) -> F
    where
        S: Service<Req> + Clone,
        X: KeyExtractor<Req> + Send + Sync + 'static,
        P: Part<Req, X::Key>,
    {
        let begin = self.begin(&mut req);
        Machine::start(begin, inner, req, future)
    }

    /// What the core decides of `req` before the machine starts: its key read, then its
    /// layer's decision (or the answer to a request without a key).
    #[inline(always)]
    pub(crate) fn begin<Req>(self: &Arc<Self>, req: &mut Req) -> BeginOf<Req, P, X::Key>
    where
        X: KeyExtractor<Req> + Send + Sync + 'static,
        P: Part<Req, X::Key>,
    {
        match self.common.key(&self.key, req) {
            Keyed::Key(key) => P::decide(self, key, req),
            Keyed::Unlimited => Begin::Unlimited,
            Keyed::Refuse(status) => {
                Begin::Now(Next::Refuse(self.part.keyless(&self.common, req, status)))
            }
        }
    }
}
