//! What every layer shares: what to do with a request that has no key
//! ([`MissingKey`]), what to do when the store fails ([`OnStoreError`]), and lists of keys
//! never limited or always refused.

use std::any::{Any, TypeId};
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use http::StatusCode;

use crate::error::ConfigError;

/// What to do with a request from which no key can be extracted: a missing header, a body
/// without the field the login recipe reads, a server started without the connection
/// address. Never silently shared or unlimited unless you choose so.
///
/// The default refuses such a request with `400 Bad Request` (and a problem body; a gRPC
/// request gets `INVALID_ARGUMENT`): a request the limiter cannot tell apart from the
/// others is answered at once, visibly, instead of being limited together with every
/// other such request (one client exhausting the bucket for all of them) or let through
/// unlimited (a way around the limit). When the extractor knows the key is missing
/// because the server is not set up for it (no connection address, no matched route), the
/// layer also logs a warning once saying what is missing.
///
/// ```
/// use http::StatusCode;
/// use tollgate::key::MissingKey;
///
/// assert_eq!(MissingKey::default(), MissingKey::Reject(StatusCode::BAD_REQUEST));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// All keyless requests share one bucket of the same limit: a missing `x-api-key` is
    /// limited like one anonymous client. Choose it only where every keyless request may
    /// count against one budget: one client without a key exhausts it for all the others.
    Shared,
    /// Refuse keyless requests (the default, with `400`): with this status and a problem
    /// body on HTTP, with a [`RateLimited`](crate::generic::RateLimited) error on the
    /// generic layer (`is_key_missing()`). A `401` must carry `WWW-Authenticate` (RFC
    /// 9110): add it in your auth layer, which knows the scheme (see the
    /// `authenticated_user` example).
    Reject(StatusCode),
    /// Let keyless requests through unlimited.
    Allow,
}

impl Default for MissingKey {
    /// `Reject(400)`: see the [type's docs](MissingKey).
    fn default() -> Self {
        MissingKey::Reject(StatusCode::BAD_REQUEST)
    }
}

/// What to do when the store fails (a custom store returned an error). The Redis store
/// applies its own failure policy and does not return errors here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnStoreError {
    /// Admit the request. The default, as at Stripe and in Envoy: a limiter outage must
    /// not become an API outage.
    #[default]
    FailOpen,
    /// Refuse it: `503` with a `temporary-reduced-capacity` problem body for HTTP, a
    /// [`StoreError`](crate::error::StoreError) for the generic middleware.
    FailClosed,
}

/// Whether a key (of the list's type) is on the list.
type Contains = dyn Fn(&dyn Any) -> bool + Send + Sync;

/// The key type something was given for (a key list, a selector), checked against the
/// type the layer's extractor gives when the layer is built.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyType {
    id: TypeId,
    name: &'static str,
}

impl KeyType {
    pub(crate) fn of<K: 'static>() -> Self {
        KeyType {
            id: TypeId::of::<K>(),
            name: std::any::type_name::<K>(),
        }
    }

    /// `Ok` when the layer's keys are of this type; else `error` of this type's name and
    /// the layer's.
    pub(crate) fn check<K: 'static>(
        self,
        error: impl FnOnce(&str, &str) -> ConfigError,
    ) -> Result<(), ConfigError> {
        if self.id == TypeId::of::<K>() {
            return Ok(());
        }
        Err(error(self.name, std::any::type_name::<K>()))
    }
}

/// A list of keys (allowed or denied) for a key type fixed when it was given, matched
/// without the limiter knowing that type.
#[derive(Clone)]
pub(crate) struct KeyList {
    key_type: KeyType,
    contains: Arc<Contains>,
}

impl KeyList {
    pub(crate) fn new<K, I>(keys: I) -> Self
    where
        K: Hash + Eq + Send + Sync + 'static,
        I: IntoIterator<Item = K>,
    {
        let set: std::collections::HashSet<K> = keys.into_iter().collect();
        KeyList {
            key_type: KeyType::of::<K>(),
            contains: Arc::new(move |k| k.downcast_ref::<K>().is_some_and(|k| set.contains(k))),
        }
    }

    /// Whether `key` (of the list's key type) is on the list.
    #[inline]
    pub(crate) fn contains(&self, key: &dyn Any) -> bool {
        (self.contains)(key)
    }

    pub(crate) fn check<K: 'static>(&self) -> Result<(), ConfigError> {
        self.key_type.check::<K>(|list, keys| {
            ConfigError::KeyList(format!("a key list of {list} for keys of type {keys}"))
        })
    }
}

impl fmt::Debug for KeyList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("KeyList").field(&self.key_type).finish()
    }
}
