//! [`PolicyHandle`]: a layer's policies, swapped while requests flow.

use std::{fmt, sync::Arc};

use super::PolicySet;
use crate::error::ConfigError;

/// What a layer does with a new set: validate it against its store and selector, then
/// install it atomically.
pub(crate) trait Install: Send + Sync {
    fn install(&self, set: PolicySet) -> Result<(), ConfigError>;
    fn current(&self) -> PolicySet;
}

/// Swaps the whole policy set of a layer atomically while requests flow; cheap to clone.
/// Made by the layers' `policy_handle`.
///
/// Every key keeps its state: the next request of a key is decided under the new set,
/// from the state it had (see the [module docs](super) for how state carries over to
/// other quotas). A set that does not validate (a policy the store cannot decide, a name
/// the selector can return that the set lacks) is refused and the old set stays.
///
/// ```
/// use tollgate::{key::Global, policy::PolicySet, RateLimitLayer};
///
/// let layer = RateLimitLayer::new(Global::new(), "10/s".parse::<tollgate::Policy>()?);
/// let handle = layer.policy_handle();
/// handle.swap(PolicySet::from_text("default = 20/s")?)?;
/// assert!(handle.swap_text("default = 20/fortnight").is_err()); // the old set stays
/// assert_eq!(handle.current().names().collect::<Vec<_>>(), ["default"]);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct PolicyHandle {
    pub(super) inner: Arc<dyn Install>,
}

impl PolicyHandle {
    pub(crate) fn new(inner: Arc<dyn Install>) -> Self {
        PolicyHandle { inner }
    }

    /// Installs `set` in place of the current one, or returns why it cannot be used (the
    /// current set then stays).
    pub fn swap(&self, set: PolicySet) -> Result<(), ConfigError> {
        self.inner.install(set)
    }

    /// Parses `text` ([`PolicySet::from_text`]) and installs it; on any error the current
    /// set stays.
    pub fn swap_text(&self, text: &str) -> Result<(), ConfigError> {
        self.swap(PolicySet::from_text(text)?)
    }

    /// The set in force now.
    pub fn current(&self) -> PolicySet {
        self.inner.current()
    }
}

impl fmt::Debug for PolicyHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PolicyHandle")
            .field(&self.inner.current())
            .finish()
    }
}
