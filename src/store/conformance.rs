//! The checks a [`Store`] must pass to keep the crate's promise that every store decides
//! exactly as the in-memory store does (feature `conformance`). See the
//! [module docs](super#your-own-store).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{MemoryStore, Store};
use crate::algorithm::Limit;
use crate::clock::ManualClock;
use crate::decision::{Decision, Outcome, Source};
use crate::error::StoreError;
use crate::policy::Policy;
use crate::quota::Quota;

/// Random sequences run, each on a fresh store and clock.
const SEQUENCES: u64 = 64;
/// Operations in a sequence, at most.
const MAX_OPS: u64 = 60;
/// Concurrent tasks in the race check.
const RACERS: usize = 8;
/// Units a key may spend at once in the race check.
const RACE_BURST: u64 = 64;
/// How long a refund (best effort, maybe sent in the background) may take to show.
const REFUND_WITHIN: Duration = Duration::from_secs(2);

/// Why a store failed [`check`], in a few lines: the check, its input (the policies as
/// text, the operations on the key in question), what the in-memory store answered beside
/// what the store under test answered, and where the two differ first.
///
/// ```text
/// conformance check `sequences` failed: sequence 0, operation #2: the decisions differ
///   policies: #0 `1/2862ms burst 19, queue 2/1970ms 5 nodelay 3, 32/2423ms window offset 123777us shadow`
///   key 0: #0 at +121.548ms settle a reservation of 0 at 1 under #0; #2 at +123.305ms preview of cost 2 under #0
///   in memory:  admitted; #0 remaining 16, next in 2.860243s, full in 8.584243s; #1 remaining 1, ...
///   this store: admitted; #0 remaining 17, next in 2.862s, full in 5.724s; #1 remaining 2, ...
///   first difference: limit #0's remaining, 16 in memory, 17 in this store
/// ```
pub struct ConformanceError {
    what: String,
}

impl fmt::Display for ConformanceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

// Shown as is by `unwrap` and by a test returning `Result`: the report is several lines.
impl fmt::Debug for ConformanceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for ConformanceError {}

fn fail(what: String) -> ConformanceError {
    ConformanceError { what }
}

/// Runs a store through the checks every store must pass, comparing each answer with the
/// in-memory store's on the same [`ManualClock`]:
///
/// - 8 tasks racing to spend one key's 64 units at a frozen instant: exactly 64 are
///   admitted (a lost update admits more, a double charge fewer);
/// - a refund (which may be applied in the background) shows within 2 s;
/// - 64 random sequences of up to 60 operations on three keys (decisions with
///   [`Store::decide_now`] tried first as the layers do, previews, costs settled above
///   and below their reservation, resets and bans), under one to three random policies
///   taken in turn (every algorithm, several limits, limits in shadow, window offsets,
///   queues with `nodelay` and a maximum wait), at random gaps from nothing to seconds:
///   every [`Decision`] must equal the in-memory store's (its [`Source`] aside).
///
/// `make` builds a fresh store that reads its time from the clock it is given (a network
/// store that takes time from its server needs a setting for this, as
/// [`RedisBuilder::clock`](crate::store::RedisBuilder::clock)); the clock moves in whole
/// microseconds, the resolution of Redis's `TIME`. Policies the store
/// refuses in [`Store::supports`] are skipped. Keys are `String`s unique to each run, so
/// a shared server needs no cleaning between runs.
///
/// Runs inside a tokio runtime; a multi-threaded one makes the racing tasks run on
/// several threads at once.
///
/// ```
/// use tollgate::store::{conformance, MemoryStore};
/// use tollgate::{Limit, Quota};
///
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async {
/// let policy = Limit::token_bucket(Quota::per_second(1)?)?;
/// conformance::check(|clock| {
///     Ok::<_, tollgate::ConfigError>(MemoryStore::new(policy.clone()).with_clock(clock))
/// })
/// .await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub async fn check<S, E, F>(mut make: F) -> Result<(), ConformanceError>
where
    S: Store<String>,
    E: fmt::Display,
    F: FnMut(ManualClock) -> Result<S, E>,
{
    let run = run_id();
    race(&mut make, run).await?;
    refund(&mut make, run).await?;
    for seq in 0..SEQUENCES {
        sequence(&mut make, run, seq).await?;
    }
    Ok(())
}

/// A tag that makes this run's keys its own.
fn run_id() -> u64 {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64 ^ d.as_secs());
    Rng(nanos ^ u64::from(std::process::id()) << 32 ^ RUNS.fetch_add(1, Ordering::Relaxed)).next()
}

/// splitmix64: the sequences are the same on every run and machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

/// A random limit of any algorithm, or `None` for a combination the constructors refuse.
fn limit(rng: &mut Rng) -> Option<Limit> {
    let quota = Quota::new(rng.range(1, 40), Duration::from_millis(rng.range(1, 3_000))).ok()?;
    let offset = Duration::from_micros(rng.range(0, 5_000_000));
    let queue = rng.range(0, 8) as u32;
    let nodelay = (rng.range(0, 8) as u32).min(queue);
    let limit = match rng.range(0, 6) {
        0 => Limit::token_bucket(quota.with_burst(rng.range(1, 20)).ok()?),
        1 => Limit::leaky_meter(quota),
        2 => Limit::leaky_queue_nodelay(quota, queue, nodelay),
        3 => Limit::leaky_queue_nodelay(quota, queue, nodelay)
            .and_then(|l| l.with_max_wait(offset * 40)),
        4 => Limit::fixed_window(quota).and_then(|l| l.with_window_offset(offset)),
        _ => Limit::sliding_window(quota).and_then(|l| l.with_window_offset(offset)),
    }
    .ok()?;
    // One limit in five in shadow: never refuses, charged when it admits.
    Some(if rng.range(0, 5) == 0 {
        limit.shadow()
    } else {
        limit
    })
}

/// A random policy of one to three limits that `store` supports.
fn policy<S: Store<String>>(rng: &mut Rng, store: &S) -> Result<Policy, ConformanceError> {
    let mut refused = Vec::new();
    for _ in 0..200 {
        let limits: Option<Vec<Limit>> = (0..rng.range(1, 4)).map(|_| limit(rng)).collect();
        let Some(policy) = limits.and_then(|l| Policy::from_limits(l).ok()) else {
            continue;
        };
        match store.supports(&policy) {
            Ok(()) => return Ok(policy),
            Err(e) => refused.push(e.to_string()),
        }
    }
    Err(fail(format!(
        "the store refused every policy offered ({} of them), e.g.: {}",
        refused.len(),
        refused.first().map_or("-", String::as_str)
    )))
}

fn build<S, E: fmt::Display>(
    make: &mut impl FnMut(ManualClock) -> Result<S, E>,
    clock: ManualClock,
) -> Result<S, ConformanceError> {
    make(clock).map_err(|e| fail(format!("building the store failed: {e}")))
}

/// One random sequence, on a fresh store and clock, against the in-memory store.
async fn sequence<S: Store<String>, E: fmt::Display>(
    make: &mut impl FnMut(ManualClock) -> Result<S, E>,
    run: u64,
    seq: u64,
) -> Result<(), ConformanceError> {
    let mut rng = Rng(seq.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x7011_6a7e);
    // Any time from 2020 on, to the microsecond (a store may keep time as Redis's `TIME`
    // gives it): windows meet every alignment.
    let start = Duration::from_micros(1_577_836_800_000_000 + rng.range(0, 1 << 48));
    let clock = ManualClock::at(start);
    let store = build(make, clock.clone())?;
    let policies = (0..rng.range(1, 4))
        .map(|_| policy(&mut rng, &store))
        .collect::<Result<Vec<_>, _>>()?;
    let mem = MemoryStore::<String, _>::new(policies[0].clone()).with_clock(clock.clone());
    let keys: Vec<String> = (0..3)
        .map(|k| format!("tollgate-conformance-{run:x}-{seq}-{k}"))
        .collect();
    let mut log: Vec<Step> = Vec::new();
    let mut elapsed = 0;
    for i in 0..rng.range(1, MAX_OPS + 1) {
        let gap = match rng.range(0, 3) {
            0 => 0,
            1 => rng.range(0, 2_000),
            _ => rng.range(0, 400_000),
        };
        clock.advance(Duration::from_micros(gap));
        elapsed += gap;
        let cost = if rng.range(0, 9) < 8 {
            rng.range(0, 4)
        } else {
            rng.range(4, 60)
        };
        // Mostly one policy for a while, then another.
        let which = if rng.range(0, 7) < 6 {
            0
        } else {
            rng.range(0, 3) as usize
        } % policies.len();
        let k = rng.range(0, 3) as usize;
        let (policy, key) = (&policies[which], &keys[k]);
        let op = Op::pick(&mut rng, cost);
        log.push(Step {
            i,
            at_us: elapsed,
            key: k,
            op,
            cost,
            policy: which,
        });
        let report = |what: String| {
            let written: Vec<String> = policies
                .iter()
                .enumerate()
                .map(|(n, p)| format!("#{n} `{p}`"))
                .collect();
            let on_key: Vec<String> = log
                .iter()
                .filter(|s| s.key == k)
                .map(Step::to_string)
                .collect();
            // The headline, the input, then the answers.
            let (what, answers) = what.split_once('\n').unwrap_or((&what, ""));
            fail(format!(
                "conformance check `sequences` failed: sequence {seq}, operation #{i}: {what}\n  \
                 policies: {}\n  key {k}: {}{}{answers}",
                written.join(", "),
                on_key.join("; "),
                if answers.is_empty() { "" } else { "\n" },
            ))
        };
        let store_err = |e: StoreError| report(format!("the store failed: {e}"));
        match op {
            Op::Decide => {
                let expected = mem.decide(key, policy, cost).await.map_err(store_err)?;
                let got = match store.decide_now(key, policy, cost) {
                    Some(d) => d,
                    None => store.decide(key, policy, cost).await.map_err(store_err)?,
                };
                same(expected, got).map_err(report)?;
            }
            Op::Preview => {
                let expected = mem.preview(key, policy, cost).await.map_err(store_err)?;
                let got = store.preview(key, policy, cost).await.map_err(store_err)?;
                same(expected, got).map_err(report)?;
            }
            Op::Settle { actual } => {
                Store::settle(&mem, key, policy, cost, actual)
                    .await
                    .map_err(store_err)?;
                store
                    .settle(key, policy, cost, actual)
                    .await
                    .map_err(store_err)?;
            }
            Op::Reset => {
                Store::reset(&mem, key).await.map_err(store_err)?;
                store.reset(key).await.map_err(store_err)?;
            }
            Op::Ban(ban) => {
                Store::ban(&mem, key, policy, ban)
                    .await
                    .map_err(store_err)?;
                store.ban(key, policy, ban).await.map_err(store_err)?;
            }
        }
    }
    Ok(())
}

/// An operation of a sequence as a report shows it.
struct Step {
    i: u64,
    /// Time since the sequence began, in microseconds.
    at_us: u64,
    key: usize,
    op: Op,
    cost: u64,
    policy: usize,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (i, cost) = (self.i, self.cost);
        write!(f, "#{i} at +{:?} ", Duration::from_micros(self.at_us))?;
        match self.op {
            Op::Decide => write!(f, "decide cost {cost}")?,
            Op::Preview => write!(f, "preview of cost {cost}")?,
            Op::Settle { actual } => write!(f, "settle a reservation of {cost} at {actual}")?,
            Op::Reset => return f.write_str("reset"),
            Op::Ban(ban) => write!(f, "ban for {ban:?}")?,
        }
        write!(f, " under #{}", self.policy)
    }
}

/// One operation of a sequence.
#[derive(Debug, Clone, Copy)]
enum Op {
    Decide,
    Preview,
    /// A reservation of the operation's cost settled at `actual`.
    Settle {
        actual: u64,
    },
    Reset,
    Ban(Duration),
}

impl Op {
    fn pick(rng: &mut Rng, cost: u64) -> Op {
        match rng.range(0, 14) {
            0..=6 => Op::Decide,
            7 | 8 => Op::Preview,
            // Settled at nothing: the whole reservation given back.
            9 => Op::Settle { actual: 0 },
            10 => Op::Settle {
                actual: cost * 2 + 1,
            },
            11 => Op::Settle { actual: cost / 2 },
            12 => Op::Reset,
            _ => Op::Ban(Duration::from_micros(cost * 1_700 + 3)),
        }
    }
}

/// Whether two decisions are the same, their source aside; if not, both on a line each
/// and where they differ first.
fn same(expected: Decision, got: Decision) -> Result<(), String> {
    let (expected, got) = (
        expected.with_source(Source::Local),
        got.with_source(Source::Local),
    );
    if expected == got {
        return Ok(());
    }
    Err(format!(
        "the decisions differ\n  in memory:  {}\n  this store: {}\n  first difference: {}",
        Shown(&expected),
        Shown(&got),
        first_difference(&expected, &got)
    ))
}

/// A decision on one line: its outcome, then each limit's report.
struct Shown<'a>(&'a Decision);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        match d.outcome() {
            Outcome::Allowed { wait } if wait.is_zero() => f.write_str("admitted")?,
            Outcome::Allowed { wait } => write!(f, "admitted after a wait of {wait:?}")?,
            Outcome::Denied { retry_after } => write!(f, "refused, retry after {retry_after:?}")?,
            Outcome::Exceeds => f.write_str("refused: the cost exceeds what a limit holds")?,
        }
        if let Some(r) = d.retry_after().filter(|_| d.shadowed()) {
            write!(f, " (a limit in shadow would refuse for {r:?})")?;
        }
        for l in d.limits() {
            write!(
                f,
                "; #{} {}remaining {}, next in {:?}, full in {:?}",
                l.index(),
                if l.allowed() { "" } else { "refusing, " },
                l.remaining(),
                l.next_after(),
                l.reset_after()
            )?;
        }
        Ok(())
    }
}

/// The first part two different decisions differ in, in words.
fn first_difference(expected: &Decision, got: &Decision) -> String {
    let both =
        |what: &str, a: String, b: String| format!("{what}, {a} in memory, {b} in this store");
    if expected.outcome() != got.outcome() {
        return both(
            "the outcome",
            format!("{:?}", expected.outcome()),
            format!("{:?}", got.outcome()),
        );
    }
    if expected.limits().len() != got.limits().len() {
        return both(
            "the number of limits reported",
            expected.limits().len().to_string(),
            got.limits().len().to_string(),
        );
    }
    for (a, b) in expected.limits().iter().zip(got.limits()) {
        let i = a.index();
        let parts = [
            ("index", a.index().to_string(), b.index().to_string()),
            ("admits", a.allowed().to_string(), b.allowed().to_string()),
            (
                "remaining",
                a.remaining().to_string(),
                b.remaining().to_string(),
            ),
            (
                "next unit in",
                format!("{:?}", a.next_after()),
                format!("{:?}", b.next_after()),
            ),
            (
                "full in",
                format!("{:?}", a.reset_after()),
                format!("{:?}", b.reset_after()),
            ),
        ];
        if let Some((what, x, y)) = parts.into_iter().find(|(_, x, y)| x != y) {
            return both(&format!("limit #{i}'s {what}"), x, y);
        }
        if a != b {
            return format!("limit #{i}'s name");
        }
    }
    both(
        "what limits in shadow would have answered",
        format!("{:?}", expected.retry_after()),
        format!("{:?}", got.retry_after()),
    )
}

/// A refund, which a store may apply in the background (so it is checked apart from the
/// sequences, where it could land after the operations that follow it): a key charged 4
/// units under a token bucket and a window, then refunded, shows in a preview as fresh
/// again within 2 s.
async fn refund<S: Store<String>, E: fmt::Display>(
    make: &mut impl FnMut(ManualClock) -> Result<S, E>,
    run: u64,
) -> Result<(), ConformanceError> {
    let clock = ManualClock::at(Duration::from_secs(1_800_000_000));
    let store = build(make, clock.clone())?;
    let limits = [
        Quota::per_minute(10).and_then(Limit::token_bucket),
        Quota::per_hour(100).and_then(Limit::fixed_window),
    ];
    let limits = limits.into_iter().collect::<Result<Vec<_>, _>>();
    let policy = limits
        .and_then(Policy::from_limits)
        .map_err(|e| fail(e.to_string()))?;
    if let Err(e) = store.supports(&policy) {
        return Err(fail(format!(
            "the store refused 10/min and 100/h window: {e}"
        )));
    }
    let mem = MemoryStore::<String, _>::new(policy.clone()).with_clock(clock.clone());
    let key = format!("tollgate-conformance-{run:x}-refund");
    let report = |what: String| {
        fail(format!(
            "conformance check `refund` failed: 4 units decided, then refunded 1 ms later, on \
             one key under `{policy}`: {what}"
        ))
    };
    let store_err = |e: StoreError| report(format!("the store failed: {e}"));
    let charged = mem.decide(&key, &policy, 4).await.map_err(store_err)?;
    same(
        charged,
        store.decide(&key, &policy, 4).await.map_err(store_err)?,
    )
    .map_err(report)?;
    clock.advance(Duration::from_millis(1));
    Store::refund(&mem, &key, &policy, 4);
    store.refund(&key, &policy, 4);
    let expected = mem.preview(&key, &policy, 1).await.map_err(store_err)?;
    let since = Instant::now();
    loop {
        let got = store.preview(&key, &policy, 1).await.map_err(store_err)?;
        match same(expected, got) {
            Ok(()) => return Ok(()),
            Err(e) if since.elapsed() > REFUND_WITHIN => {
                return Err(report(format!(
                    "it did not show within {REFUND_WITHIN:?}: {e}"
                )))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
}

/// Tasks racing to spend one key's units at a frozen instant admit exactly the burst.
async fn race<S: Store<String>, E: fmt::Display>(
    make: &mut impl FnMut(ManualClock) -> Result<S, E>,
    run: u64,
) -> Result<(), ConformanceError> {
    let clock = ManualClock::at(Duration::from_secs(1_800_000_000));
    let store = Arc::new(build(make, clock.clone())?);
    let quota = Quota::per_hour(1).and_then(|q| q.with_burst(RACE_BURST));
    let policy = Arc::new(Policy::new(
        quota
            .and_then(Limit::token_bucket)
            .map_err(|e| fail(e.to_string()))?,
    ));
    if let Err(e) = store.supports(&policy) {
        return Err(fail(format!(
            "the store refused a token bucket of 1/h burst 64: {e}"
        )));
    }
    let key = Arc::new(format!("tollgate-conformance-{run:x}-race"));
    let tasks: Vec<_> = (0..RACERS)
        .map(|_| {
            let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
            tokio::spawn(async move {
                let mut admitted = 0u64;
                // Bounded: a store that never refuses is reported, not waited on.
                for _ in 0..=RACE_BURST {
                    let d = match store.decide_now(&key, &policy, 1) {
                        Some(d) => d,
                        None => store.decide(&key, &policy, 1).await?,
                    };
                    if !d.is_allowed() {
                        break;
                    }
                    admitted += 1;
                    tokio::task::yield_now().await;
                }
                Ok::<u64, StoreError>(admitted)
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += task
            .await
            .map_err(|e| fail(format!("a racing task failed: {e}")))?
            .map_err(|e| fail(format!("the store failed in the race: {e}")))?;
    }
    if admitted != RACE_BURST {
        return Err(fail(format!(
            "conformance check `race` failed: {RACERS} tasks racing on one key at a frozen \
             instant under `{policy}` were admitted {admitted} units of a burst of \
             {RACE_BURST}: a decision must read, decide and write atomically"
        )));
    }
    Ok(())
}
