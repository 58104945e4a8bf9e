//! Rate limiting for any `tower::Service`, not only HTTP.
//!
//! [`RateLimitLayer`] (made by [`crate::RateLimitLayer::generic`]) limits a service of any
//! request type. A refusal is an error, [`RateLimited`], boxed into
//! [`BoxError`]; downcast it to read the exact retry-after. So it composes
//! with `tower::timeout` and `tower::retry`. For a client calling a third-party API, a
//! leaky-bucket queue makes calls wait for their slot instead of failing.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{generic::RateLimited, key::key_fn, Quota, RateLimitLayer};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), tollgate::BoxError> {
//! struct Job { tenant: u32 }
//! let layer = RateLimitLayer::builder()
//!     .key(key_fn(|job: &Job| Some(job.tenant)))
//!     .token_bucket(Quota::per_second(1)?)
//!     .build_for::<Job>()?
//!     .generic();
//! let mut svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|job: Job| async move { Ok::<_, tollgate::BoxError>(job.tenant) });
//!
//! assert_eq!(svc.ready().await?.call(Job { tenant: 1 }).await?, 1);
//! let err = svc.ready().await?.call(Job { tenant: 1 }).await.unwrap_err();
//! let limited = err.downcast_ref::<RateLimited>().expect("a rate-limit refusal");
//! assert_eq!(limited.retry_after(), Some(Duration::from_secs(1)));
//! # Ok(()) }
//! ```

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
};

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

pub use crate::error::{KeyMissing, RateLimited};
use crate::{
    future::{take_ready, Finished, Machine},
    key::KeyExtractor,
    layer::{Cost, Shared, Start},
    store::Store,
    BoxError,
};

/// The layer for any `tower::Service`. See the [module docs](self).
pub struct RateLimitLayer<X, St, C> {
    pub(crate) shared: Arc<Shared<X, St, C>>,
}

impl<X, St, C> Clone for RateLimitLayer<X, St, C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<X, St, C> fmt::Debug for RateLimitLayer<X, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("generic::RateLimitLayer")
            .finish_non_exhaustive()
    }
}

impl<S, X, St, C> Layer<S> for RateLimitLayer<X, St, C> {
    type Service = RateLimit<S, X, St, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The generic rate-limit service. See the [module docs](self).
pub struct RateLimit<S, X, St, C> {
    inner: S,
    shared: Arc<Shared<X, St, C>>,
}

impl<S: Clone, X, St, C> Clone for RateLimit<S, X, St, C> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, X, St, C> fmt::Debug for RateLimit<S, X, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("generic::RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

type GenericMachine<S, Req> = Machine<S, Req, <S as Service<Req>>::Future, BoxError, ()>;

pin_project! {
    /// The response future of the generic [`RateLimit`].
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        machine: GenericMachine<S, Req>,
    }
}

impl<S: Service<Req>, Req> fmt::Debug for ResponseFuture<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("generic::ResponseFuture")
            .field(&self.machine)
            .finish()
    }
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(match ready!(self.project().machine.poll_machine(cx)) {
            Finished::Inner(result, _) => result.map_err(Into::into),
            Finished::Early(e) => Err(e),
        })
    }
}

fn refuse<X, St, C>(
    _: &Shared<X, St, C>,
    d: Result<&crate::Decision, crate::StoreError>,
) -> BoxError {
    match d {
        Ok(d) => Box::new(RateLimited::new(*d)),
        Err(e) => Box::new(e),
    }
}

impl<S, X, St, C, Req> Service<Req> for RateLimit<S, X, St, C>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    X: KeyExtractor<Req> + Send + Sync + 'static,
    X::Key: Clone + Send + Sync + 'static,
    St: Store<Option<X::Key>>,
    C: Cost<Req> + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let shared = &self.shared;
        let machine = match shared.start(&req) {
            Start::Decided {
                key,
                cost,
                decision,
            } => {
                let next = shared.next(&key, cost, &decision, refuse, |_, _| ());
                Machine::from_next(next, &mut self.inner, req)
            }
            Start::Pending { key, cost, check } => {
                let then = shared.continuation(key, cost, refuse, |_, _| (), |_, _, _| ());
                Machine::checking(check, then, take_ready(&mut self.inner), req)
            }
            Start::Failed(e) => Machine::refused(refuse(shared, Err(e))),
            Start::Unlimited => Machine::calling(self.inner.call(req), None),
            Start::Reject(_) => Machine::refused(Box::new(KeyMissing) as BoxError),
        };
        ResponseFuture { machine }
    }
}
