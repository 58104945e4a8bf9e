//! Choosing a policy per request: the selector a layer's `select` was given, kept with its
//! argument types erased. Each layer's flavour knows them, so it calls it (see
//! `Flavour::choose`); the layer checks the key type when it is built.

use std::any::Any;
use std::sync::Arc;

use super::PolicySet;
use crate::error::ConfigError;
use crate::options::KeyType;

/// A selector of a policy over the request itself and its key (the generic layer's),
/// as a [`Chooser`] holds it.
pub(crate) type RequestSelect<Req, K> =
    Box<dyn Fn(&Req, Option<&K>, &PolicySet) -> usize + Send + Sync>;

/// A selector: `S` is the flavour's boxed closure type over a request (or its head), a key
/// of type `K` and the set, returning the policy's index.
#[derive(Clone, Debug)]
pub(crate) struct Chooser {
    key_type: KeyType,
    select: Arc<dyn Any + Send + Sync>,
}

impl Chooser {
    pub(crate) fn new<S: Any + Send + Sync, K: 'static>(select: S) -> Self {
        Chooser {
            key_type: KeyType::of::<K>(),
            select: Arc::new(select),
        }
    }

    /// The selector as the flavour made it.
    #[inline]
    pub(crate) fn get<S: Any>(&self) -> Option<&S> {
        self.select.downcast_ref::<S>()
    }

    /// Whether the selector takes keys of the type the layer extracts.
    pub(crate) fn check<K: 'static>(&self) -> Result<(), ConfigError> {
        self.key_type.check::<K>(|select, keys| {
            ConfigError::PolicySet(format!(
                "select(..) takes keys of type {select}, but the layer's key extractor gives {keys}"
            ))
        })
    }
}

impl PolicySet {
    /// The index of the policy called `name`, or the fallback's (0) when the set has none
    /// of that name.
    #[inline]
    pub(crate) fn choose(&self, name: &str) -> usize {
        self.index_of(name).unwrap_or(0)
    }
}
