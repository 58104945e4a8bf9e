//! The fair-sharing layer's part of a decision: the pool asked for the request's share.

use std::sync::Arc;

use http::Request;

use super::answer::{settle, FairReplies, Reported};
use super::future::Deciding;
use super::share::{Pool, Share};
use super::store::FairStore;
use crate::core::gate::{Decided, Part};
use crate::key::RequestHead;
use crate::options::OnStoreError;
use crate::quota::Quota;

/// How a request's share is chosen.
pub(crate) enum Shares {
    One(Share),
    By(Box<dyn Fn(&RequestHead<'_>) -> Share + Send + Sync>),
}

/// The fair-sharing layer's own state: its store, its pool, how shares are chosen and its
/// answers.
// Public only as a parameter of the unnameable service type; never seen by users.
#[allow(missing_debug_implementations)]
pub struct Sharing<St> {
    /// What a failed store's request gets.
    pub(crate) on_error: OnStoreError,
    pub(crate) store: St,
    pub(crate) pool: Pool,
    pub(crate) pool_quota: Quota,
    pub(crate) shares: Shares,
    pub(crate) replies: Arc<FairReplies>,
}

impl<K, St: FairStore<K>> Part<K> for Sharing<St> {
    type Extra = Reported;
    type Later = Deciding;

    #[inline]
    fn decide<B>(&self, key: Option<K>, req: &Request<B>) -> Decided<Reported, Deciding> {
        let share = match &self.shares {
            Shares::One(s) => *s,
            Shares::By(f) => f(&RequestHead::of(req)),
        };
        let mut deciding = self.store.decide(key.as_ref(), &self.pool, &share);
        match deciding.take_ready() {
            Some(result) => Decided::Now(settle(result, &self.replies, share, self.on_error, req)),
            None => Decided::Later(Deciding {
                deciding,
                replies: Arc::clone(&self.replies),
                share,
                on_error: self.on_error,
            }),
        }
    }
}
