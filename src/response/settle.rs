//! Settling a cost from the response: the rule the HTTP layer was given (`count_when`,
//! `settle_cost`) applied to the response of an admitted request.

use std::{fmt, sync::Arc};

use super::ResponseHead;

/// How the HTTP layer settles a cost from a response: the real cost, given the response
/// and the reserved cost.
pub(crate) type SettleRule = Arc<dyn Fn(&ResponseHead<'_>, u64) -> u64 + Send + Sync>;

/// A cost to settle once the response is known.
pub(crate) struct Pending {
    pub(crate) settlement: Settlement,
    pub(crate) rule: SettleRule,
}

impl fmt::Debug for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Pending")
            .field(&self.settlement.reserved)
            .finish()
    }
}

impl Pending {
    /// Settles the cost from `response`.
    pub(crate) fn settle(self, response: &ResponseHead<'_>) {
        let actual = (self.rule)(response, self.settlement.reserved);
        self.settlement.settle(actual);
    }
}

/// The cost of an admitted request still to be settled from its response: call it with
/// the real cost; dropped, the reserved cost stays charged.
pub(crate) struct Settlement {
    /// The units charged when the request was admitted.
    pub(crate) reserved: u64,
    pub(crate) settle: Box<dyn FnOnce(u64) + Send>,
}

impl Settlement {
    /// Charges or refunds the difference between `actual` and the reserved cost (and
    /// bans the key when the layer bans and this counted request exhausted its limit).
    pub(crate) fn settle(self, actual: u64) {
        (self.settle)(actual);
    }
}
