//! A burst after idle time, decided under a manual clock: a client idle for 5 s
//! sends 200 requests in 100 ms against "100 per second", through a token bucket
//! (burst 200), a strict leaky meter, and a leaky-bucket queue of 200.
//!
//! Run with `cargo run --example burst`.

use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::decision::Outcome;
use tollgate::store::MemoryStore;
use tollgate::ConfigError;
use tollgate::Limit;
use tollgate::Quota;

fn run(name: &str, limit: Limit) {
    let store = MemoryStore::new(limit).with_clock(ManualClock::new());
    let clock = store.clock().clone();
    clock.advance(Duration::from_secs(5)); // idle
    let (mut admitted, mut refused, mut max_wait) = (0, 0, Duration::ZERO);
    println!("\n{name}");
    for i in 0..200 {
        if i > 0 {
            clock.advance(Duration::from_micros(500));
        }
        let d = store.check(&"merchant", 1);
        match d.outcome() {
            Outcome::Allowed { wait } => {
                admitted += 1;
                max_wait = max_wait.max(wait);
            }
            _ => refused += 1,
        }
        if i < 3 || i == 20 || i == 199 {
            println!(
                "  t=+{:>5.1} ms  #{i:<3} {:?}  remaining={}",
                i as f64 * 0.5,
                d.outcome(),
                d.remaining()
            );
        }
    }
    println!("  => admitted {admitted}, refused {refused}, longest wait {max_wait:?}");
}

fn main() -> Result<(), ConfigError> {
    let rate = Quota::per_second(100)?;
    run(
        "token bucket, 100/s, burst 200",
        Limit::token_bucket(rate.with_burst(200)?)?,
    );
    run("strict leaky meter, 100/s", Limit::leaky_meter(rate)?);
    run(
        "leaky-bucket queue, 100/s, queue 200",
        Limit::leaky_queue(rate, 200)?,
    );
    Ok(())
}
