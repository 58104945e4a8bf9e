//! The deadline every Redis call goes out under, and the budget one request shares across
//! the stores of every layer it passes.

use std::{
    cell::RefCell,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use crate::error::{ConfigError, StoreError};

/// `call`'s result, or [`StoreError::Timeout`] once `deadline` has passed without one.
pub(crate) fn within<T, F>(deadline: Duration, call: F) -> Within<F>
where
    F: Future<Output = Result<T, StoreError>>,
{
    Within {
        call: tokio::time::timeout(deadline, call),
        deadline,
    }
}

pin_project_lite::pin_project! {
    /// The future of [`within`]: the call and its timer in one value (an `async fn`
    /// would hold the call twice, as its argument and inside the timeout, and every
    /// decision's future is moved into its box whole).
    pub(crate) struct Within<F> {
        #[pin]
        call: tokio::time::Timeout<F>,
        deadline: Duration,
    }
}

impl<T, F> Future for Within<F>
where
    F: Future<Output = Result<T, StoreError>>,
{
    type Output = Result<T, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.call.poll(cx) {
            Poll::Ready(Ok(result)) => Poll::Ready(result),
            Poll::Ready(Err(_)) => Poll::Ready(Err(StoreError::Timeout(*this.deadline))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Refuses a zero deadline for a Redis call.
pub(crate) fn check(deadline: Duration) -> Result<(), ConfigError> {
    if deadline.is_zero() {
        return Err(ConfigError::Store(
            "the Redis deadline must be longer than zero".into(),
        ));
    }
    Ok(())
}

/// The time one request may wait for Redis, however many Redis-backed layers it passes:
/// the deadline of the first store that calls Redis for it, drawn down by every call's
/// wait. A later store's call gets what is left (at most its own deadline); with nothing
/// left it decides by its failure policy at once. The HTTP rate-limit layer keeps it in
/// the request's extensions; clones share it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Budget(Arc<Spent>);

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
    /// call (which sets the budget to `own`), otherwise what is left, at most `own`.
    pub(crate) fn allow(&self, own: Duration) -> Duration {
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

    /// Counts `waited` against the budget.
    pub(crate) fn spend(&self, waited: Duration) {
        self.0.waited.fetch_add(nanos(waited), Ordering::AcqRel);
    }
}

thread_local! {
    /// The budget of the request whose store call is being made on this thread.
    static CURRENT: RefCell<Option<Budget>> = const { RefCell::new(None) };
}

/// Runs `f` (a layer asking its store) with `budget` as the current request's: a Redis
/// store's call made inside `f` draws on it.
pub(crate) fn with_budget<R>(budget: &Budget, f: impl FnOnce() -> R) -> R {
    /// Puts the previous budget back, also when `f` panics.
    struct Restore(Option<Budget>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = previous);
        }
    }
    let previous = CURRENT.with(|c| c.borrow_mut().replace(budget.clone()));
    let _restore = Restore(previous);
    f()
}

/// The budget of the request being decided on this thread, if its layer carries one.
pub(crate) fn current_budget() -> Option<Budget> {
    CURRENT.with(|c| c.borrow().clone())
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

    #[test]
    fn the_budget_is_current_only_inside_the_call() {
        let b = Budget::default();
        assert!(current_budget().is_none());
        with_budget(&b, || {
            let inner = current_budget().expect("set");
            inner.spend(Duration::from_millis(3));
        });
        assert!(current_budget().is_none());
        assert_eq!(b.allow(Duration::from_millis(10)), Duration::from_millis(7));
    }
}
