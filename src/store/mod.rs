//! Where per-key state lives: the [`Store`] trait and the built-in [`MemoryStore`].
//!
//! A store is bound to one [`Policy`] and answers "may this key spend `cost` now?". The
//! in-memory store answers synchronously (its [`CheckFuture`] is ready at once and never
//! allocates); a network store (Redis, feature `redis`) answers asynchronously behind the
//! same named future type.
//!
//! ```
//! use tollgate::{store::MemoryStore, Limit, Policy, Quota};
//!
//! let store = MemoryStore::new(Policy::new(Limit::token_bucket(Quota::per_second(2)?)?));
//! assert!(store.check(&"alice", 1).is_allowed());
//! assert!(store.check(&"alice", 1).is_allowed());
//! assert!(!store.check(&"alice", 1).is_allowed());
//! assert!(store.check(&"bob", 1).is_allowed()); // keys are independent
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

mod key_bytes;
pub(crate) mod map;
mod memory;
#[cfg(feature = "redis")]
pub mod redis;

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

#[cfg(feature = "redis")]
pub use self::redis::{
    BreakerState, FailurePolicy, LocalFirstStore, RedisConnection, RedisStore, RedisStoreBuilder,
    SyncTask,
};
pub use key_bytes::KeyBytes;
pub use memory::{MemoryStats, MemoryStore, DEFAULT_MAX_BYTES};

use crate::{decision::Decision, error::StoreError, Policy};

/// A keyed, policy-bound rate-limit state. See the [module docs](self).
///
/// The middleware calls it; a store's own synchronous methods (such as
/// [`MemoryStore::check`]) have other names, so importing this trait never changes what a
/// method call means.
pub trait Store<K>: Send + Sync + 'static {
    /// The policy this store enforces.
    fn policy(&self) -> &Policy;

    /// Decides for `key` and charges `cost` when admitted.
    fn decide(&self, key: &K, cost: u64) -> CheckFuture;

    /// Decides for `key` without charging anything.
    fn preview(&self, key: &K, cost: u64) -> CheckFuture;

    /// Decides and charges at once, when the store can without I/O (the memory store
    /// always can). `None`: use [`Store::decide`]. The middleware tries this first.
    fn decide_now(&self, key: &K, cost: u64) -> Option<Decision> {
        let _ = (key, cost);
        None
    }

    /// Gives back `cost` units charged earlier (a queued request dropped before its slot).
    /// Best effort: a network store sends it in the background.
    fn refund(&self, key: &K, cost: u64);
}

type BoxedCheck = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send + 'static>>;

/// The answer of a [`Store`]: ready at once for the memory store, a boxed network call
/// otherwise.
pub struct CheckFuture {
    inner: CheckInner,
}

enum CheckInner {
    Ready(Option<Result<Decision, StoreError>>),
    Boxed(BoxedCheck),
}

impl CheckFuture {
    /// An answer that is already known.
    #[inline]
    pub fn ready(result: Result<Decision, StoreError>) -> Self {
        CheckFuture {
            inner: CheckInner::Ready(Some(result)),
        }
    }

    /// An answer that needs I/O.
    pub fn boxed<F>(future: F) -> Self
    where
        F: Future<Output = Result<Decision, StoreError>> + Send + 'static,
    {
        CheckFuture {
            inner: CheckInner::Boxed(Box::pin(future)),
        }
    }

    /// Takes the answer if it is already known, so a caller can skip a poll.
    #[inline]
    pub fn take_ready(&mut self) -> Option<Result<Decision, StoreError>> {
        match &mut self.inner {
            CheckInner::Ready(r) => r.take(),
            CheckInner::Boxed(_) => None,
        }
    }
}

impl fmt::Debug for CheckFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.inner {
            CheckInner::Ready(_) => "ready",
            CheckInner::Boxed(_) => "pending",
        };
        f.debug_struct("CheckFuture")
            .field("state", &state)
            .finish()
    }
}

impl Future for CheckFuture {
    type Output = Result<Decision, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().inner {
            CheckInner::Ready(r) => Poll::Ready(r.take().unwrap_or_else(|| {
                Err(StoreError::backend("CheckFuture polled after completion"))
            })),
            CheckInner::Boxed(f) => f.as_mut().poll(cx),
        }
    }
}

impl<K, S: Store<K> + ?Sized> Store<K> for std::sync::Arc<S> {
    fn policy(&self) -> &Policy {
        (**self).policy()
    }
    fn decide(&self, key: &K, cost: u64) -> CheckFuture {
        (**self).decide(key, cost)
    }
    fn preview(&self, key: &K, cost: u64) -> CheckFuture {
        (**self).preview(key, cost)
    }
    fn refund(&self, key: &K, cost: u64) {
        (**self).refund(key, cost)
    }
    fn decide_now(&self, key: &K, cost: u64) -> Option<Decision> {
        (**self).decide_now(key, cost)
    }
}
