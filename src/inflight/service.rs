//! The in-flight layer's part of a decision: a slot taken for the request's key.

use std::sync::Arc;

use http::Request;
use tokio::time::Instant;

use super::answer::{settle, InFlightReplies, Slot};
use super::future::Waiting;
use super::store::{Attempt, InFlightStore, Limits};
use crate::core::gate::{Decided, Part};
use crate::deadline::DeadlineSources;
use crate::options::OnStoreError;

/// The in-flight layer's own state: its store, its limits and its answers.
// Public only as a parameter of the unnameable service type; never seen by users.
#[allow(missing_debug_implementations)]
pub struct Slots<St> {
    /// What a failed store's request gets.
    pub(crate) on_error: OnStoreError,
    pub(crate) store: St,
    pub(crate) limits: Limits,
    pub(crate) replies: Arc<InFlightReplies>,
    /// Where a request's deadline is read.
    pub(crate) deadlines: DeadlineSources,
}

impl<K, St: InFlightStore<K>> Part<K> for Slots<St> {
    type Extra = Slot;
    type Later = Waiting;

    #[inline]
    fn decide<B>(&self, key: Option<K>, req: &Request<B>) -> Decided<Slot, Waiting> {
        // A request never waits past its deadline: the wait ends there, refused.
        let mut limits = self.limits;
        let deadline = match self.deadlines.left(req) {
            Some(left) if left < limits.max_wait => {
                limits.max_wait = left;
                Some(Instant::now() + left)
            }
            _ => None,
        };
        match self.store.acquire(key, &limits) {
            Attempt::Now(acquired) => {
                Decided::Now(settle(acquired, &self.replies, self.on_error, req))
            }
            Attempt::Later(acquiring) => Decided::Later(Waiting {
                acquiring,
                replies: Arc::clone(&self.replies),
                on_error: self.on_error,
                deadline,
            }),
        }
    }
}
