//! Who is limited: key extractors.
//!
//! A [`KeyExtractor`] reads a request and returns the key the limit is counted against, or
//! `None` when the request carries no usable key (what happens then is the layer's
//! `on_missing_key` setting, see the crate docs). Extractors are generic over the whole
//! request type, so the same trait serves HTTP requests (`http::Request<B>`) and any other
//! `tower::Service` request.
//!
//! ```
//! use tollgate::key::{key_fn, KeyExtractor};
//!
//! // A custom extractor from a closure: the tenant id of a job.
//! struct Job { tenant: u32 }
//! let by_tenant = key_fn(|job: &Job| Some(job.tenant));
//! assert_eq!(by_tenant.extract(&Job { tenant: 7 }), Some(7));
//! ```

use std::fmt;

/// Reads the rate-limit key out of a request.
///
/// Implement it for your own type, or adapt a closure with [`key_fn`]. Returning `None`
/// means "this request has no key"; it is never an error and never a panic: a malformed
/// header, for example, is treated as absent.
///
/// See the [module docs](self) for the built-in extractors.
pub trait KeyExtractor<Req> {
    /// The key type. It is hashed for the in-memory store and encoded for the Redis store.
    type Key;

    /// Extracts the key, or `None` when the request carries none.
    fn extract(&self, req: &Req) -> Option<Self::Key>;
}

/// A [`KeyExtractor`] made from a closure; built by [`key_fn`].
///
/// See the [module docs](self).
#[derive(Clone, Copy)]
pub struct KeyFn<F> {
    f: F,
}

/// Adapts a closure `Fn(&Req) -> Option<K>` into a [`KeyExtractor`].
pub fn key_fn<F>(f: F) -> KeyFn<F> {
    KeyFn { f }
}

impl<F> fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyFn").finish_non_exhaustive()
    }
}

impl<Req, K, F> KeyExtractor<Req> for KeyFn<F>
where
    F: Fn(&Req) -> Option<K>,
{
    type Key = K;

    fn extract(&self, req: &Req) -> Option<K> {
        (self.f)(req)
    }
}
