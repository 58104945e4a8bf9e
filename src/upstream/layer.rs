//! [`UpstreamLayer`] and its [`UpstreamBuilder`]; the layer's own doors for work that is
//! not a request through it (a job's turn, a pause heard elsewhere) and its retry policy.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use tower::retry::budget::TpsBudget;
use tower_layer::Layer;

use super::pacer::{pause_limit, Call, Pacer, Shared};
use super::retry::RetryAfter;
use super::service::Upstream;
use crate::algorithm::Limit;
use crate::core::{CommonOptions, Core, Wording};
use crate::error::{BoxError, ConfigError};
use crate::key::{Host, KeyBytes, KeyExtractor, MissingKey};
use crate::options::OnStoreError;
use crate::policy::IntoPolicy;
use crate::policy::Policy;
use crate::store::{MemoryStore, Store, StoreFuture};

static WORDING: Wording = Wording {
    kind: "upstream limit",
    no_key: "the call names no upstream to limit it by",
    store_down: "the upstream limit's store is unavailable",
};

/// How long a call waits for its slot by default.
const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(30);

/// The longest pause an upstream is obeyed for by default.
const DEFAULT_MAX_PAUSE: Duration = Duration::from_secs(15 * 60);

/// The layer for an outbound client: calls wait for their slot under the limits the
/// upstream announces and the pauses it asks for (and the limits you configure); on a
/// shared store, every instance obeys together. See the [module docs](super).
pub struct UpstreamLayer<X = Host, St = MemoryStore<Option<String>>> {
    core: Arc<Core<X, Pacer<St>>>,
}

impl<X, St> Clone for UpstreamLayer<X, St> {
    fn clone(&self) -> Self {
        UpstreamLayer {
            core: Arc::clone(&self.core),
        }
    }
}

impl<X: fmt::Debug, St> fmt::Debug for UpstreamLayer<X, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamLayer")
            .field("key", &self.core.key)
            .field("label", &self.core.common.label)
            .finish_non_exhaustive()
    }
}

impl<S, X, St> Layer<S> for UpstreamLayer<X, St> {
    type Service = Upstream<S, X, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Upstream::new(inner, &self.core)
    }
}

impl UpstreamLayer {
    /// Starts a builder: partitions by [`Host`], no limit of its own, callers waiting up
    /// to 30 s, pauses obeyed up to 15 minutes.
    pub fn builder() -> UpstreamBuilder<Host> {
        UpstreamBuilder {
            key: Host::new(),
            common: CommonOptions::new("upstream"),
            limits: Vec::new(),
            max_wait: DEFAULT_MAX_WAIT,
            max_pause: DEFAULT_MAX_PAUSE,
            max_bytes: None,
        }
    }
}

impl<X, St> UpstreamLayer<X, St> {
    /// The store, for inspection.
    pub fn store(&self) -> &St {
        &self.core.part.shared.store
    }

    /// A `tower::retry` policy that retries a `429` or `503` once the upstream's
    /// `Retry-After` has passed (1 s when it sends none), within `budget`; a wait longer
    /// than the layer's `max_wait` is not retried. Each retry waits for a slot of this
    /// layer, and what the refusal said is learned by it, so put the retry layer inside
    /// this one: limiter, retry, timeout, client. Requests are cloned for a retry: their
    /// body must be `Clone` (a buffered body).
    pub fn retry_policy(&self, budget: TpsBudget) -> RetryAfter<X, St> {
        RetryAfter::new(&self.core, budget)
    }

    /// Waits for `key`'s turn (for work that is not a request through the layer: a job),
    /// up to the layer's `max_wait`, and takes it.
    ///
    /// # Errors
    ///
    /// A [`RateLimited`](crate::generic::RateLimited) with the time to wait when no turn
    /// comes within `max_wait`; a [`StoreError`](crate::error::StoreError) when the store
    /// fails under [`OnStoreError::FailClosed`].
    pub async fn acquire<K>(&self, key: K) -> Result<(), BoxError>
    where
        St: Store<Option<K>>,
        K: KeyBytes + Clone + Send + Sync + 'static,
    {
        let shared = &self.core.part.shared;
        let call = Call::new(shared, Some(key), self.core.common.on_error());
        Arc::new(call).acquire().await
    }

    /// Pauses `key` for `pause` (at most the layer's `max_pause`): what an upstream asked
    /// for in an answer the layer did not see (a job's SDK reporting a rate limit). On a
    /// shared store every instance pauses.
    pub fn pause<K>(&self, key: K, pause: Duration) -> StoreFuture<()>
    where
        St: Store<Option<K>>,
        K: KeyBytes + Clone + Send + Sync + 'static,
    {
        self.core.part.shared.pause(&Some(key), pause)
    }
}

/// Configures an [`UpstreamLayer`]; made by [`UpstreamLayer::builder`]. Setters take and
/// return the builder; `build` checks the result.
#[derive(Debug)]
#[must_use]
pub struct UpstreamBuilder<X> {
    key: X,
    common: CommonOptions,
    limits: Vec<Result<Limit, ConfigError>>,
    max_wait: Duration,
    max_pause: Duration,
    max_bytes: Option<usize>,
}

impl<X> UpstreamBuilder<X> {
    /// How calls are partitioned: each partition has its own pauses and quotas (default
    /// [`Host`]; an API key or a tenant with [`key_fn`](crate::key::key_fn)). The key
    /// must be [`KeyBytes`], to be named in a shared store.
    pub fn key<X2>(self, key: X2) -> UpstreamBuilder<X2> {
        UpstreamBuilder {
            key,
            common: self.common,
            limits: self.limits,
            max_wait: self.max_wait,
            max_pause: self.max_pause,
            max_bytes: self.max_bytes,
        }
    }

    /// Adds limits of your own (a policy or its text: `"10/s, 5000/day"`), applied
    /// besides what the upstream announces: the tighter wins. At most three limits; a bad
    /// text is reported by `build`.
    pub fn policy(mut self, policy: impl IntoPolicy) -> Self {
        match policy.into_policy() {
            Ok(p) => self.limits.extend(p.limits().iter().cloned().map(Ok)),
            Err(e) => self.limits.push(Err(e)),
        }
        self
    }

    /// The longest a call waits for its slot (default 30 s): a call whose slot is further
    /// away is not sent, and fails at once with the time to wait. Zero: never wait.
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.max_wait = wait;
        self
    }

    /// The longest pause obeyed (default 15 minutes): a `Retry-After` or a reset further
    /// away pauses this long, then calls find out again.
    pub fn max_pause(mut self, pause: Duration) -> Self {
        self.max_pause = pause;
        self
    }

    /// The limit's name in metrics and logs (default `upstream`); printable ASCII.
    pub fn label(mut self, label: &str) -> Self {
        self.common.label = label.into();
        self
    }

    /// What to do with a call the key extractor finds no key in (default
    /// [`MissingKey::Reject`]: a [`RateLimited`](crate::generic::RateLimited) error whose
    /// `is_key_missing()` is true).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.common.missing = missing;
        self
    }

    /// What to do when a shared store fails (default [`OnStoreError::FailOpen`]: the call
    /// is sent without waiting).
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.common.on_error = on_error;
        self
    }

    /// Bounds the memory of the built-in store, in bytes (default 32 MiB).
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    /// Builds the layer for `http::Request`s with the in-memory store (this process's
    /// calls only).
    ///
    /// # Errors
    ///
    /// A bad policy text or label, more than three limits, or a memory budget that holds
    /// no key.
    pub fn build<K>(self) -> Result<UpstreamLayer<X, MemoryStore<Option<K>>>, ConfigError>
    where
        X: KeyExtractor<Request<()>, Key = K>,
        K: KeyBytes + std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    {
        let label = self.common.label.clone();
        let store = MemoryStore::for_layer(Policy::new(pause_limit()?), &label, self.max_bytes)?;
        let limits = self.given_limits()?;
        self.build_on(store, limits)
    }

    /// Builds the layer on `store`: a [`RedisStore`](crate::store::RedisStore) (feature
    /// `redis`) shares pauses and quotas with every instance and worker using a store of
    /// the same name. Without a [`policy`](Self::policy) of the builder's, the layer
    /// applies the policy the store was built for (the upstream's documented limit, say).
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build), and a store that cannot decide the limits.
    pub fn build_with<K, St>(self, store: St) -> Result<UpstreamLayer<X, St>, ConfigError>
    where
        X: KeyExtractor<Request<()>, Key = K>,
        St: Store<Option<K>>,
    {
        let limits = if self.limits.is_empty() {
            store
                .default_policy()
                .map(|p| p.limits().to_vec())
                .unwrap_or_default()
        } else {
            self.given_limits()?
        };
        self.build_on(store, limits)
    }

    /// The limits given with [`policy`](Self::policy), or the first bad text's error.
    fn given_limits(&self) -> Result<Vec<Limit>, ConfigError> {
        self.limits.iter().cloned().collect()
    }

    fn build_on<K, St>(
        self,
        store: St,
        limits: Vec<Limit>,
    ) -> Result<UpstreamLayer<X, St>, ConfigError>
    where
        St: Store<Option<K>>,
    {
        let common = self.common.build(b"", &WORDING)?;
        let shared = Shared::new::<K>(
            store,
            limits,
            self.max_wait,
            self.max_pause,
            Arc::clone(&common.label),
        )?;
        Ok(UpstreamLayer {
            core: Arc::new(Core {
                key: self.key,
                common,
                part: Pacer {
                    shared: Arc::new(shared),
                },
            }),
        })
    }
}
