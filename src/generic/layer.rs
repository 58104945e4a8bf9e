//! The generic [`RateLimitLayer`] and its [`Builder`].

use std::{fmt, sync::Arc};

use tower_layer::Layer;

use super::service::{Plain, RateLimit};
use crate::{
    algorithm::Limit,
    cost::UnitCost,
    error::ConfigError,
    key::{Global, KeyExtractor},
    layer::DefaultStore,
    limiter::{KeyList, Limiter, MissingKey, OnStoreError, Settings},
    policy::{IntoPolicy, PolicyHandle, PolicyName, PolicySet, Select},
    quota::Quota,
    store::{Store, StoreFuture},
};

/// The layer for any `tower::Service`. See the [module docs](super).
pub struct RateLimitLayer<X = Global, St = DefaultStore<()>, C = UnitCost> {
    pub(crate) limiter: Arc<Limiter<X, St, C, Plain>>,
}

impl<X, St, C> Clone for RateLimitLayer<X, St, C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<X: fmt::Debug, St, C> fmt::Debug for RateLimitLayer<X, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("generic::RateLimitLayer")
            .field(&self.limiter)
            .finish()
    }
}

impl<S, X, St, C> Layer<S> for RateLimitLayer<X, St, C> {
    type Service = RateLimit<S, X, St, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl RateLimitLayer {
    /// Starts a builder: one global limit, unit cost; pick a key with [`Builder::key`] and
    /// at least one limit.
    pub fn builder() -> Builder<Global, UnitCost> {
        Builder {
            key: Global::new(),
            cost: UnitCost,
            core: Settings::default(),
        }
    }
}

impl<X, St, C> RateLimitLayer<X, St, C> {
    /// The store, for inspection.
    pub fn store(&self) -> &St {
        &self.limiter.store
    }

    /// The policies in force.
    pub fn policies(&self) -> PolicySet {
        self.limiter.policies()
    }

    /// Forgets `key`'s state in the layer's store, under every policy: its next request
    /// finds it fresh.
    pub fn reset<K>(&self, key: K) -> StoreFuture<()>
    where
        St: Store<Option<K>>,
    {
        self.limiter.store.reset(&Some(key))
    }

    /// A handle that swaps this layer's policies while requests flow. See
    /// [`PolicyHandle`].
    pub fn policy_handle(&self) -> PolicyHandle
    where
        X: Send + Sync + 'static,
        St: Send + Sync + 'static,
        C: Send + Sync + 'static,
    {
        PolicyHandle::new(self.limiter.clone())
    }
}

/// Configures a generic [`RateLimitLayer`]: who, how, what a request costs. Setters take
/// and return the builder; errors are reported by `build`.
#[must_use]
pub struct Builder<X, C> {
    key: X,
    cost: C,
    core: Settings,
}

impl<X: fmt::Debug, C> fmt::Debug for Builder<X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("generic::Builder")
            .field("key", &self.key)
            .field("settings", &self.core)
            .finish_non_exhaustive()
    }
}

impl<X, C> Builder<X, C> {
    /// Who is limited: a [`KeyExtractor`] of the service's request type. Set it before
    /// [`Builder::select`], which wraps it.
    pub fn key<X2>(self, key: X2) -> Builder<X2, C> {
        Builder {
            key,
            cost: self.cost,
            core: self.core,
        }
    }

    /// What a request costs (default: 1 unit). See [`cost_fn`](crate::cost::cost_fn).
    pub fn cost<C2>(self, cost: C2) -> Builder<X, C2> {
        Builder {
            key: self.key,
            cost,
            core: self.core,
        }
    }

    fn push(mut self, limit: Result<Limit, ConfigError>) -> Self {
        self.core.limit(limit);
        self
    }

    /// Adds a limit; several limits must all admit a request (then all are charged). With
    /// named policies, these limits apply to every one of them, first.
    pub fn limit(self, limit: Limit) -> Self {
        self.push(Ok(limit))
    }

    /// Adds every limit of a policy, or of its text: `.policy("100/s burst 200")`. A bad
    /// text is reported by `build`.
    pub fn policy(mut self, policy: impl IntoPolicy) -> Self {
        self.core.policy(policy);
        self
    }

    /// Adds a token-bucket (GCRA) limit: bursts up to the quota's burst.
    pub fn token_bucket(self, quota: Quota) -> Self {
        self.push(Limit::token_bucket(quota))
    }

    /// Adds a strict leaky meter: the rate, evenly spaced, excess refused.
    pub fn leaky_meter(self, quota: Quota) -> Self {
        self.push(Limit::leaky_meter(quota))
    }

    /// Adds a leaky-bucket delay queue: excess waits for its slot, up to `queue` slots.
    pub fn leaky_queue(self, quota: Quota, queue: u32) -> Self {
        self.push(Limit::leaky_queue(quota, queue))
    }

    /// Adds a named policy; [`Builder::select`] picks one per request, the first is the
    /// fallback. See [`crate::policy`].
    pub fn named_policy(mut self, name: impl Into<String>, policy: impl IntoPolicy) -> Self {
        self.core.named_policy(name.into(), policy);
        self
    }

    /// Uses a whole policy set instead of [`Builder::limit`] and [`Builder::named_policy`].
    pub fn policies(mut self, set: PolicySet) -> Self {
        self.core.policies(set);
        self
    }

    /// Picks, per request, which named policy applies, from the request and its key. See
    /// the HTTP builder's [`select`](crate::Builder::select).
    pub fn select<F, N, K, Req>(mut self, select: F) -> Builder<Select<X, F, N>, C>
    where
        F: Fn(&Req, Option<&K>) -> N,
        N: PolicyName,
    {
        self.core.names = N::all_names();
        Builder {
            key: Select {
                key: self.key,
                select,
                _name: std::marker::PhantomData,
            },
            cost: self.cost,
            core: self.core,
        }
    }

    /// What to do with requests that carry no key (default [`MissingKey::Shared`];
    /// `Reject`'s status is not used: the refusal is [`KeyMissing`](super::KeyMissing)).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.core.missing = missing;
        self
    }

    /// What to do when a store call fails (default [`OnStoreError::FailOpen`]).
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.core.on_error = on_error;
        self
    }

    /// Never limits these keys (an internal caller's): the keys are of the type the
    /// extractor returns; another type is reported by `build`.
    pub fn allow_keys<K, I>(mut self, keys: I) -> Self
    where
        K: std::hash::Hash + Eq + Send + Sync + 'static,
        I: IntoIterator<Item = K>,
    {
        self.core.allow_keys = Some(KeyList::new(keys));
        self
    }

    /// Refuses these keys with [`Denied`](crate::error::Denied). See
    /// [`Builder::allow_keys`].
    pub fn deny_keys<K, I>(mut self, keys: I) -> Self
    where
        K: std::hash::Hash + Eq + Send + Sync + 'static,
        I: IntoIterator<Item = K>,
    {
        self.core.deny_keys = Some(KeyList::new(keys));
        self
    }

    /// The layer's name in metrics and events (default `tollgate`).
    pub fn label(mut self, label: &str) -> Self {
        self.core.label = label.into();
        self
    }

    /// Bounds the memory of the built-in store, in bytes (default 32 MiB).
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.core.max_bytes = Some(bytes);
        self
    }

    fn finish<K: 'static, St>(
        self,
        store: St,
        set: PolicySet,
    ) -> Result<RateLimitLayer<X, St, C>, ConfigError>
    where
        St: Store<Option<K>>,
    {
        let limiter = Limiter::new::<K>(self.key, self.cost, store, Plain, set, self.core)?;
        Ok(RateLimitLayer {
            limiter: Arc::new(limiter),
        })
    }

    /// Builds the layer for requests of type `Req`, with the in-memory store (following
    /// tokio's clock, so paused-time tests drive it).
    pub fn build<Req>(mut self) -> Result<RateLimitLayer<X, DefaultStore<X::Key>, C>, ConfigError>
    where
        X: KeyExtractor<Req>,
        X::Key: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    {
        let (set, store) = self.core.memory_store()?;
        self.finish::<X::Key, _>(store, set)
    }

    /// Builds the layer for requests of type `Req` on a store of your own. Without limits
    /// given to this builder, the layer applies the policy the store was built for.
    pub fn build_with<Req, St>(mut self, store: St) -> Result<RateLimitLayer<X, St, C>, ConfigError>
    where
        X: KeyExtractor<Req>,
        St: Store<Option<X::Key>>,
        X::Key: 'static,
    {
        let set = self.core.set_for(&store)?;
        self.finish::<X::Key, _>(store, set)
    }
}
