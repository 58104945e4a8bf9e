//! [`Budget`]: the time a request may still wait for its stores.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};
use std::time::Duration;

/// The time one request may wait for its network stores, however many layers it passes:
/// the deadline of the first store that calls out for it, drawn down by every call's wait.
/// A later store's call gets what is left (at most its own deadline); with nothing left,
/// that store decides by its failure policy at once, without a call.
///
/// The HTTP layers keep it in the request's extensions, where every layer the request
/// passes finds the same one (clones share it), and hand it to their store with each
/// decision ([`Store::decide_within`](super::Store::decide_within)). A store of your own
/// that calls a network service honours it with [`Budget::allow`] and [`Budget::spend`].
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::Budget;
///
/// let budget = Budget::default();
/// // The first store's call: its own deadline.
/// assert_eq!(budget.allow(Duration::from_millis(20)), Duration::from_millis(20));
/// budget.spend(Duration::from_millis(15)); // it waited 15 ms
/// // A later layer's store gets what is left.
/// assert_eq!(budget.allow(Duration::from_millis(20)), Duration::from_millis(5));
/// ```
#[derive(Clone, Debug, Default)]
pub struct Budget(Arc<Spent>);

#[derive(Debug, Default)]
struct Spent {
    /// The budget in ns; 0 until a store's call starts it.
    total: AtomicU64,
    /// The time the request has waited for Redis so far, in ns.
    waited: AtomicU64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Budget {
    /// The deadline of a call by a store whose own deadline is `own`: `own` for the first
    /// call (which sets the budget to `own`), otherwise what is left, at most `own`
    /// (zero: nothing left).
    pub fn allow(&self, own: Duration) -> Duration {
        let own = nanos(own).max(1);
        let total = match self
            .0
            .total
            .compare_exchange(0, own, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => own,
            Err(set) => set,
        };
        let left = total.saturating_sub(self.0.waited.load(Ordering::Acquire));
        Duration::from_nanos(left.min(own))
    }

    /// Counts `waited`, a call's wait, against the budget.
    pub fn spend(&self, waited: Duration) {
        self.0.waited.fetch_add(nanos(waited), Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_call_sets_the_budget_and_later_ones_get_what_is_left() {
        let b = Budget::default();
        assert_eq!(
            b.allow(Duration::from_millis(20)),
            Duration::from_millis(20)
        );
        b.spend(Duration::from_millis(15));
        assert_eq!(b.allow(Duration::from_millis(50)), Duration::from_millis(5));
        assert_eq!(b.allow(Duration::from_millis(2)), Duration::from_millis(2));
        b.spend(Duration::from_millis(15));
        assert_eq!(b.allow(Duration::from_millis(20)), Duration::ZERO);
    }
}
