//! [`RateLimit`]: the HTTP middleware service made by [`crate::RateLimitLayer`], and how
//! the HTTP layer answers (its flavour of the core).

use std::{
    fmt,
    future::Future,
    hash::Hash,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::{
    access::Access,
    cost::Cost,
    error::StoreError,
    future::Machine,
    key::{KeyExtractor, RequestHead},
    layer::{DecisionEvent, Hook},
    limiter::{Flavour, Limiter, Prepare, Screen, Settlement, Verdict},
    policy::Policy,
    response::{
        grpc, own_answer, Answers, Extra, Fields, Pending, RateLimitBody, ResponseHead,
        ResponseHeaders, SettleRule,
    },
    store::Store,
};

/// How the HTTP layer answers: the layer's response settings, its exemptions and deny
/// lists, and how it settles costs from responses.
pub(crate) struct Http {
    pub(crate) answers: Answers,
    pub(crate) expose: bool,
    pub(crate) shadow_header: Option<HeaderName>,
    pub(crate) hook: Option<Hook>,
    pub(crate) access: Access,
    pub(crate) settle: Option<SettleRule>,
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
    type Refusal = Box<Response<Bytes>>;
    type Extra = ResponseHeaders;

    fn refuse(&self, req: &Request<B>, v: &Verdict<'_, Fields>) -> Self::Refusal {
        let mut r = if self.grpc(req) {
            v.prepared
                .grpc_refusal(&self.answers, v.decision, v.shadow_mask)
        } else {
            v.prepared.refusal(&self.answers, v.decision, v.shadow_mask)
        };
        if let Some(extra) = self.hook(req, v) {
            let mut headers = ResponseHeaders::default();
            headers.extra = Some(Box::new(Extra {
                headers: extra,
                settle: None,
            }));
            headers.apply(r.headers_mut());
        }
        Box::new(r)
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

    fn failed(&self, req: &Request<B>, _: StoreError) -> Self::Refusal {
        Box::new(own_answer(
            self.grpc(req),
            StatusCode::SERVICE_UNAVAILABLE,
            "The rate limiter's store is unavailable.",
        ))
    }

    fn keyless(&self, req: &Request<B>, status: StatusCode) -> Self::Refusal {
        Box::new(own_answer(
            self.grpc(req),
            status,
            "No rate-limit key could be extracted from this request.",
        ))
    }

    fn denied(&self, req: &Request<B>) -> Self::Refusal {
        Box::new(own_answer(
            self.grpc(req),
            StatusCode::FORBIDDEN,
            "This client is denied.",
        ))
    }

    #[inline]
    fn screen(&self, req: &Request<B>) -> Screen {
        self.access.screen(req)
    }

    #[inline]
    fn settles(&self) -> bool {
        self.settle.is_some()
    }

    fn route<'r>(&self, req: &'r Request<B>) -> Option<&'r str> {
        Some(RequestHead::of(req).route())
    }
}

/// The HTTP rate-limit service. Made by [`crate::RateLimitLayer`]; see the
/// [crate docs](crate).
///
/// It keeps the inner service's error type and answers refusals with a response, so an
/// axum `Router` stays infallible. `poll_ready` only forwards to the inner service; the
/// decision is made in `call`.
pub struct RateLimit<S, X, St, C> {
    pub(crate) inner: S,
    pub(crate) limiter: Arc<Limiter<X, St, C, Http>>,
}

impl<S: Clone, X, St, C> Clone for RateLimit<S, X, St, C> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<S: fmt::Debug, X, St, C> fmt::Debug for RateLimit<S, X, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

type HttpMachine<S, B> = Machine<
    S,
    Request<B>,
    <S as Service<Request<B>>>::Future,
    Box<Response<Bytes>>,
    ResponseHeaders,
>;

pin_project! {
    /// The response future of [`RateLimit`]. No allocation on the in-memory path.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        machine: HttpMachine<S, B>,
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ResponseFuture")
            .field(&self.machine)
            .finish()
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<RateLimitBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().machine.poll_machine(
            cx,
            |result, extra| {
                let mut response = result?.map(RateLimitBody::inner);
                if let Some(mut h) = extra {
                    if let Some(pending) = h.extra.as_mut().and_then(|x| x.settle.take()) {
                        pending.settle(&ResponseHead::of(&response));
                    }
                    h.apply(response.headers_mut());
                }
                Ok(response)
            },
            |response| Ok((*response).map(RateLimitBody::full)),
        )
    }
}

impl<S, X, St, C, B, ResBody> Service<Request<B>> for RateLimit<S, X, St, C>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    B: Send + 'static,
    ResBody: 'static,
    X: KeyExtractor<Request<B>> + Send + Sync + 'static,
    X::Key: Hash + Clone + Send + Sync + 'static,
    St: Store<Option<X::Key>>,
    C: Cost<Request<B>> + Send + Sync + 'static,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let begin = self.limiter.begin(&mut req);
        Machine::start(begin, &mut self.inner, req, |machine| ResponseFuture {
            machine,
        })
    }
}
