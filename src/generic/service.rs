//! The generic rate-limit service: the shared [`Limited`] service on the generic
//! flavour of the limiter.

use std::hash::Hash;
use std::task::{Context, Poll};

use tower_service::Service;

use super::answer::Generic;
use crate::core::machine::{Machine, ResponseFuture};
use crate::core::service::Limited;
use crate::cost::Cost;
use crate::error::BoxError;
use crate::key::KeyExtractor;
use crate::ratelimit::limiter::Limiter;
use crate::store::Store;

/// The generic rate-limit service: a refusal is an error.
impl<S, X, St, C, Req> Service<Req> for Limited<S, Limiter<X, St, C, Generic>>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    X: KeyExtractor<Req> + Send + Sync + 'static,
    X::Key: Hash + Clone + Send + Sync + 'static,
    St: Store<Option<X::Key>>,
    C: Cost<Req> + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req, BoxError, ()>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let begin = self.shared.begin(&mut req);
        Machine::start(begin, &mut self.inner, req, |machine| ResponseFuture {
            machine,
        })
    }
}
