//! Combinators: tuples of extractors (all parts together), `Or` (a fallback), and
//! [`key_fn`] (a closure).

use std::fmt;

use super::KeyExtractor;

macro_rules! tuple_extractor {
    ($($name:ident $part:ident),+) => {
        /// All parts together: the key is the tuple of the parts' keys, `None` if any part
        /// is `None`. Parts are extracted left to right and the first `None` stops.
        impl<Req, $($name),+> KeyExtractor<Req> for ($($name,)+)
        where
            $($name: KeyExtractor<Req>,)+
        {
            type Key = ($($name::Key,)+);

            fn extract(&self, req: &Req) -> Option<Self::Key> {
                let ($($part,)+) = self;
                Some(($($part.extract(req)?,)+))
            }

            fn misconfiguration(&self, req: &Req) -> Option<&'static str> {
                let ($($part,)+) = self;
                Option::<&'static str>::None$(.or_else(|| $part.misconfiguration(req)))+
            }
        }
    };
}

tuple_extractor!(A a, B b);
tuple_extractor!(A a, B b, C c);
tuple_extractor!(A a, B b, C c, D d);

/// A fallback: the first extractor's key, or else the second's. Both have the same key
/// type. Built by [`KeyExtractorExt::or`] or [`Or::new`].
///
/// See the [module docs](super).
///
/// ```
/// use tollgate::key::{HeaderKey, KeyExtractor, KeyExtractorExt};
///
/// // The tenant header if there is one, else the API key header.
/// let key = HeaderKey::new("x-tenant")?.or(HeaderKey::new("x-api-key")?);
/// let req = http::Request::builder().header("x-api-key", "k1").body(())?;
/// assert_eq!(key.extract(&req).unwrap(), "k1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct Or<A, B> {
    first: A,
    second: B,
}

impl<A, B> Or<A, B> {
    /// `first`'s key, or `second`'s when `first` gives none.
    pub const fn new(first: A, second: B) -> Self {
        Self { first, second }
    }
}

impl<Req, A, B> KeyExtractor<Req> for Or<A, B>
where
    A: KeyExtractor<Req>,
    B: KeyExtractor<Req, Key = A::Key>,
{
    type Key = A::Key;

    fn extract(&self, req: &Req) -> Option<A::Key> {
        self.first.extract(req).or_else(|| self.second.extract(req))
    }

    fn misconfiguration(&self, req: &Req) -> Option<&'static str> {
        // Missing only when both are: the second is the fallback, so its reason counts.
        self.second
            .misconfiguration(req)
            .or_else(|| self.first.misconfiguration(req))
    }
}

/// Combinator methods for key extractors.
///
/// It is implemented for every type, because an extractor is usually generic over the
/// request type and the request is not known where the combinator is called; the key
/// types are checked where the combined extractor is used.
///
/// See the [module docs](super).
pub trait KeyExtractorExt: Sized {
    /// Falls back to `fallback` when `self` gives no key. Both must have the same key type.
    fn or<B>(self, fallback: B) -> Or<Self, B> {
        Or::new(self, fallback)
    }
}

impl<T> KeyExtractorExt for T {}

/// A [`KeyExtractor`](super::KeyExtractor) made from a closure; built by [`key_fn`].
///
/// See the [module docs](super).
#[derive(Clone, Copy)]
pub struct KeyFn<F> {
    f: F,
}

/// Adapts a closure `Fn(&Req) -> Option<K>` into a [`KeyExtractor`](super::KeyExtractor).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::key_fn;

    #[test]
    fn tuples() {
        let even = key_fn(|n: &u32| n.is_multiple_of(2).then_some(*n));
        let tens = key_fn(|n: &u32| Some(n / 10));
        let name = key_fn(|_: &u32| Some("n"));
        let unit = key_fn(|_: &u32| Some(()));
        assert_eq!((even, tens).extract(&42), Some((42, 4)));
        assert_eq!((even, tens).extract(&43), None);
        assert_eq!((tens, name, even).extract(&42), Some((4, "n", 42)));
        assert_eq!(
            (tens, name, unit, even).extract(&42),
            Some((4, "n", (), 42))
        );
        assert_eq!((tens, name, unit, even).extract(&41), None);
    }

    #[test]
    fn or_falls_back() {
        let even = key_fn(|n: &u32| n.is_multiple_of(2).then_some(*n));
        let zero = key_fn(|_: &u32| Some(0));
        let none = key_fn(|_: &u32| None::<u32>);
        assert_eq!(even.or(zero).extract(&4), Some(4));
        assert_eq!(even.or(zero).extract(&5), Some(0));
        assert_eq!(even.or(none).extract(&5), None);
        assert_eq!(Or::new(none, none).or(even).extract(&6), Some(6));
    }
}
