//! The generic [`RateLimitLayer`], and the setters of [`Builder`] that are its own: `select`
//! over the request, key lists of the key's type, and `build` for a request type.

use std::{fmt, sync::Arc};

use tower_layer::Layer;

use super::answer::{Generic, RequestDeadline};
use super::service::RateLimit;
use crate::cost::UnitCost;
use crate::deadline::Deadline;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::key::{Global, KeyExtractor};
use crate::options::KeyList;
use crate::policy::choose::{Chooser, RequestSelect};
use crate::policy::{PolicyHandle, PolicyName, PolicySet};
use crate::ratelimit::limiter::RateCore;
use crate::ratelimit::Builder;
use crate::store::{MemoryStore, Store, StoreFuture};

/// The layer for any `tower::Service`. See the [module docs](super).
pub struct RateLimitLayer<X = Global, St = MemoryStore<Option<()>>, C = UnitCost> {
    pub(crate) core: Arc<RateCore<X, St, C, Generic>>,
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
        f.debug_struct("generic::RateLimitLayer")
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

impl RateLimitLayer {
    /// Starts a builder: one global limit, unit cost; pick a key with [`Builder::key`](crate::ratelimit::Builder::key) and
    /// at least one limit.
    pub fn builder() -> Builder<Global, UnitCost, Generic> {
        Builder::new(Global::new(), UnitCost, Generic::default())
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
    /// finds it fresh.
    pub fn reset<K>(&self, key: K) -> StoreFuture<()>
    where
        St: Store<Option<K>>,
    {
        self.core.part.store.reset(&Some(key))
    }

    /// What `key` has left now, read without spending anything: the layer's fallback
    /// policy's decision for a request of no cost (each limit's remaining units, by name
    /// with [`Decision::limit`](crate::Decision::limit)).
    pub fn peek<K>(&self, key: K) -> StoreFuture<Decision>
    where
        St: Store<Option<K>>,
    {
        let set = self.core.part.policies();
        self.core.part.store.preview(&Some(key), set.fallback(), 0)
    }
}

/// The generic layer's own setters. See [`RateLimitLayer::builder`].
impl<X, C> Builder<X, C, Generic> {
    /// Picks, per request, which named policy applies, from the request and its key. See
    /// the HTTP layer's [`select`](Builder::select).
    pub fn select<F, N, K, Req>(mut self, select: F) -> Self
    where
        F: Fn(&Req, Option<&K>) -> N + Send + Sync + 'static,
        N: PolicyName,
        K: 'static,
        Req: 'static,
    {
        self.settings.names = N::all_names();
        let select: RequestSelect<Req, K> =
            Box::new(move |req, key, set| set.choose(select(req, key).policy_name()));
        self.settings.chooser = Some(Chooser::new::<_, K>(select));
        self
    }

    /// Reads a request's [`Deadline`] (when its caller stops waiting): a request the
    /// layer would queue past it is refused at once with a
    /// [`RateLimited`](crate::generic::RateLimited) whose
    /// [`is_past_deadline`](crate::generic::RateLimited::is_past_deadline) is true and
    /// whose retry-after is its slot's wait; its slot stays free. Without it, the layer
    /// reads no deadline.
    pub fn deadline<Req: 'static>(
        mut self,
        deadline: impl Fn(&Req) -> Option<Deadline> + Send + Sync + 'static,
    ) -> Self {
        let read: RequestDeadline<Req> = Box::new(deadline);
        self.flavour.deadline = Some(Arc::new(read));
        self
    }

    /// Never limits these keys (an internal caller's): the keys are of the type the
    /// extractor returns; another type is reported by `build`.
    pub fn allow_keys(
        mut self,
        keys: impl IntoIterator<Item = impl std::hash::Hash + Eq + Send + Sync + 'static>,
    ) -> Self {
        self.settings.allow_keys = Some(KeyList::new(keys));
        self
    }

    /// Refuses these keys with a [`RateLimited`](crate::generic::RateLimited) error whose
    /// `is_denied()` is true. See [`allow_keys`](Builder::allow_keys).
    pub fn deny_keys(
        mut self,
        keys: impl IntoIterator<Item = impl std::hash::Hash + Eq + Send + Sync + 'static>,
    ) -> Self {
        self.settings.deny_keys = Some(KeyList::new(keys));
        self
    }

    /// Builds the layer for requests of type `Req`, with the in-memory store (following
    /// tokio's clock, so paused-time tests drive it).
    #[allow(clippy::type_complexity)] // the built-in store's type, spelled out for the docs
    pub fn build<Req>(
        self,
    ) -> Result<RateLimitLayer<X, MemoryStore<Option<X::Key>>, C>, ConfigError>
    where
        X: KeyExtractor<Req>,
        X::Key: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    {
        let core = self.core_in_memory::<X::Key>()?;
        Ok(RateLimitLayer { core })
    }

    /// Builds the layer for requests of type `Req` on a store of your own. Without limits
    /// given to this builder, the layer applies the policy the store was built for.
    pub fn build_with<Req, St>(self, store: St) -> Result<RateLimitLayer<X, St, C>, ConfigError>
    where
        X: KeyExtractor<Req>,
        St: Store<Option<X::Key>>,
        X::Key: 'static,
    {
        let core = self.core_with::<X::Key, _>(store)?;
        Ok(RateLimitLayer { core })
    }
}
