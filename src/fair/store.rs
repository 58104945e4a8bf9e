//! What a fair-sharing store is to the layer: the sealed [`FairStore`] trait.

use std::sync::Arc;

use super::share::{FairDecision, Pool, Share};
use crate::error::ConfigError;
use crate::store::{Budget, StoreFuture};

/// Where a pool and its keys' states live: [`MemoryFair`](super::MemoryFair) (the
/// default, one process) or, with the feature `redis`, `RedisFair` (shared by every
/// instance). Pass one to [`FairLimitBuilder::build_with`](super::FairLimitBuilder::build_with).
///
/// The trait is sealed: its methods are the layer's business and may change between
/// releases. See the [module docs](super).
pub trait FairStore<K>: sealed::Backend<K> + sealed::Attach {}

/// A shared store, or one chosen at run time: `Arc<dyn FairStore<K>>`.
impl<K, S: FairStore<K> + ?Sized> FairStore<K> for Arc<S> {}

impl<S: sealed::Attach + ?Sized> sealed::Attach for Arc<S> {
    fn attach(&self, pool: &Pool) -> Result<(), ConfigError> {
        (**self).attach(pool)
    }
}

impl<K, S: FairStore<K> + ?Sized> sealed::Backend<K> for Arc<S> {
    fn decide(
        &self,
        key: Option<&K>,
        pool: &Pool,
        share: &Share,
        budget: Option<&Budget>,
    ) -> StoreFuture<FairDecision> {
        (**self).decide(key, pool, share, budget)
    }
}

pub(crate) mod sealed {
    use super::{Budget, ConfigError, FairDecision, Pool, Share, StoreFuture};

    /// What a layer tells its store when it is built on it.
    pub trait Attach {
        /// A layer sharing `pool` is built on the store: refused when the store shares the
        /// pool's state with another that applies other parameters. The default accepts.
        fn attach(&self, pool: &Pool) -> Result<(), ConfigError> {
            let _ = pool;
            Ok(())
        }
    }

    /// The store's side of the layer's contract.
    pub trait Backend<K>: Send + Sync + 'static {
        /// Decides one request of `key` (`None`: the one state keyless requests share)
        /// under `share` of `pool`, atomically over the pool and the key. A network store
        /// waits at most what `budget` has left.
        fn decide(
            &self,
            key: Option<&K>,
            pool: &Pool,
            share: &Share,
            budget: Option<&Budget>,
        ) -> StoreFuture<FairDecision>;
    }
}
