//! [`Builder`]: how a rate-limit layer is configured, HTTP or generic. The setters both
//! layers share are here, once; each layer adds its own (the HTTP layer's answers and
//! exemptions in `http_builder`, each layer's `select` and `build`).

use std::{fmt, sync::Arc};

use super::answer::Http;
use crate::algorithm::Limit;
use crate::core::{Core, Wording};
use crate::error::ConfigError;
use crate::options::{MissingKey, OnStoreError};
use crate::policy::{IntoPolicy, PolicySet};
use crate::quota::Quota;
use crate::ratelimit::limiter::{Limiter, Prepare, RateCore, Settings};
use crate::store::Store;

/// Configures a rate-limit layer: who is limited, how, what a request costs. Setters take
/// and return the builder; errors in limits are reported when the layer is built.
///
/// Made by [`RateLimitLayer::builder`](crate::RateLimitLayer::builder) for HTTP (with the
/// HTTP layer's setters: headers, exemptions, counting) and by
/// [`generic::RateLimitLayer::builder`](crate::generic::RateLimitLayer::builder) for any
/// tower service. `F` is the layer's kind: `Http`, or `Generic` for any service (its
/// setters are in their own blocks below).
#[must_use]
pub struct Builder<X, C, F = Http> {
    pub(crate) key: X,
    pub(crate) cost: C,
    pub(crate) settings: Settings,
    pub(crate) flavour: F,
}

impl<X: fmt::Debug, C, F> fmt::Debug for Builder<X, C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("key", &self.key)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<X, C, F> Builder<X, C, F> {
    pub(crate) fn new(key: X, cost: C, flavour: F) -> Self {
        Builder {
            key,
            cost,
            settings: Settings::default(),
            flavour,
        }
    }

    /// Who is limited: a [`KeyExtractor`](crate::key::KeyExtractor) (see [`crate::key`]).
    pub fn key<X2>(self, key: X2) -> Builder<X2, C, F> {
        Builder {
            key,
            cost: self.cost,
            settings: self.settings,
            flavour: self.flavour,
        }
    }

    /// What a request costs (default: 1 unit). See [a closure](crate::cost::Cost).
    pub fn cost<C2>(self, cost: C2) -> Builder<X, C2, F> {
        Builder {
            key: self.key,
            cost,
            settings: self.settings,
            flavour: self.flavour,
        }
    }

    fn push(mut self, limit: Result<Limit, ConfigError>) -> Self {
        self.settings.limit(limit);
        self
    }

    /// Adds a limit; several limits must all admit a request (then all are charged). With
    /// named policies, these limits apply to every one of them, first.
    pub fn limit(self, limit: Limit) -> Self {
        self.push(Ok(limit))
    }

    /// Adds every limit of a policy, or of its text (see [`Builder::limit`](crate::ratelimit::Builder::limit)):
    /// `.policy("100/s burst 200")`. A bad text is reported by `build`.
    pub fn policy(mut self, policy: impl IntoPolicy) -> Self {
        self.settings.policy(policy);
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

    /// Adds a named policy (a plan): the layer's `select` picks one per request, the first
    /// is the fallback. The limits of [`Builder::limit`](crate::ratelimit::Builder::limit) apply to every named policy too.
    /// See [`crate::policy`].
    pub fn named_policy(mut self, name: impl Into<String>, policy: impl IntoPolicy) -> Self {
        self.settings.named_policy(name.into(), policy);
        self
    }

    /// Uses a whole policy set (read from a file, say) instead of [`Builder::limit`](crate::ratelimit::Builder::limit) and
    /// [`Builder::named_policy`](crate::ratelimit::Builder::named_policy).
    pub fn policies(mut self, set: PolicySet) -> Self {
        self.settings.policies(set);
        self
    }

    /// What to do with requests that carry no key (default [`MissingKey::Reject`] with
    /// `400`: see [`MissingKey`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.settings.common.missing = missing;
        self
    }

    /// What to do when a store call fails (default [`OnStoreError::FailOpen`]).
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.settings.common.on_error = on_error;
        self
    }

    /// The layer's name in metrics and events (default `tollgate`); printable ASCII.
    pub fn label(mut self, label: &str) -> Self {
        self.settings.common.label = label.into();
        self
    }

    /// Bounds the memory of the built-in store, in bytes (default 32 MiB). A flood of keys
    /// never grows it past this: keys back to fresh go first, then those closest to it.
    /// With `build_with`, size your own store instead.
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_bytes = Some(bytes);
        self
    }

    /// The layer's state on the built-in store, keyed by `K`.
    #[allow(clippy::type_complexity)] // the built-in store's type, spelled out for the docs
    pub(crate) fn core_in_memory<K>(
        mut self,
    ) -> Result<Arc<RateCore<X, crate::store::MemoryStore<Option<K>>, C, F>>, ConfigError>
    where
        F: Prepare,
        K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    {
        let (set, store) = self.settings.memory_store()?;
        self.core::<K, _>(store, set)
    }

    /// The layer's state on a store of the user's, keyed by `K`.
    pub(crate) fn core_with<K: 'static, St>(
        mut self,
        store: St,
    ) -> Result<Arc<RateCore<X, St, C, F>>, ConfigError>
    where
        F: Prepare,
        St: Store<Option<K>>,
    {
        let set = self.settings.set_for(&store)?;
        self.core::<K, _>(store, set)
    }

    fn core<K: 'static, St>(
        self,
        store: St,
        set: PolicySet,
    ) -> Result<Arc<RateCore<X, St, C, F>>, ConfigError>
    where
        F: Prepare,
        St: Store<Option<K>>,
    {
        let common = self.settings.common.clone().build(b"", &WORDING)?;
        let part = Limiter::new::<K>(self.cost, store, self.flavour, set, self.settings)?;
        Ok(Arc::new(Core {
            key: self.key,
            common,
            part,
        }))
    }
}

/// The rate limits' words, in events (their answers are their flavours').
static WORDING: Wording = Wording {
    kind: "rate-limit",
    no_key: "No rate-limit key could be extracted from this request.",
    store_down: "The rate limiter's store is unavailable.",
};
