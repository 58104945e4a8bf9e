//! What an in-flight store is to the layer: the sealed [`InFlightStore`] trait, the permit
//! a request holds, and what an attempt to take a slot gives.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::error::{ConfigError, StoreError};
use crate::observe::Held;
use crate::store::Budget;

/// Where the in-flight counts live: [`MemoryInFlight`](super::MemoryInFlight) (the
/// default, one process) or, with the feature `redis`, `RedisInFlight` (shared by every
/// instance). Pass one to [`InFlightLimitBuilder::build_with`](super::InFlightLimitBuilder::build_with).
///
/// The trait is sealed: its methods are the layer's business and may change between
/// releases. See the [module docs](super).
pub trait InFlightStore<K>: sealed::Backend<K> + sealed::Attach {}

/// A shared store, or one chosen at run time: `Arc<dyn InFlightStore<K>>`.
impl<K, S: InFlightStore<K> + ?Sized> InFlightStore<K> for Arc<S> {}

impl<S: sealed::Attach + ?Sized> sealed::Attach for Arc<S> {
    fn attach(&self, limits: &Limits) -> Result<(), ConfigError> {
        (**self).attach(limits)
    }
}

impl<K, S: InFlightStore<K> + ?Sized> sealed::Backend<K> for Arc<S> {
    fn acquire(&self, key: Option<K>, limits: &Limits, budget: Option<&Budget>) -> Attempt {
        (**self).acquire(key, limits, budget)
    }
}

pub(crate) mod sealed {
    use super::{Attempt, Budget, ConfigError, Limits};

    /// What a layer tells its store when it is built on it.
    pub trait Attach {
        /// A layer applying `limits` is built on the store: refused when the store shares
        /// its counts with another that applies other limits. The default accepts.
        fn attach(&self, limits: &Limits) -> Result<(), ConfigError> {
            let _ = limits;
            Ok(())
        }
    }

    /// The store's side of the layer's contract.
    pub trait Backend<K>: Send + Sync + 'static {
        /// Tries to take a slot for `key` (`None`: the shared slot set of keyless
        /// requests): at once, or after waiting in the key's queue. A network store's
        /// first call waits at most what `budget` has left.
        fn acquire(&self, key: Option<K>, limits: &Limits, budget: Option<&Budget>) -> Attempt;
    }
}

/// A layer's limit, as the store applies it.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The most requests of one key in flight at once (0 refuses every request).
    pub(crate) max: u32,
    /// The most requests of one key waiting for a slot.
    pub(crate) queue: u32,
    /// The longest a request waits for its slot.
    pub(crate) max_wait: Duration,
}

/// Gives a slot back when dropped.
pub(crate) trait Release: Send + Sync + 'static {
    fn release(&self, slot: u64);
}

/// A slot held by one request, from its admission until its response body ends or is
/// dropped: dropping the permit gives the slot back. No allocation: a shared pointer to
/// the store's state and the slot's index in it.
pub struct Permit {
    owner: Arc<dyn Release>,
    slot: u64,
    /// The slot's place in the active-leases gauge, given back after the slot.
    lease: Option<Held>,
}

impl Permit {
    pub(crate) fn new(owner: Arc<dyn Release>, slot: u64) -> Self {
        Permit {
            owner,
            slot,
            lease: None,
        }
    }

    /// The same permit, counted in the gauge of slots held until it drops.
    pub(crate) fn leased(mut self, lease: Held) -> Self {
        self.lease = Some(lease);
        self
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.owner.release(self.slot);
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit").field("slot", &self.slot).finish()
    }
}

/// What an attempt to take a slot came to: a slot, or none (and why).
#[derive(Debug)]
pub enum Acquired {
    /// A slot is held (`remaining`: the key's free slots after this one).
    Admitted { permit: Permit, remaining: u32 },
    /// Every slot is taken and the queue is full, or the wait ran out.
    Full,
    /// The store could not answer (the layer's `OnStoreError` decides).
    Failed(StoreError),
}

/// A pending attempt: a request waiting in a key's queue, or a network store's call.
/// Boxed: only queued requests and network stores take this path.
pub struct Acquiring(Pin<Box<dyn Future<Output = Acquired> + Send>>);

impl Acquiring {
    pub(crate) fn new(future: impl Future<Output = Acquired> + Send + 'static) -> Self {
        Acquiring(Box::pin(future))
    }
}

impl fmt::Debug for Acquiring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Acquiring")
    }
}

impl Future for Acquiring {
    type Output = Acquired;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Acquired> {
        self.0.as_mut().poll(cx)
    }
}

/// The answer to [`sealed::Backend::acquire`].
#[derive(Debug)]
pub enum Attempt {
    /// Decided at once.
    Now(Acquired),
    /// Decided later.
    Later(Acquiring),
}
