//! The gate: what the layers that admit or refuse before calling (in-flight and fair
//! sharing) have in common, written once: the
//! options their builders share (who is limited, the limit's name, what becomes of keyless
//! requests and of store failures), and what those options make of a request before the
//! store sees it.

use std::task::{Context, Poll};
use std::{fmt, ops::ControlFlow, sync::Arc};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use tower_service::Service;

use super::finish::Finish;
use crate::core::machine::{take_ready, Decide, Machine, ResponseFuture};
use crate::core::service::Limited;
use crate::error::ConfigError;
use crate::key::KeyExtractor;
use crate::observe::KeylessWarning;
use crate::options::{MissingKey, OnStoreError};
use crate::response::{grpc, own_answer, OwnAnswer};

/// What the layer makes of a request: the inner service is called, the response getting
/// the fields `H` (`Ok`; `None`: the request went through unlimited), or an answer of the
/// layer's own (`Err`). See [`Machine::now`](crate::core::machine::Machine::now).
pub(crate) type Verdict<H> = Result<Option<H>, OwnAnswer>;

/// What the store made of a request: decided at once, or a decision to come (a
/// [`Decide`](crate::core::machine::Decide)).
// Public in a private module: a `Part`'s answer; users never name it.
#[allow(missing_debug_implementations)]
pub enum Decided<H, D> {
    Now(Verdict<H>),
    Later(D),
}

/// The words of a layer's own answers and events.
#[derive(Debug)]
pub(crate) struct Wording {
    /// The layer's kind in events: `in-flight limit`.
    pub(crate) kind: &'static str,
    /// The detail of a keyless request's rejection.
    pub(crate) no_key: &'static str,
    /// The detail of a failed store's `503` under `OnStoreError::FailClosed`.
    pub(crate) store_down: &'static str,
}

/// The options both builders hold; each builder's setters write them.
#[derive(Clone, Debug)]
pub(crate) struct CommonOptions<X> {
    pub(crate) key: X,
    pub(crate) label: String,
    pub(crate) missing: MissingKey,
    pub(crate) on_error: OnStoreError,
}

impl<X> CommonOptions<X> {
    /// `key`, named `label`, keyless requests refused (`400`), stores failing open.
    pub(crate) fn new(key: X, label: &str) -> Self {
        CommonOptions {
            key,
            label: label.into(),
            missing: MissingKey::default(),
            on_error: OnStoreError::default(),
        }
    }

    /// The layer's part. Refuses a label that cannot be sent in a header (empty, or not
    /// printable ASCII) or holds one of `forbidden`.
    pub(crate) fn build(
        self,
        forbidden: &[u8],
        wording: &'static Wording,
    ) -> Result<Common<X>, ConfigError> {
        let label = self.label;
        if label.is_empty()
            || !label
                .bytes()
                .all(|b| (0x20..=0x7e).contains(&b) && !forbidden.contains(&b))
        {
            return Err(ConfigError::InvalidName(label));
        }
        Ok(Common {
            key: self.key,
            label: label.into(),
            missing: self.missing,
            warned: KeylessWarning::default(),
            wording,
        })
    }
}

/// The setters of the options every gate layer's builder holds in `common` (a
/// [`CommonOptions`]), written once: the limit's name (default `$label`; `$more` says
/// what else it names and forbids), keyless requests and store failures.
macro_rules! common_setters {
    ($label:literal, $more:literal) => {
        $crate::setters::setters! {
            /// The limit's name: in the `RateLimit` / `RateLimit-Policy` items, the problem
            /// body's `violated-policies`, the logs and the metrics.
            #[doc = concat!("Default `", $label, "`; printable ASCII", $more, ".")]
            label(label: &str) => common.label = label.into();

            /// What to do with a request without a key (default
            /// [`MissingKey::Reject`](crate::key::MissingKey::Reject) with `400`: see
            /// [`MissingKey`](crate::key::MissingKey)).
            on_missing_key(missing: crate::options::MissingKey) => common.missing;

            /// What to do when a shared store fails (default
            /// [`OnStoreError::FailOpen`](crate::store::OnStoreError::FailOpen): the
            /// request goes through unlimited). The memory stores never fail.
            on_store_error(on_error: crate::options::OnStoreError) => common.on_error;
        }
    };
}
pub(crate) use common_setters;

/// The options at work, shared by every service of one layer.
#[derive(Debug)]
pub(crate) struct Common<X> {
    pub(crate) key: X,
    /// The limit's name (checked).
    pub(crate) label: Arc<str>,
    missing: MissingKey,
    /// Whether the extractor's misconfiguration was logged already (once per layer).
    warned: KeylessWarning,
    wording: &'static Wording,
}

impl<X> Common<X> {
    /// A service's response machine for `req`: its key goes to `decide` (which asks the
    /// store), or a request without one gets what `MissingKey` makes of it.
    #[inline]
    pub(crate) fn call<S, B, H, D>(
        &self,
        inner: &mut S,
        req: Request<B>,
        decide: impl FnOnce(Option<X::Key>, &Request<B>) -> Decided<H, D>,
    ) -> Machine<S, Request<B>, S::Future, OwnAnswer, H, D>
    where
        S: Service<Request<B>> + Clone,
        X: KeyExtractor<Request<B>>,
    {
        match self.key(&req) {
            ControlFlow::Continue(key) => match decide(key, &req) {
                Decided::Now(verdict) => Machine::now(verdict, inner, req),
                Decided::Later(decide) => Machine::later(decide, take_ready(inner), req),
            },
            ControlFlow::Break(verdict) => Machine::now(verdict, inner, req),
        }
    }

    /// The request's key (`None`: the state keyless requests share), or, for a request
    /// without one, what `MissingKey` makes of it when no store is asked.
    #[inline]
    fn key<B, H>(&self, req: &Request<B>) -> ControlFlow<Verdict<H>, Option<X::Key>>
    where
        X: KeyExtractor<Request<B>>,
    {
        match self.key.extract(req) {
            Some(k) => ControlFlow::Continue(Some(k)),
            None => self.keyless(req),
        }
    }

    /// A request without a key: logged once per layer when the extractor says why, then
    /// `MissingKey` decides.
    #[cold]
    fn keyless<B, H>(&self, req: &Request<B>) -> ControlFlow<Verdict<H>, Option<X::Key>>
    where
        X: KeyExtractor<Request<B>>,
    {
        self.warned
            .keyless(&self.key, req, &self.label, self.missing, self.wording.kind);
        match self.missing {
            MissingKey::Allow => ControlFlow::Break(Ok(None)),
            MissingKey::Reject(status) => ControlFlow::Break(Err(Box::new(own_answer(
                grpc::is_grpc(req.headers()),
                status,
                self.wording.no_key,
            )))),
            _ => ControlFlow::Continue(None),
        }
    }
}

/// What a failed store means under `on_error`: the request goes through without fields
/// (fail open), or it gets a `503` of the layer's own (fail closed).
#[cold]
pub(crate) fn store_failed<B, H>(
    on_error: OnStoreError,
    wording: &Wording,
    req: &Request<B>,
) -> Verdict<H> {
    match on_error {
        OnStoreError::FailClosed => Err(Box::new(own_answer(
            grpc::is_grpc(req.headers()),
            StatusCode::SERVICE_UNAVAILABLE,
            wording.store_down,
        ))),
        _ => Ok(None),
    }
}

/// The state every service of one gate layer shares: the options at work, and the layer's
/// own part (its store, its limits, its answers).
pub struct Gated<X, P> {
    pub(crate) common: Common<X>,
    pub(crate) part: P,
}

impl<X, P> fmt::Debug for Gated<X, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gated")
            .field("label", &self.common.label)
            .finish_non_exhaustive()
    }
}

/// A gate layer's own part of a decision: its store asked for a request's key.
// Public in a private module: it bounds the public `Service` impl below; users never name
// it.
pub trait Part<K> {
    /// What an admitted request leaves for its response.
    type Extra: Finish;
    /// A decision to come.
    type Later;

    /// Asks the store for `key` (`None`: the state keyless requests share); a failed
    /// store is answered under the layer's `OnStoreError`.
    fn decide<B>(&self, key: Option<K>, req: &Request<B>) -> Decided<Self::Extra, Self::Later>;
}

impl<S, X, P, B, ResBody> Service<Request<B>> for Limited<S, Gated<X, P>>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    X: KeyExtractor<Request<B>>,
    P: Part<X::Key>,
    P::Later: Decide<Request<B>, OwnAnswer, P::Extra>,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<<P::Extra as Finish>::Body<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Request<B>, OwnAnswer, P::Extra, P::Later>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let Gated { common, part } = &*self.shared;
        let machine = common.call(&mut self.inner, req, |key, req| part.decide(key, req));
        ResponseFuture { machine }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static WORDS: Wording = Wording {
        kind: "test limit",
        no_key: "no key",
        store_down: "store down",
    };

    fn label(label: &str, forbidden: &[u8]) -> Result<Arc<str>, ConfigError> {
        let mut options = CommonOptions::new((), "default");
        options.label = label.into();
        options.build(forbidden, &WORDS).map(|c| c.label)
    }

    #[test]
    fn labels_must_be_printable_and_without_the_forbidden_bytes() {
        assert!(label("", b"").is_err());
        assert!(label("é", b"").is_err());
        assert!(label("a\nb", b"").is_err());
        assert!(label("a{b}", b"{}").is_err());
        assert_eq!(&*label("a{b}", b"").unwrap(), "a{b}");
        assert_eq!(&*label("a\"b", b"{}").unwrap(), "a\"b");
    }
}
