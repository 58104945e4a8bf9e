//! Choosing a policy per request: [`PolicyChoice`] and the extractors the layers'
//! `select` methods wrap around a key extractor.

use std::{fmt, marker::PhantomData};

use http::Request;

use super::{PolicyName, PolicySet};
use crate::key::{KeyExtractor, RequestHead};

/// Which policy of a set applies to a request: what
/// [`KeyExtractor::policy`](crate::key::KeyExtractor::policy) returns. Made by
/// [`PolicySet::choose`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyChoice(pub(crate) usize);

impl PolicyChoice {
    /// The set's fallback policy (its first).
    pub const FALLBACK: PolicyChoice = PolicyChoice(0);
}

impl PolicySet {
    /// The policy called `name`, or the fallback when the set has none of that name.
    #[inline]
    pub fn choose(&self, name: &str) -> PolicyChoice {
        PolicyChoice(self.index_of(name).unwrap_or(0))
    }
}

/// A key extractor whose requests pick their policy with a closure over the request's
/// head and its key: what the HTTP layer's `select` builds. See [`crate::policy`].
pub struct SelectHead<X, F, N> {
    pub(crate) key: X,
    pub(crate) select: F,
    pub(crate) _name: PhantomData<fn() -> N>,
}

/// A key extractor whose requests pick their policy with a closure over the request and
/// its key: what the generic layer's `select` builds. See [`crate::policy`].
pub struct Select<X, F, N> {
    pub(crate) key: X,
    pub(crate) select: F,
    pub(crate) _name: PhantomData<fn() -> N>,
}

macro_rules! common {
    ($t:ident) => {
        impl<X: Clone, F: Clone, N> Clone for $t<X, F, N> {
            fn clone(&self) -> Self {
                $t {
                    key: self.key.clone(),
                    select: self.select.clone(),
                    _name: PhantomData,
                }
            }
        }

        impl<X: fmt::Debug, F, N> fmt::Debug for $t<X, F, N> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("key", &self.key)
                    .finish_non_exhaustive()
            }
        }
    };
}
common!(SelectHead);
common!(Select);

impl<B, X, F, N> KeyExtractor<Request<B>> for SelectHead<X, F, N>
where
    X: KeyExtractor<Request<B>>,
    F: Fn(&RequestHead<'_>, Option<&X::Key>) -> N,
    N: PolicyName,
{
    type Key = X::Key;

    #[inline]
    fn extract(&self, req: &Request<B>) -> Option<X::Key> {
        self.key.extract(req)
    }

    fn misconfiguration(&self, req: &Request<B>) -> Option<&'static str> {
        self.key.misconfiguration(req)
    }

    #[inline]
    fn policy(&self, req: &Request<B>, key: Option<&X::Key>, set: &PolicySet) -> PolicyChoice {
        set.choose((self.select)(&RequestHead::of(req), key).policy_name())
    }
}

impl<Req, X, F, N> KeyExtractor<Req> for Select<X, F, N>
where
    X: KeyExtractor<Req>,
    F: Fn(&Req, Option<&X::Key>) -> N,
    N: PolicyName,
{
    type Key = X::Key;

    #[inline]
    fn extract(&self, req: &Req) -> Option<X::Key> {
        self.key.extract(req)
    }

    fn misconfiguration(&self, req: &Req) -> Option<&'static str> {
        self.key.misconfiguration(req)
    }

    #[inline]
    fn policy(&self, req: &Req, key: Option<&X::Key>, set: &PolicySet) -> PolicyChoice {
        set.choose((self.select)(req, key).policy_name())
    }
}
