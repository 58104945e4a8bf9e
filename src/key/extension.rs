//! [`ExtensionKey`] and `ExtensionMap`: a value an earlier layer put in the request
//! extensions.

use std::{any::type_name, fmt, marker::PhantomData};

use http::Request;

use super::KeyExtractor;

/// Keys requests by a clone of a `T` that an earlier layer (typically authentication)
/// inserted into the request extensions: a user id, a tenant, an account.
///
/// The key is `T`; it is `None` when no `T` is present (for example, an anonymous request
/// that the auth layer let through). Use [`ExtensionKey::map`] to key by part of a larger
/// value, such as one field of a claims struct.
///
/// The rate-limit layer must run **after** the layer that inserts `T`, i.e. be added
/// inside it (`ServiceBuilder::new().layer(auth).layer(rate_limit)`).
///
/// See the [module docs](super) for the other extractors.
///
/// ```
/// use tollgate::key::{ExtensionKey, KeyExtractor};
///
/// #[derive(Clone, Debug, PartialEq, Eq, Hash)]
/// struct UserId(u64);
///
/// let by_user = ExtensionKey::<UserId>::new();
/// let mut req = http::Request::new(());
/// assert_eq!(by_user.extract(&req), None);
/// req.extensions_mut().insert(UserId(7));
/// assert_eq!(by_user.extract(&req), Some(UserId(7)));
/// ```
#[must_use]
pub struct ExtensionKey<T> {
    _marker: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T> {
    /// Keys by a clone of the `T` in the request extensions.
    pub const fn new() -> Self {
        Self {
            _marker: PhantomData,
        }
    }

    /// Keys by `f(&t)` for the `T` in the request extensions (`None` when there is no
    /// `T`). For a projection that can itself fail, write the extractor with
    /// [`key_fn`](super::key_fn).
    ///
    /// ```
    /// use tollgate::key::{ExtensionKey, KeyExtractor};
    ///
    /// #[derive(Clone)]
    /// struct Claims { user_id: String, scope: String }
    ///
    /// let by_user = ExtensionKey::map(|claims: &Claims| claims.user_id.clone());
    /// let mut req = http::Request::new(());
    /// req.extensions_mut().insert(Claims { user_id: "u1".into(), scope: "read".into() });
    /// assert_eq!(by_user.extract(&req).as_deref(), Some("u1"));
    /// ```
    pub fn map<F, K>(f: F) -> ExtensionMap<T, F>
    where
        F: Fn(&T) -> K,
    {
        ExtensionMap {
            f,
            _marker: PhantomData,
        }
    }
}

impl<T> Default for ExtensionKey<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for ExtensionKey<T> {}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ExtensionKey")
            .field(&type_name::<T>())
            .finish()
    }
}

impl<B, T> KeyExtractor<Request<B>> for ExtensionKey<T>
where
    T: Clone + Send + Sync + 'static,
{
    type Key = T;

    fn extract(&self, req: &Request<B>) -> Option<T> {
        req.extensions().get::<T>().cloned()
    }
}

/// Keys requests by a projection of a `T` in the request extensions; built by
/// [`ExtensionKey::map`].
///
/// See the [module docs](super).
#[must_use]
pub struct ExtensionMap<T, F> {
    f: F,
    _marker: PhantomData<fn() -> T>,
}

impl<T, F: Clone> Clone for ExtensionMap<T, F> {
    fn clone(&self) -> Self {
        Self {
            f: self.f.clone(),
            _marker: PhantomData,
        }
    }
}

impl<T, F> fmt::Debug for ExtensionMap<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ExtensionMap")
            .field(&type_name::<T>())
            .finish_non_exhaustive()
    }
}

impl<B, T, F, K> KeyExtractor<Request<B>> for ExtensionMap<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> K,
{
    type Key = K;

    fn extract(&self, req: &Request<B>) -> Option<K> {
        req.extensions().get::<T>().map(&self.f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct Tenant(&'static str);

    #[test]
    fn clones_the_extension() {
        let k = ExtensionKey::<Tenant>::default();
        let mut req = Request::new(());
        assert_eq!(k.extract(&req), None);
        req.extensions_mut().insert(Tenant("acme"));
        assert_eq!(k.extract(&req), Some(Tenant("acme")));
        assert!(format!("{k:?}").contains("Tenant"));
    }

    #[test]
    fn maps_the_extension() {
        let k = ExtensionKey::map(|t: &Tenant| t.0.len());
        let mut req = Request::new(());
        assert_eq!(k.clone().extract(&req), None);
        req.extensions_mut().insert(Tenant("acme"));
        assert_eq!(k.extract(&req), Some(4));
        assert!(format!("{k:?}").starts_with("ExtensionMap"));
    }
}
