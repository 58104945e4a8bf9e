//! [`FairLimitLayer`] and its [`FairLimitBuilder`]. One layer value is one pool, shared by
//! every clone and every route it is applied to.

use std::{fmt, sync::Arc, time::Duration};

use http::Request;

use tower_layer::Layer;

use super::answer::{FairReplies, WORDING};
use super::memory::MemoryFair;
use super::service::{FairLimit, Shares, Sharing};
use super::share::{Pool, Share};
use super::store::sealed::Attach;
use crate::core::{CommonOptions, Core};
use crate::error::ConfigError;
use crate::key::{Global, KeyExtractor, RequestHead};
use crate::options::{MissingKey, OnStoreError};
use crate::quota::Quota;

/// Shares a pool among the keys of `key` (HTB-style fair sharing with borrowing):
/// `.layer(FairLimitLayer::builder(..).share(..).build()?)` on an axum `Router`, a route,
/// or any tower HTTP service (a tonic server included). See the [module docs](super).
///
/// One layer value is one pool: every service it makes and every clone shares it.
pub struct FairLimitLayer<X = Global, St = MemoryFair<()>> {
    core: Arc<Core<X, Sharing<St>>>,
}

impl<X, St> Clone for FairLimitLayer<X, St> {
    fn clone(&self) -> Self {
        FairLimitLayer {
            core: Arc::clone(&self.core),
        }
    }
}

impl<S, X, St> Layer<S> for FairLimitLayer<X, St> {
    type Service = FairLimit<S, X, St>;

    fn layer(&self, inner: S) -> Self::Service {
        FairLimit::new(inner, &self.core)
    }
}

impl<X: fmt::Debug, St: fmt::Debug> fmt::Debug for FairLimitLayer<X, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.core;
        f.debug_struct("FairLimitLayer")
            .field("key", &s.key)
            .field("pool", &s.part.pool_quota)
            .field("label", &s.common.label)
            .field("store", &s.part.store)
            .finish_non_exhaustive()
    }
}

impl FairLimitLayer {
    /// A builder for a pool of `pool` (its rate and burst: the most every key together
    /// is admitted) shared among the keys of `key`. Set each key's
    /// [`share`](FairLimitBuilder::share), then build.
    pub fn builder<X>(key: X, pool: Quota) -> FairLimitBuilder<X> {
        FairLimitBuilder {
            key,
            common: CommonOptions::new("fair"),
            pool,
            shares: None,
            period: Duration::from_secs(1),
        }
    }
}

/// Builds a [`FairLimitLayer`]. Made by [`FairLimitLayer::builder`].
#[must_use]
pub struct FairLimitBuilder<X> {
    key: X,
    common: CommonOptions,
    pool: Quota,
    shares: Option<Shares>,
    period: Duration,
}

impl<X: fmt::Debug> fmt::Debug for FairLimitBuilder<X> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairLimitBuilder")
            .field("key", &self.key)
            .field("pool", &self.pool)
            .field("label", &self.common.label)
            .finish_non_exhaustive()
    }
}

impl<X> FairLimitBuilder<X> {
    /// Every key's share: its guaranteed rate and its ceiling.
    pub fn share(mut self, share: Share) -> Self {
        self.shares = Some(Shares::One(share));
        self
    }

    /// Chooses each request's share from its head (a plan an auth layer inserted, a
    /// header's prefix). Keys weigh in the sharing by their guaranteed rates.
    ///
    /// ```
    /// use tollgate::{fair::Share, key::HeaderKey, FairLimitLayer, Quota};
    ///
    /// let free = Share::new(Quota::per_second(2)?, Quota::per_second(10)?)?;
    /// let pro = Share::new(Quota::per_second(6)?, Quota::per_second(20)?)?;
    /// let layer = FairLimitLayer::builder(HeaderKey::new("x-api-key")?, Quota::per_second(40)?)
    ///     .share_by(move |head| match head.headers().get("x-api-key") {
    ///         Some(k) if k.as_bytes().starts_with(b"pro_") => pro,
    ///         _ => free,
    ///     })
    ///     .build()?;
    /// # let _: axum::Router = axum::Router::new().layer(layer);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn share_by<F>(mut self, share: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> Share + Send + Sync + 'static,
    {
        self.shares = Some(Shares::By(Box::new(share)));
        self
    }

    /// The limit's name: in the `RateLimit` / `RateLimit-Policy` items, the problem body's
    /// `violated-policies`, the logs and the metrics. Default `fair`; printable ASCII,
    /// without braces (it is the pool's Redis hash tag).
    pub fn label(mut self, label: &str) -> Self {
        self.common.label = label.into();
        self
    }

    /// What to do with a request without a key (default [`MissingKey::Reject`] with `400`:
    /// see [`MissingKey`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.common.missing = missing;
        self
    }

    /// What to do when a shared store fails (default [`OnStoreError::FailOpen`]: the
    /// request goes through unlimited). The memory stores never fail.
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.common.on_error = on_error;
        self
    }

    /// How long a key counts as asking for its share after it last asked: at most until
    /// the end of the next activity period of this length (default 1 s; whole microseconds
    /// between 1 ms and a day). Shorter periods follow changes of who is asking sooner;
    /// a key asking less often than once per period is sometimes left out of the count
    /// (its share is then larger for a while, and the others' smaller).
    pub fn activity_period(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// Builds the layer on an in-memory store of its own. Refuses a missing share, a
    /// pool or activity period out of range, and a label that cannot be sent in a header.
    pub fn build(self) -> Result<FairLimitLayer<X, MemoryFair<X::Key>>, ConfigError>
    where
        X: KeyExtractor<Request<()>>,
    {
        self.build_with(MemoryFair::new())
    }

    /// Builds the layer on `store` ([`MemoryFair`] with a clock or a budget of your own,
    /// or `RedisFair` to share the pool across instances).
    pub fn build_with<St: Attach>(self, store: St) -> Result<FairLimitLayer<X, St>, ConfigError> {
        // Without braces: the label is the pool's Redis hash tag.
        let common = self.common.build(b"{}", &WORDING)?;
        let shares = self.shares.ok_or_else(|| {
            ConfigError::Fair("no share: call FairLimitBuilder::share or share_by".into())
        })?;
        let pool = Pool::new(&common.label, self.pool, self.period)?;
        store.attach(&pool)?;
        let one = match &shares {
            Shares::One(s) => Some(s),
            Shares::By(_) => None,
        };
        let replies = Arc::new(FairReplies::new(&common.label, one));
        Ok(FairLimitLayer {
            core: Arc::new(Core {
                key: self.key,
                common,
                part: Sharing {
                    store,
                    pool,
                    pool_quota: self.pool,
                    shares,
                    replies,
                },
            }),
        })
    }
}
