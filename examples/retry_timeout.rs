//! tollgate on a non-HTTP `tower::Service`, composed with `tower::retry` and
//! `tower::timeout`: a refused job is retried after exactly the `retry_after()` the typed
//! `RateLimited` error carries, within a bounded number of attempts and an overall deadline.
//!
//! ```sh
//! cargo run --example retry_timeout   # runs to completion (TOLLGATE_EXAMPLE_SELFTEST=1 too)
//! ```
//!
//! The stack, outermost first: `timeout` (a deadline for the job, sleeps included) ->
//! `retry` (the policy below) -> the rate limit (2 jobs per second per tenant, burst 2) ->
//! the worker.

use std::time::Duration;

use tokio::time::{sleep, Instant, Sleep};
use tollgate::{generic::RateLimited, key::key_fn, Quota};
use tower::BoxError;
use tower::{retry::Policy, timeout::error::Elapsed, Service, ServiceBuilder, ServiceExt};

#[derive(Clone, Debug)]
struct Job {
    tenant: u32,
    id: u32,
}

/// Retries a job refused by the rate limit after its exact `retry_after`, at most
/// `attempts_left` more times. Other errors are not retried.
#[derive(Clone, Debug)]
struct RetryWhenLimited {
    attempts_left: u32,
    started: Instant,
}

impl<Res> Policy<Job, Res, BoxError> for RetryWhenLimited {
    type Future = Sleep;

    fn retry(&mut self, job: &mut Job, result: &mut Result<Res, BoxError>) -> Option<Sleep> {
        let limited = result.as_ref().err()?.downcast_ref::<RateLimited>()?;
        let wait = limited.retry_after()?; // None: the job can never be admitted
        if self.attempts_left == 0 {
            return None;
        }
        self.attempts_left -= 1;
        let at = self.started.elapsed().as_millis();
        println!(
            "  t={at:>4} ms  job {} refused, retrying in {wait:?}",
            job.id
        );
        Some(sleep(wait))
    }

    fn clone_request(&mut self, job: &Job) -> Option<Job> {
        Some(job.clone())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let limit = tollgate::generic::RateLimitLayer::builder()
        .key(key_fn(|job: &Job| Some(job.tenant)))
        .token_bucket(Quota::per_second(2)?)
        .build::<Job>()?;
    let worker = |job: Job| async move { Ok::<_, BoxError>(format!("job {} done", job.id)) };
    let started = Instant::now();
    let stack = |deadline, attempts_left| {
        ServiceBuilder::new()
            .timeout(deadline)
            .retry(RetryWhenLimited {
                attempts_left,
                started,
            })
            .layer(limit.clone())
            .service_fn(worker)
    };

    println!("5 jobs of tenant 1, one after another (2 per second, burst 2):");
    let mut svc = stack(Duration::from_secs(5), 3);
    for id in 1..=5 {
        let done = svc.ready().await?.call(Job { tenant: 1, id }).await?;
        println!("  t={:>4} ms  {done}", started.elapsed().as_millis());
    }
    // Jobs 1-2 pass at once; 3, 4, 5 each wait their 500 ms slot.
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(1450), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(2500), "{elapsed:?}");

    println!("tenant 2 is not slowed by tenant 1:");
    let t = Instant::now();
    stack(Duration::from_secs(5), 3)
        .oneshot(Job { tenant: 2, id: 6 })
        .await?;
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );

    println!("a 200 ms deadline, shorter than the 500 ms wait: the timeout wins");
    let t = Instant::now();
    let err = stack(Duration::from_millis(200), 3)
        .oneshot(Job { tenant: 1, id: 7 })
        .await
        .unwrap_err();
    println!("  after {:?}: {err}", t.elapsed());
    assert!(err.is::<Elapsed>() && t.elapsed() < Duration::from_millis(450));

    println!("no retries allowed: the typed refusal reaches the caller");
    let err = stack(Duration::from_secs(5), 0)
        .oneshot(Job { tenant: 1, id: 8 })
        .await
        .unwrap_err();
    let limited = err
        .downcast_ref::<RateLimited>()
        .expect("a RateLimited error");
    println!("  {limited}");
    assert!(limited
        .retry_after()
        .is_some_and(|d| d <= Duration::from_millis(500)));
    println!("ok");
    Ok(())
}
