//! The service every layer makes: the inner service and the layer's shared state (its
//! limiter, its slots, its pool). One layer value is one limit: every clone of the
//! service, and every route the layer is applied to, shares that state. Each layer
//! implements `Service` for its own state (`ratelimit`, `generic`, `inflight`, `fair`).

use std::{fmt, sync::Arc};

/// A layer's service: `inner` and the layer's state `L`. `poll_ready` only forwards to the
/// inner service; the decision is made in `call`.
pub struct Limited<S, L> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<L>,
}

impl<S, L> Limited<S, L> {
    pub(crate) fn new(inner: S, shared: &Arc<L>) -> Self {
        Limited {
            inner,
            shared: Arc::clone(shared),
        }
    }
}

/// Writes what makes a layer of a struct holding its shared state in an `Arc`: `Clone`
/// (the `Arc` cloned, whatever the parameters) and `Layer` (a [`Limited`] around the
/// inner service, sharing that state).
macro_rules! layer_of {
    ($layer:ident<$($p:ident),+> { $field:ident: $state:ty }) => {
        impl<$($p),+> Clone for $layer<$($p),+> {
            fn clone(&self) -> Self {
                $layer {
                    $field: std::sync::Arc::clone(&self.$field),
                }
            }
        }

        impl<S, $($p),+> tower_layer::Layer<S> for $layer<$($p),+> {
            type Service = $crate::core::service::Limited<S, $state>;

            fn layer(&self, inner: S) -> Self::Service {
                $crate::core::service::Limited::new(inner, &self.$field)
            }
        }
    };
}
pub(crate) use layer_of;

impl<S: Clone, L> Clone for Limited<S, L> {
    fn clone(&self) -> Self {
        Limited::new(self.inner.clone(), &self.shared)
    }
}

impl<S: fmt::Debug, L> fmt::Debug for Limited<S, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limited")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}
