#![doc = include_str!("../docs/stores.md")]

mod budget;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
pub(crate) mod map;
mod memory;
#[cfg(feature = "redis")]
pub mod redis;
mod tables;
pub(crate) mod tags;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

#[cfg(feature = "redis")]
pub use self::redis::BreakerState;
#[cfg(feature = "redis")]
pub use self::redis::FailurePolicy;
#[cfg(feature = "redis")]
pub use self::redis::LocalFirstStore;
#[cfg(feature = "redis")]
pub use self::redis::RedisBuilder;
#[cfg(feature = "redis")]
pub use self::redis::RedisConnection;
#[cfg(feature = "redis")]
pub use self::redis::RedisStore;
pub use crate::options::OnStoreError;
pub use budget::Budget;
pub use memory::MemoryStore;
#[cfg(feature = "redis")]
pub(crate) use memory::DEFAULT_MAX_BYTES;
pub use tables::MemoryStats;
pub(crate) use tables::{Digest, SipKeys};

use crate::{decision::Decision, error::StoreError, policy::Policy, policy::PolicySet};

/// Where per-key state lives: decides for a key under a policy. See the
/// [module docs](self).
///
/// Implement it for a backend of your own from [`Policy`]'s pure functions, and run
/// `store::conformance::check` (feature `conformance`) on it: it must decide exactly as
/// [`MemoryStore`] does ([your own store](self#your-own-store)).
///
/// Every call names its policy: a layer picks one per request (plans) and swaps them while
/// requests flow, and a key keeps one state across them (see [`crate::policy`]). The
/// middleware calls this trait; a store's own convenience methods (such as
/// [`MemoryStore::check`]) have other names, so importing it never changes what a method
/// call means.
pub trait Store<K>: Send + Sync + 'static {
    /// Whether this store can decide `policy` exactly (a network store may refuse some
    /// quotas). Layers call it for every policy when they are built and when their
    /// policies are swapped; the default accepts every policy.
    fn supports(&self, policy: &Policy) -> Result<(), crate::error::ConfigError> {
        let _ = policy;
        Ok(())
    }

    /// The policy the store was built for, if any: what a layer given no limit of its own
    /// applies ([`Builder::build_with`](crate::ratelimit::Builder::build_with)).
    fn default_policy(&self) -> Option<Policy> {
        None
    }

    /// Decides for `key` under `policy` and charges `cost` when admitted.
    fn decide(&self, key: &K, policy: &Policy, cost: u64) -> StoreFuture<Decision>;

    /// [`Store::decide`] for a request that may wait at most what `budget` has left for
    /// its stores (a request through several layers backed by network stores waits one
    /// deadline in all). A network store calls with at most [`Budget::allow`] and counts
    /// its wait with [`Budget::spend`]; the default ignores the budget.
    fn decide_within(
        &self,
        key: &K,
        policy: &Policy,
        cost: u64,
        budget: &Budget,
    ) -> StoreFuture<Decision> {
        let _ = budget;
        self.decide(key, policy, cost)
    }

    /// Decides for `key` under `policy` without charging anything.
    fn preview(&self, key: &K, policy: &Policy, cost: u64) -> StoreFuture<Decision>;

    /// Decides and charges at once, when the store can without I/O (the memory store
    /// always can). `None`: use [`Store::decide`]. The middleware tries this first.
    fn decide_now(&self, key: &K, policy: &Policy, cost: u64) -> Option<Decision> {
        let _ = (key, policy, cost);
        None
    }

    /// Gives back `cost` units charged earlier (a queued request dropped before its slot).
    /// Best effort: a network store sends it in the background.
    fn refund(&self, key: &K, policy: &Policy, cost: u64);

    /// Settles a request charged `reserved` units whose real cost turned out to be
    /// `actual` (counted only when it failed, measured from its response): the difference
    /// is charged without a check (the key may go over its limit, and then waits it out)
    /// or given back. The answer says when the store has applied it.
    fn settle(&self, key: &K, policy: &Policy, reserved: u64, actual: u64) -> StoreFuture<()>;

    /// Refuses `key` under `policy` for `ban` from now (a ban after too many failures):
    /// every enforced token-bucket, meter or queue limit of the policy is made to admit
    /// nothing before then, and a refusal's retry-after counts down to it.
    fn ban(&self, key: &K, policy: &Policy, ban: std::time::Duration) -> StoreFuture<()>;

    /// Forgets `key`'s state under every policy: its next request finds it fresh (a
    /// customer unbanned, a test reset). The answer says when the store has applied it.
    fn reset(&self, key: &K) -> StoreFuture<()>;

    /// Called when a layer starts applying `set` (built, or swapped); an error refuses the
    /// layer (or the swap, leaving the old set in force). A store that carries a key's
    /// state across policies uses it to tell a request begun before a swap (still under the
    /// old set) from a change of plan: the first is charged to the state as the new set
    /// wrote it, instead of converting it back. A Redis store checks that no other store
    /// sharing its keys applies other limits. The default accepts every set.
    fn policies_installed(&self, set: &PolicySet) -> Result<(), crate::error::ConfigError> {
        let _ = set;
        Ok(())
    }
}

type Boxed<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'static>>;

/// The answer of a [`Store`]: ready at once for the memory store, a boxed network call
/// otherwise.
pub struct StoreFuture<T> {
    inner: Inner<T>,
}

/// The answer to a decision: see [`StoreFuture`].
pub(crate) type CheckFuture = StoreFuture<Decision>;

enum Inner<T> {
    Ready(Option<Result<T, StoreError>>),
    Boxed(Boxed<T>),
}

impl<T> StoreFuture<T> {
    /// An answer that is already known.
    #[inline]
    pub fn ready(result: Result<T, StoreError>) -> Self {
        StoreFuture {
            inner: Inner::Ready(Some(result)),
        }
    }

    /// An answer that needs I/O.
    pub fn boxed<F>(future: F) -> Self
    where
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        StoreFuture {
            inner: Inner::Boxed(Box::pin(future)),
        }
    }

    /// Takes the answer if it is already known, so a caller can skip a poll.
    #[inline]
    pub fn take_ready(&mut self) -> Option<Result<T, StoreError>> {
        match &mut self.inner {
            Inner::Ready(r) => r.take(),
            Inner::Boxed(_) => None,
        }
    }

    /// Runs the answer to completion in the background when it needs I/O (inside a tokio
    /// runtime; outside one it is dropped), logging a failure at `debug`: for updates a
    /// request does not wait for (a settled cost).
    pub(crate) fn detach(mut self, what: &'static str)
    where
        T: Send + 'static,
    {
        if self.take_ready().is_some() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = self.await {
                    tracing::debug!(target: "tollgate", error = %e, "{what} not applied by the store");
                }
            });
        }
    }
}

impl<T> fmt::Debug for StoreFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.inner {
            Inner::Ready(_) => "ready",
            Inner::Boxed(_) => "pending",
        };
        f.debug_struct("StoreFuture")
            .field("state", &state)
            .finish()
    }
}

impl<T> Future for StoreFuture<T> {
    type Output = Result<T, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // No field is pinned: the boxed future is pinned in its box.
        match &mut Pin::into_inner(self).inner {
            Inner::Ready(r) => Poll::Ready(r.take().unwrap_or_else(|| {
                Err(StoreError::backend("StoreFuture polled after completion"))
            })),
            Inner::Boxed(f) => f.as_mut().poll(cx),
        }
    }
}

impl<T> Unpin for StoreFuture<T> {}

impl<K, S: Store<K> + ?Sized> Store<K> for std::sync::Arc<S> {
    fn supports(&self, policy: &Policy) -> Result<(), crate::error::ConfigError> {
        (**self).supports(policy)
    }
    fn default_policy(&self) -> Option<Policy> {
        (**self).default_policy()
    }
    fn decide(&self, key: &K, policy: &Policy, cost: u64) -> CheckFuture {
        (**self).decide(key, policy, cost)
    }
    fn decide_within(&self, key: &K, policy: &Policy, cost: u64, budget: &Budget) -> CheckFuture {
        (**self).decide_within(key, policy, cost, budget)
    }
    fn preview(&self, key: &K, policy: &Policy, cost: u64) -> CheckFuture {
        (**self).preview(key, policy, cost)
    }
    fn refund(&self, key: &K, policy: &Policy, cost: u64) {
        (**self).refund(key, policy, cost)
    }
    fn decide_now(&self, key: &K, policy: &Policy, cost: u64) -> Option<Decision> {
        (**self).decide_now(key, policy, cost)
    }
    fn policies_installed(&self, set: &PolicySet) -> Result<(), crate::error::ConfigError> {
        (**self).policies_installed(set)
    }
    fn settle(&self, key: &K, policy: &Policy, reserved: u64, actual: u64) -> StoreFuture<()> {
        (**self).settle(key, policy, reserved, actual)
    }
    fn reset(&self, key: &K) -> StoreFuture<()> {
        (**self).reset(key)
    }
    fn ban(&self, key: &K, policy: &Policy, ban: std::time::Duration) -> StoreFuture<()> {
        (**self).ban(key, policy, ban)
    }
}
