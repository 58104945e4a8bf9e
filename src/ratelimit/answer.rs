//! How the HTTP layer answers (its flavour of the core): fields on admitted responses,
//! refusals as `429` with a problem body or a gRPC status, the decision hook, exemptions and
//! the settling of costs from responses.

use std::sync::Arc;

use http::{HeaderMap, HeaderName, Request, StatusCode};

use super::access::Access;
use crate::deadline::DeadlineSources;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::RequestHead;
use crate::policy::{choose::Chooser, Policy, PolicySet};
use crate::ratelimit::limiter::{Flavour, Prepare, Settlement, Verdict};
use crate::response::OwnResponse;
use crate::response::{
    grpc, own_answer, Answers, Extra, Fields, Pending, ResponseHeaders, SettleRule,
};
use crate::store::Budget;

/// What a decision hook is given: the request's head, the decision, and the name of the
/// policy that applied. See [`Builder::on_decision`](crate::ratelimit::Builder::on_decision).
#[derive(Debug)]
pub struct DecisionEvent<'a> {
    pub(crate) head: RequestHead<'a>,
    pub(crate) decision: &'a Decision,
    pub(crate) policy: Option<&'a str>,
}

impl<'a> DecisionEvent<'a> {
    /// The request's method, URI, headers and extensions.
    pub fn request(&self) -> &RequestHead<'a> {
        &self.head
    }

    /// The decision: admitted or refused, remaining units, retry-after.
    pub fn decision(&self) -> &'a Decision {
        self.decision
    }

    /// The name of the policy that applied, in the layer's set (`None` for a layer of one
    /// unnamed policy).
    pub fn policy(&self) -> Option<&'a str> {
        self.policy
    }
}

/// A decision hook. See [`Builder::on_decision`](crate::ratelimit::Builder::on_decision).
pub(crate) type Hook = Arc<dyn Fn(&DecisionEvent<'_>, &mut HeaderMap) + Send + Sync>;

/// How the HTTP layer answers: the layer's response settings, its exemptions and deny
/// lists, and how it settles costs from responses.
#[derive(Default)]
pub struct Http {
    pub(crate) answers: Answers,
    pub(crate) expose: bool,
    pub(crate) shadow_header: Option<HeaderName>,
    pub(crate) hook: Option<Hook>,
    pub(crate) access: Access,
    pub(crate) settle: Option<SettleRule>,
    /// Where a request's deadline is read.
    pub(crate) deadlines: DeadlineSources,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http")
            .field("answers", &self.answers)
            .field("expose", &self.expose)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl Prepare for Http {
    type Prepared = Fields;

    fn prepare(&self, _: Option<&str>, policy: &Policy) -> Fields {
        Fields::new(policy)
    }
}

impl Http {
    /// Hook headers, the shadow header and the cost to settle: what few admissions carry.
    #[cold]
    fn rare<B>(
        &self,
        req: &Request<B>,
        v: &Verdict<'_, Fields>,
        settle: Option<Settlement>,
        headers: &mut ResponseHeaders,
    ) {
        let d = v.decision;
        let mut extra = self.hook(req, v).unwrap_or_default();
        if let (true, Some(name)) = (d.shadowed(), &self.shadow_header) {
            extra.insert(name.clone(), v.prepared.shadow_value(d));
        }
        let settle = settle
            .zip(self.settle.clone())
            .map(|(settlement, rule)| Pending { settlement, rule });
        if !extra.is_empty() || settle.is_some() {
            headers.extra = Some(Box::new(Extra {
                headers: extra,
                settle,
            }));
        }
    }

    /// A refusal with the headers the decision hook adds.
    fn hooked<B>(
        &self,
        req: &Request<B>,
        v: &Verdict<'_, Fields>,
        mut r: OwnResponse,
    ) -> OwnResponse {
        if let Some(extra) = self.hook(req, v) {
            let mut headers = ResponseHeaders::default();
            headers.extra = Some(Box::new(Extra {
                headers: extra,
                settle: None,
            }));
            headers.apply(r.headers_mut());
        }
        r
    }

    /// Whether to answer `req` with a gRPC status rather than an HTTP refusal.
    fn grpc<B>(&self, req: &Request<B>) -> bool {
        self.answers.grpc && grpc::is_grpc(req.headers())
    }

    /// Runs the decision hook; what it inserts goes to the response.
    fn hook<B>(&self, req: &Request<B>, v: &Verdict<'_, Fields>) -> Option<HeaderMap> {
        let hook = self.hook.as_ref()?;
        let mut headers = HeaderMap::new();
        let event = DecisionEvent {
            head: RequestHead::of(req),
            decision: v.decision,
            policy: v.name,
        };
        hook(&event, &mut headers);
        (!headers.is_empty()).then_some(headers)
    }
}

impl<B> Flavour<Request<B>> for Http {
    type Refusal = OwnResponse;
    type Extra = ResponseHeaders;

    fn refuse(&self, req: &Request<B>, v: &Verdict<'_, Fields>) -> Self::Refusal {
        let r = if self.grpc(req) {
            v.prepared
                .grpc_refusal(&self.answers, v.decision, v.shadow_mask)
        } else {
            v.prepared.refusal(&self.answers, v.decision, v.shadow_mask)
        };
        self.hooked(req, v, r)
    }

    /// A refusal of its own problem type (and gRPC message): the request's turn in a queue
    /// comes after its deadline.
    fn late(&self, req: &Request<B>, v: &Verdict<'_, Fields>) -> Self::Refusal {
        let r = if self.grpc(req) {
            v.prepared
                .late_grpc_refusal(&self.answers, v.decision, v.shadow_mask)
        } else {
            v.prepared
                .late_refusal(&self.answers, v.decision, v.shadow_mask)
        };
        self.hooked(req, v, r)
    }

    #[inline(always)]
    fn admit(
        &self,
        req: &mut Request<B>,
        v: &Verdict<'_, Fields>,
        settle: Option<Settlement>,
    ) -> Option<ResponseHeaders> {
        let d = v.decision;
        if self.expose || d.shadowed() {
            req.extensions_mut().insert(*d);
        }
        let rare = settle.is_some()
            || self.hook.is_some()
            || (d.shadowed() && self.shadow_header.is_some());
        // With the fields off and nothing rare, the response goes out untouched.
        if !rare && !self.answers.fields() {
            return None;
        }
        let mut headers = v.prepared.headers(&self.answers, d, v.shadow_mask);
        if rare {
            self.rare(req, v, settle, &mut headers);
        }
        Some(headers)
    }

    fn time_left(&self, req: &Request<B>) -> Option<std::time::Duration> {
        self.deadlines.left(req)
    }

    fn failed(&self, req: &Request<B>, _: StoreError) -> Self::Refusal {
        own_answer(
            self.grpc(req),
            StatusCode::SERVICE_UNAVAILABLE,
            "The rate limiter's store is unavailable.",
        )
    }

    fn keyless(&self, req: &Request<B>, status: StatusCode) -> Self::Refusal {
        own_answer(
            self.grpc(req),
            status,
            "No rate-limit key could be extracted from this request.",
        )
    }

    fn denied(&self, req: &Request<B>) -> Self::Refusal {
        own_answer(
            self.grpc(req),
            StatusCode::FORBIDDEN,
            "This client is denied.",
        )
    }

    /// The budget lives in the request's extensions, where every layer it passes finds
    /// it (a network store's call draws on it). Asked only of a request its store cannot
    /// decide at once.
    fn budget(&self, req: &mut Request<B>) -> Option<Budget> {
        Some(
            req.extensions_mut()
                .get_or_insert_default::<Budget>()
                .clone(),
        )
    }

    #[inline]
    fn settles(&self) -> bool {
        self.settle.is_some()
    }

    fn route<'r>(&self, req: &'r Request<B>) -> Option<&'r str> {
        Some(RequestHead::of(req).route())
    }

    #[cfg(feature = "axum")]
    fn matched_route<'r>(&self, req: &'r Request<B>) -> Option<&'r str> {
        let route = req.extensions().get::<axum::extract::MatchedPath>()?;
        Some(route.as_str())
    }

    // Out of line: the common path, without a selector, stays small.
    #[inline(never)]
    fn choose<K: 'static>(
        &self,
        chooser: &Chooser,
        req: &Request<B>,
        key: Option<&K>,
        set: &PolicySet,
    ) -> usize
    where
        Request<B>: 'static,
    {
        chooser
            .get::<HeadSelect<K>>()
            .map_or(0, |select| select(&RequestHead::of(req), key, set))
    }
}

/// The HTTP layer's selector of a policy, over the request's head and its key.
pub(crate) type HeadSelect<K> =
    Box<dyn Fn(&RequestHead<'_>, Option<&K>, &PolicySet) -> usize + Send + Sync>;
