//! [`RetryAfter`]: a `tower::retry` policy that retries what an upstream refused once the
//! time it gave has passed, within a retry budget, each retry taking a slot of the layer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{Request, Response, StatusCode};
use tower::retry::budget::{Budget, TpsBudget};
use tower::retry::Policy;

use super::fields;
use super::pacer::{Call, Pacer};
use crate::core::{Core, Keyed};
use crate::key::{KeyBytes, KeyExtractor};
use crate::store::Store;

/// How long a refusal that says nothing of when to come back waits before its retry.
const UNSAID_WAIT: Duration = Duration::from_secs(1);

/// A `tower::retry` policy for calls through an [`UpstreamLayer`](super::UpstreamLayer):
/// a `429` or a `503` is retried once the time its upstream gave (`Retry-After`, or the
/// reset of a spent quota; 1 s when it gives none) has passed, if that is within the
/// layer's `max_wait` and the retry budget allows; the retry then waits for a slot of the
/// layer. What the refusal said is learned by the layer (the outer layer only sees the
/// last answer). Other answers and errors are not retried. Made by
/// [`UpstreamLayer::retry_policy`](super::UpstreamLayer::retry_policy).
pub struct RetryAfter<X, St> {
    core: Arc<Core<X, Pacer<St>>>,
    budget: Arc<TpsBudget>,
}

impl<X, St> RetryAfter<X, St> {
    pub(crate) fn new(core: &Arc<Core<X, Pacer<St>>>, budget: TpsBudget) -> Self {
        RetryAfter {
            core: Arc::clone(core),
            budget: Arc::new(budget),
        }
    }
}

impl<X, St> Clone for RetryAfter<X, St> {
    fn clone(&self) -> Self {
        RetryAfter {
            core: Arc::clone(&self.core),
            budget: Arc::clone(&self.budget),
        }
    }
}

impl<X, St> fmt::Debug for RetryAfter<X, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryAfter")
            .field("label", &self.core.common.label)
            .field("budget", &self.budget)
            .finish()
    }
}

impl<X, St, B, ResBody, E> Policy<Request<B>, Response<ResBody>, E> for RetryAfter<X, St>
where
    X: KeyExtractor<Request<B>> + Send + Sync + 'static,
    X::Key: KeyBytes + Clone + Send + Sync + 'static,
    St: Store<Option<X::Key>>,
    B: Clone,
{
    type Future = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn retry(
        &mut self,
        req: &mut Request<B>,
        result: &mut Result<Response<ResBody>, E>,
    ) -> Option<Self::Future> {
        let response = result.as_ref().ok()?;
        let status = response.status();
        if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
            self.budget.deposit();
            return None;
        }
        let core = &self.core;
        let call = match core.common.key(&core.key, req) {
            Keyed::Key(key) => Some(Call::new(&core.part.shared, key, core.common.on_error())),
            Keyed::Unlimited | Keyed::Refuse(_) => None,
        };
        let heard = match &call {
            Some(call) => call.hear(status, response.headers()),
            None => fields::read(status, response.headers(), SystemTime::now()),
        };
        let wait = heard.pause.map_or(UNSAID_WAIT, |(pause, _)| pause);
        if wait > core.part.shared.max_wait || !self.budget.withdraw() {
            return None;
        }
        Some(Box::pin(async move {
            tokio::time::sleep(wait).await;
            if let Some(call) = call {
                // The pause has passed: the retry takes its slot like any call. Refused
                // (others keep the quota busy past the wait), it goes anyway, once.
                let _ = Arc::new(call).acquire().await;
            }
        }))
    }

    fn clone_request(&mut self, req: &Request<B>) -> Option<Request<B>> {
        let mut clone = Request::new(req.body().clone());
        *clone.method_mut() = req.method().clone();
        *clone.uri_mut() = req.uri().clone();
        *clone.version_mut() = req.version();
        *clone.headers_mut() = req.headers().clone();
        *clone.extensions_mut() = req.extensions().clone();
        Some(clone)
    }
}
