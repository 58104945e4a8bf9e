//! Replay: a trace run through a store's own decisions on a manual clock, on a fresh
//! in-memory store or, with the feature `redis`, on Redis.

use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::decision::{Outcome, Source};
use tollgate::store::{MemoryStore, Store};
use tollgate::Policy;

use super::{policies::Named, report::Report, shown, units::secs, Arrival, SimError, NS};

/// Where trace time zero sits on the clock: 2027-01-15 00:00:00 UTC, a whole day since the
/// Unix epoch, so that windows of a second, a minute, an hour or a day start at trace time
/// zero on every store.
pub const BASE: Duration = Duration::from_secs(20_833 * 86_400);

/// The latest trace time the replay places on the clock, in ns: about 89 years. The clock
/// then stays below 2^62 ns since the Unix epoch, so that a store adding a policy's horizon
/// (below 2^62 ns) and a cost to it cannot overflow its 64 bits.
pub const LATEST: u64 = (1 << 62) - BASE.as_nanos() as u64;

/// Refuses a trace time (or a pattern's duration) later than [`LATEST`]; `time` is how it
/// was written.
pub fn check_time(ns: u64, time: &str) -> Result<u64, String> {
    if ns <= LATEST {
        return Ok(ns);
    }
    Err(format!(
        "time {} is later than a trace can reach ({} s, about {} years)",
        shown(time),
        LATEST / NS,
        LATEST / NS / (365 * 86_400)
    ))
}

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Admitted, passed downstream after `wait` ns (zero unless queued).
    Admitted { wait: u64 },
    /// Refused; `retry_after` in ns, `None` when the cost can never be admitted (no
    /// `Retry-After`).
    Refused { retry_after: Option<u64> },
}

/// Replays `trace` against `policy` on `store`, moving `clock` to each arrival (trace time
/// zero at the clock's time when called): the decisions are the store's own, as the
/// middleware would get them.
pub async fn replay<S: Store<String>>(
    store: &S,
    clock: &ManualClock,
    policy: &Policy,
    trace: &[Arrival],
) -> Result<Vec<Fate>, SimError> {
    use tollgate::clock::Clock;
    let start = clock.now();
    let mut fates = Vec::with_capacity(trace.len());
    for (i, a) in trace.iter().enumerate() {
        let at = check_time(a.at, &secs(a.at))
            .map_err(|e| SimError::new(format!("request {}: {e}", i + 1)))?;
        clock.set(start + at);
        let d = store
            .decide(&a.key, policy, a.cost)
            .await
            .map_err(|e| SimError::new(format!("request {}: the store failed: {e}", i + 1)))?;
        // A decision the store made without its backend is not the policy's.
        if !matches!(d.source(), Source::Local | Source::Store) {
            return Err(SimError::new(format!(
                "request {}: decided by {:?}, not by the store",
                i + 1,
                d.source()
            )));
        }
        fates.push(match d.outcome() {
            Outcome::Allowed { wait } => Fate::Admitted {
                wait: wait.as_nanos() as u64,
            },
            Outcome::Denied { retry_after } => Fate::Refused {
                retry_after: Some(retry_after.as_nanos() as u64),
            },
            _ => Fate::Refused { retry_after: None },
        });
    }
    Ok(fates)
}

/// Replays against a fresh in-memory store on a manual clock at [`BASE`].
pub async fn replay_memory(policy: &Policy, trace: &[Arrival]) -> Result<Vec<Fate>, SimError> {
    let clock = ManualClock::at(BASE);
    let store: MemoryStore<String, ManualClock> =
        MemoryStore::new(policy.clone()).with_clock(clock.clone());
    replay(&store, &clock, policy, trace).await
}

/// When each admitted request passed downstream (arrival plus wait), in order.
pub fn downstream(trace: &[Arrival], fates: &[Fate]) -> Vec<u64> {
    let mut out: Vec<u64> = trace
        .iter()
        .zip(fates)
        .filter_map(|(a, f)| match f {
            Fate::Admitted { wait } => Some(a.at + wait),
            Fate::Refused { .. } => None,
        })
        .collect();
    out.sort_unstable();
    out
}

/// Replays `trace` against each policy on its own fresh in-memory store.
pub async fn run_memory(trace: &[Arrival], policies: &[Named]) -> Result<Report, SimError> {
    let mut fates = Vec::new();
    for p in policies {
        fates.push(replay_memory(&p.policy, trace).await?);
    }
    Ok(Report::new(
        trace,
        policies.iter().map(|p| p.label.clone()).collect(),
        fates,
    ))
}

/// Replays on Redis, each policy under a namespace of its own.
#[cfg(feature = "redis")]
pub async fn run_redis(
    url: &str,
    trace: &[Arrival],
    policies: &[Named],
) -> Result<Report, SimError> {
    use tollgate::store::{FailurePolicy, RedisConnection, RedisStore};
    let conn = RedisConnection::connect(url)
        .await
        .map_err(|e| SimError::new(format!("connecting to {url}: {e}")))?;
    // A namespace no earlier run wrote to: the process and the wall-clock time.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut fates = Vec::new();
    for (i, p) in policies.iter().enumerate() {
        let clock = ManualClock::at(BASE);
        let store = RedisStore::builder("simulated", p.policy.clone())
            .namespace(format!("tollgate-sim-{}-{run}-{i}", std::process::id()))
            .clock(clock.clone())
            .negative_cache(0)
            .deadline(std::time::Duration::from_secs(2))
            // A failed call is reported (the replay stops on a decision not made by Redis),
            // never replaced by a local one.
            .failure_policy(FailurePolicy::FailClosed {
                retry_after: std::time::Duration::from_secs(1),
            })
            .build(conn.clone())
            .map_err(|e| SimError::new(format!("policy {:?} on Redis: {e}", p.label)))?;
        fates.push(replay(&store, &clock, &p.policy, trace).await?);
    }
    Ok(Report::new(
        trace,
        policies.iter().map(|p| p.label.clone()).collect(),
        fates,
    ))
}
