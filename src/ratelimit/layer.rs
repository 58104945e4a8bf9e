//! [`RateLimitLayer`]: the HTTP layer. One layer value is one limit, shared by every clone
//! and every route it is applied to.

use std::{fmt, sync::Arc};

use http::Request;
use tower_layer::Layer;

use super::{answer::Http, builder::Builder, limiter::RateCore, service::RateLimit};
use crate::cost::UnitCost;
use crate::decision::Decision;
use crate::key::{Global, KeyExtractor};
use crate::policy::{PolicyHandle, PolicySet};
use crate::store::{MemoryStore, Store, StoreFuture};

/// Applies a rate limit: `.layer(RateLimitLayer::...)` on an axum `Router`, a route, or any
/// tower HTTP service. See the [crate docs](crate) for the guide.
///
/// One layer value is one limit: every service it makes (axum calls `layer` once per
/// route, and clones services freely) shares the same state. Build two layers for two
/// independent limits.
///
/// Type parameters: `X` the [`KeyExtractor`], `St` the [`Store`], `C` the
/// [`Cost`](crate::cost::Cost).
pub struct RateLimitLayer<X = Global, St = MemoryStore<Option<()>>, C = UnitCost> {
    pub(crate) core: Arc<RateCore<X, St, C, Http>>,
}

impl<X, St, C> Clone for RateLimitLayer<X, St, C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            core: Arc::clone(&self.core),
        }
    }
}

impl<X: fmt::Debug, St, C> fmt::Debug for RateLimitLayer<X, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("key", &self.core.key)
            .field("label", &self.core.common.label)
            .field("limiter", &self.core.part)
            .finish()
    }
}

impl<S, X, St, C> Layer<S> for RateLimitLayer<X, St, C> {
    type Service = RateLimit<S, X, St, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, &self.core)
    }
}

impl<X, St, C> RateLimitLayer<X, St, C> {
    /// The store, for inspection (e.g.
    /// [`MemoryStore::stats`](crate::store::MemoryStore::stats)).
    pub fn store(&self) -> &St {
        &self.core.part.store
    }

    /// The policies in force.
    pub fn policies(&self) -> PolicySet {
        self.core.part.policies()
    }

    /// A handle that swaps this layer's policies while requests flow. See
    /// [`PolicyHandle`].
    pub fn policy_handle(&self) -> PolicyHandle
    where
        X: Send + Sync + 'static,
        St: Send + Sync + 'static,
        C: Send + Sync + 'static,
    {
        PolicyHandle::new(self.core.clone())
    }

    /// Forgets `key`'s state in the layer's store, under every policy: its next request
    /// finds it fresh (a customer unbanned). On the Redis store, every instance sees it.
    ///
    /// ```
    /// use tollgate::{key::HeaderKey, RateLimitLayer};
    ///
    /// # tokio_test(async {
    /// let layer = RateLimitLayer::new(HeaderKey::new("x-api-key")?, "1/hour".parse::<tollgate::Policy>()?);
    /// // ... an admin route holding a clone of `layer`:
    /// layer.reset("customer-42").await?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # });
    /// # fn tokio_test<F: std::future::Future>(f: F) -> F::Output {
    /// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    /// # }
    /// ```
    pub fn reset<K>(&self, key: impl Into<K>) -> StoreFuture<()>
    where
        X: KeyExtractor<Request<()>, Key = K>,
        St: Store<Option<K>>,
    {
        self.core.part.store.reset(&Some(key.into()))
    }

    /// What `key` has left now, read without spending anything: the layer's fallback
    /// policy's decision for a request of no cost (each limit's remaining units, by name
    /// with [`Decision::limit`](crate::Decision::limit)). `key` is what the extractor gives
    /// (a header value, a user id; `()` for [`Global`](crate::key::Global)).
    pub fn peek<K>(&self, key: impl Into<K>) -> StoreFuture<Decision>
    where
        X: KeyExtractor<Request<()>, Key = K>,
        St: Store<Option<K>>,
    {
        let set = self.core.part.policies();
        self.core
            .part
            .store
            .preview(&Some(key.into()), set.fallback(), 0)
    }
}

impl<X> RateLimitLayer<X, MemoryStore<Option<<X as KeyExtractor<Request<()>>>::Key>>, UnitCost>
where
    X: KeyExtractor<Request<()>>,
    X::Key: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A layer limiting each key of `key` to `policy` (a [`Limit`](crate::Limit), a [`Policy`](crate::Policy), or
    /// a whole [`PolicySet`]), in memory, with the defaults of [`RateLimitLayer::builder`].
    /// Both are already validated, so this cannot fail.
    ///
    /// ```
    /// use tollgate::{key::PeerIp, Limit, Quota, RateLimitLayer};
    ///
    /// let limit = RateLimitLayer::new(PeerIp::new(), Limit::token_bucket(Quota::per_second(5)?)?);
    /// # let _: axum::Router = axum::Router::new().layer(limit);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn new(key: X, policy: impl Into<PolicySet>) -> Self {
        RateLimitLayer::builder()
            .key(key)
            .policies(policy.into())
            .build()
            .expect("a set of validated policies, which the memory store decides")
    }
}

impl RateLimitLayer {
    /// Starts a builder: one global limit, unit cost, IETF headers and problem+json bodies
    /// on; pick a key with [`Builder::key`](crate::ratelimit::Builder::key) and at least one limit.
    pub fn builder() -> Builder<Global, UnitCost, Http> {
        Builder::new(Global::new(), UnitCost, Http::default())
    }
}
