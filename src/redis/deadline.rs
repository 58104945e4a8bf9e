//! The deadline every Redis call goes out under.

use std::{future::Future, time::Duration};

use crate::error::{ConfigError, StoreError};

/// `call`'s result, or [`StoreError::Timeout`] once `deadline` has passed without one.
pub(crate) async fn within<T>(
    deadline: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(deadline, call)
        .await
        .unwrap_or(Err(StoreError::Timeout(deadline)))
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
