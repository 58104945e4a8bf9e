//! The deadline every Redis call goes out under.

use std::{
    future::Future,
    pin::Pin,
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
