//! Choosing a policy per request: the selector a layer's `select` was given, kept with its
//! argument types erased. Each layer's flavour knows them, so it calls it (see
//! `Flavour::choose`); the layer checks the key type when it is built.

use std::any::{Any, TypeId};
use std::fmt;
use std::sync::Arc;

use super::PolicySet;
use crate::error::ConfigError;

/// A selector: `S` is the flavour's boxed closure type over a request (or its head), a key
/// of type `K` and the set, returning the policy's index.
#[derive(Clone)]
pub(crate) struct Chooser {
    key_type: TypeId,
    key_type_name: &'static str,
    select: Arc<dyn Any + Send + Sync>,
}

impl Chooser {
    pub(crate) fn new<S: Any + Send + Sync, K: 'static>(select: S) -> Self {
        Chooser {
            key_type: TypeId::of::<K>(),
            key_type_name: std::any::type_name::<K>(),
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
        if self.key_type == TypeId::of::<K>() {
            return Ok(());
        }
        Err(ConfigError::PolicySet(format!(
            "select(..) takes keys of type {}, but the layer's key extractor gives {}",
            self.key_type_name,
            std::any::type_name::<K>()
        )))
    }
}

impl fmt::Debug for Chooser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chooser")
            .field("key_type", &self.key_type_name)
            .finish_non_exhaustive()
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
