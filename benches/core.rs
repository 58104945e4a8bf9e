//! The core keyed check, tollgate's [`MemoryStore`] against `governor`'s keyed limiter
//! (`RateLimiter::keyed`: DashMap state, its default clock), both with their real clocks and
//! the same key type (`u32`).
//!
//! Two ways to run it, both measuring the very same closures:
//!
//! - `cargo bench -p tollgate-benches --bench core`: criterion, one group per figure with `tollgate` and
//!   `governor` side by side.
//! - `TOLLGATE_RATIOS=<filter> cargo bench -p tollgate-benches --bench core`: the interleaved ratio table used
//!   in `BENCHMARKS.md`. Every round times one batch of each contender, alternating which
//!   goes first, so both see the same machine noise; a row reports both medians (ns per
//!   request), the median of the per-round ratios (tollgate / governor) and their spread
//!   (25th..75th percentile), and the ratio of the two fastest rounds (the least disturbed).
//!   `<filter>` is a substring of the row names (empty: every row).
//!
//! Workloads:
//!
//! - `1key`: one key, pre-inserted. `1M`: 1 000 000 keys, pre-inserted, visited in a
//!   stride order (a permutation, every key once per lap; the hash scatters them in memory).
//! - `allow`: a quota so generous that every request is admitted (and charged).
//!   `deny`: a quota exhausted during setup (one request per hour), every request refused.
//! - `2thr`: two threads; `hot` is both on one key (contended compare-and-swap), `spread`
//!   is each thread on its own half of the 1 M keys. The figure is the CPU time per request
//!   per thread (the mean of the two threads).
//!
//! Every batch is timed with the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), so time
//! spent descheduled by other jobs on a shared machine does not count.
//!
//! - `refusal/*`: a refusal against an admission of the same limiter (the `deny` and
//!   `allow` workloads above), interleaved the same way.
//! - `clock/*`: one read of each clock against governor's (quanta's TSC read): tollgate's
//!   default (`now`), tokio's `Instant`, std's `Instant`, the OS's coarse clock, `TscClock`
//!   (feature `tsc`), and tokio's `Instant` between cache misses.
//!
//! The tollgate side keeps the whole [`tollgate::Decision`] alive (`black_box`), so the
//! reports it carries (remaining, reset, next unit) are computed: governor's allow path
//! returns `()` and its refusal a small snapshot.

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use governor::clock::{Clock as _, Reference as _};
use governor::DefaultKeyedRateLimiter;
use governor::Quota as GQuota;
use governor::RateLimiter;
use tollgate::{clock::Clock as _, store::MemoryStore, Limit, Quota};

/// This thread's CPU time. Batches are timed with it, not with the wall clock: on a
/// machine shared with other jobs, the time a batch spends descheduled is not its cost.
/// Whether this run counts instructions under valgrind rather than timing.
static PROFILING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn cpu() -> Duration {
    // rustix reads the clock through the vDSO, which it finds in a way valgrind does not
    // support: profiled runs (`TOLLGATE_PROFILE`) do not time.
    if PROFILING.load(std::sync::atomic::Ordering::Relaxed) {
        return Duration::ZERO;
    }
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Keys in the large workloads.
const KEYS: u32 = 1_000_000;
/// Coprime with `KEYS`: `k -> k + STRIDE mod KEYS` visits every key once per lap.
const STRIDE: u32 = 611_953;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Allow,
    Deny,
}

/// A batch of `n` requests; returns the time it took.
type Batch = Box<dyn FnMut(u64) -> Duration>;

struct Case {
    name: &'static str,
    /// What the two columns are; `tollgate` / `governor` except for the self-comparisons.
    labels: (&'static str, &'static str),
    tollgate: Batch,
    governor: Batch,
}

fn tollgate_store(mode: Mode, keys: u32) -> Arc<MemoryStore<u32>> {
    let (quota, charge) = match mode {
        // T = 10 ns, burst 2^36 (tau ~ 11 min). Setup charges 2^33 units (~86 s), so every
        // key stays in the table (a key back to fresh may be swept on the next insert).
        Mode::Allow => (
            Quota::per_second(100_000_000)
                .unwrap()
                .with_burst(1 << 36)
                .unwrap(),
            1 << 33,
        ),
        Mode::Deny => (Quota::per_hour(1).unwrap(), 1),
    };
    // 1 M keys of this type take about 36 MB: more than the default budget.
    let store = MemoryStore::new(Limit::token_bucket(quota).unwrap())
        .with_max_bytes(64 << 20)
        .unwrap();
    for k in 0..keys {
        assert!(store.check(&k, charge).is_allowed());
    }
    assert_eq!(store.len(), keys as usize, "a pre-inserted key was swept");
    let probe = store.check(&0, 1).is_allowed();
    assert_eq!(probe, mode == Mode::Allow);
    Arc::new(store)
}

fn governor_limiter(mode: Mode, keys: u32) -> Arc<DefaultKeyedRateLimiter<u32>> {
    let quota = match mode {
        Mode::Allow => GQuota::with_period(Duration::from_nanos(10))
            .unwrap()
            .allow_burst(NonZeroU32::MAX),
        Mode::Deny => GQuota::per_hour(NonZeroU32::new(1).unwrap()),
    };
    let limiter = RateLimiter::keyed(quota);
    for k in 0..keys {
        assert!(limiter.check_key(&k).is_ok());
    }
    assert_eq!(limiter.len(), keys as usize);
    assert_eq!(limiter.check_key(&0).is_ok(), mode == Mode::Allow);
    Arc::new(limiter)
}

/// `n` requests from one thread, keys `0..keys` in stride order starting at `*k`.
#[inline(always)]
fn run<F: FnMut(&u32)>(n: u64, keys: u32, k: &mut u32, mut check: F) -> Duration {
    let start = cpu();
    for _ in 0..n {
        check(black_box(k));
        if keys > 1 {
            *k += STRIDE;
            if *k >= keys {
                *k -= keys;
            }
        }
    }
    cpu() - start
}

fn tollgate_single(mode: Mode, keys: u32) -> Batch {
    let store = tollgate_store(mode, keys);
    let mut k = 0;
    Box::new(move |n| {
        run(n, keys, &mut k, |k| {
            black_box(store.check(k, 1));
        })
    })
}

fn governor_single(mode: Mode, keys: u32) -> Batch {
    let limiter = governor_limiter(mode, keys);
    let mut k = 0;
    Box::new(move |n| {
        run(n, keys, &mut k, |k| {
            let _ = black_box(limiter.check_key(k));
        })
    })
}

/// A refusal against an admission, for one limiter.
fn refusal(governor: bool, keys: u32) -> (Batch, Batch) {
    if governor {
        (
            governor_single(Mode::Deny, keys),
            governor_single(Mode::Allow, keys),
        )
    } else {
        (
            tollgate_single(Mode::Deny, keys),
            tollgate_single(Mode::Allow, keys),
        )
    }
}

fn single(mode: Mode, keys: u32) -> (Batch, Batch) {
    (tollgate_single(mode, keys), governor_single(mode, keys))
}

/// Admitted requests over `keys` keys, tollgate on the opt-in TSC clock (feature `tsc`,
/// governor's clock source) instead of its default tokio clock.
#[cfg(feature = "tsc")]
fn single_tsc(keys: u32) -> (Batch, Batch) {
    let quota = Quota::per_second(100_000_000)
        .unwrap()
        .with_burst(1 << 36)
        .unwrap();
    let store = MemoryStore::<u32, _>::new(Limit::token_bucket(quota).unwrap())
        .with_max_bytes(64 << 20)
        .unwrap()
        .with_clock(tollgate::clock::TscClock::new());
    for k in 0..keys {
        assert!(store.check(&k, 1 << 33).is_allowed());
    }
    assert_eq!(store.len(), keys as usize, "a pre-inserted key was swept");
    let mut k = 0;
    let ours: Batch = Box::new(move |n| {
        run(n, keys, &mut k, |k| {
            black_box(store.check(k, 1));
        })
    });
    (ours, governor_single(Mode::Allow, keys))
}

/// Two threads of `n` requests each, started together; the mean of their CPU times.
fn two_threads<S, F>(shared: &Arc<S>, n: u64, keys: u32, check: F) -> Duration
where
    S: Send + Sync + 'static,
    F: Fn(&S, &u32) + Copy + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2u32)
        .map(|t| {
            let shared = Arc::clone(shared);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                // Each thread walks its own half of the keys (or the one hot key).
                let half = keys / 2;
                let mut k = if keys > 1 { t * half } else { 0 };
                barrier.wait();
                let start = cpu();
                for i in 0..n {
                    check(&shared, black_box(&k));
                    if keys > 1 {
                        k = t * half + ((i as u32).wrapping_mul(STRIDE) % half);
                    }
                }
                cpu() - start
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .sum::<Duration>()
        / 2
}

fn threaded(mode: Mode, keys: u32) -> (Batch, Batch) {
    let store = tollgate_store(mode, keys);
    let limiter = governor_limiter(mode, keys);
    (
        Box::new(move |n| {
            two_threads(&store, n, keys, |s, k| {
                black_box(s.check(k, 1));
            })
        }),
        Box::new(move |n| {
            two_threads(&limiter, n, keys, |l, k| {
                let _ = black_box(l.check_key(k));
            })
        }),
    )
}

/// A batch of `n` reads of a clock.
fn reads<T>(now: impl Fn() -> T + 'static) -> Batch {
    Box::new(move |n| {
        let start = cpu();
        for _ in 0..n {
            black_box(now());
        }
        cpu() - start
    })
}

/// The clocks alone: tollgate's default clock against governor's default clock (the TSC,
/// through quanta). Built as users build tollgate (no tokio `test-util`), the default
/// clock reads the counter too; the assertion says so.
fn clocks() -> (Batch, Batch) {
    let ours =
        *MemoryStore::<u32>::new(Limit::token_bucket(Quota::per_second(1).unwrap()).unwrap())
            .clock();
    assert!(
        format!("{ours:?}").contains("Counter"),
        "the default clock reads tokio's Instant: this build has tokio's test-util"
    );
    let theirs = governor::clock::DefaultClock::default();
    (reads(move || ours.now()), reads(move || theirs.now()))
}

/// `tokio::time::Instant::elapsed`, the OS monotonic clock where tokio cannot pause (what
/// the default clock read before it read the counter), against governor's default clock.
fn tokio_clock() -> (Batch, Batch) {
    let ours = tokio::time::Instant::now();
    let theirs = governor::clock::DefaultClock::default();
    (
        reads(move || ours.elapsed().as_nanos() as u64),
        reads(move || theirs.now()),
    )
}

/// The OS's coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`: the time of the last
/// scheduler tick, a few ms steps), against governor's default clock.
fn coarse_clock() -> (Batch, Batch) {
    let theirs = governor::clock::DefaultClock::default();
    (
        reads(|| rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse).tv_nsec),
        reads(move || theirs.now()),
    )
}

/// Each clock read once per step of a loop that misses the cache and makes a
/// compare-and-swap per step (64 MB of cells visited in stride order), as a check on many
/// keys does: tokio's `Instant` (the OS clock), whose counter read waits for every earlier
/// load, against quanta's, which lets the next steps' misses overlap.
fn clocks_between_misses() -> (Batch, Batch) {
    use std::sync::atomic::{AtomicU64, Ordering};
    const CELLS: usize = 1 << 23;
    fn walk(cells: &[AtomicU64], k: &mut usize, n: u64, now: impl Fn() -> u64) -> Duration {
        let start = cpu();
        for _ in 0..n {
            let cell = &cells[*k];
            let old = cell.load(Ordering::Acquire);
            let t = now();
            let _ =
                cell.compare_exchange_weak(old, old.max(t), Ordering::AcqRel, Ordering::Acquire);
            *k = (*k + STRIDE as usize) & (CELLS - 1);
        }
        cpu() - start
    }
    let cells: Arc<[AtomicU64]> = (0..CELLS).map(|_| AtomicU64::new(0)).collect();
    let theirs_cells = Arc::clone(&cells);
    let ours = tokio::time::Instant::now();
    let theirs = governor::clock::DefaultClock::default();
    let t0 = theirs.now();
    let (mut a, mut b) = (0, 0);
    (
        Box::new(move |n| walk(&cells, &mut a, n, || ours.elapsed().as_nanos() as u64)),
        Box::new(move |n| {
            walk(&theirs_cells, &mut b, n, || {
                theirs.now().duration_since(t0).as_u64()
            })
        }),
    )
}

/// `std::time::Instant::elapsed` against governor's default clock.
fn std_clock() -> (Batch, Batch) {
    let ours = Instant::now();
    let theirs = governor::clock::DefaultClock::default();
    (
        reads(move || ours.elapsed().as_nanos() as u64),
        reads(move || theirs.now()),
    )
}

/// tollgate's opt-in `TscClock` (feature `tsc`) against governor's default clock, which
/// reads the same counter through the same quanta calibration.
#[cfg(feature = "tsc")]
fn tsc_clock() -> (Batch, Batch) {
    let ours = tollgate::clock::TscClock::new();
    let theirs = governor::clock::DefaultClock::default();
    (reads(move || ours.now()), reads(move || theirs.now()))
}

/// The key's hash alone: tollgate's (foldhash) against governor's DashMap default
/// (std `RandomState`, SipHash-1-3), on `Ipv4Addr`.
fn hashes() -> (Batch, Batch) {
    use std::hash::BuildHasher;
    let ours = foldhash::fast::RandomState::default();
    let theirs = std::hash::RandomState::new();
    let mut a = 0u32;
    let mut b = 0u32;
    (
        Box::new(move |n| {
            let start = cpu();
            for _ in 0..n {
                a = a.wrapping_add(STRIDE);
                black_box(ours.hash_one(black_box(Ipv4Addr::from(a))));
            }
            cpu() - start
        }),
        Box::new(move |n| {
            let start = cpu();
            for _ in 0..n {
                b = b.wrapping_add(STRIDE);
                black_box(theirs.hash_one(black_box(Ipv4Addr::from(b))));
            }
            cpu() - start
        }),
    )
}

type MakeCase = fn() -> (Batch, Batch);

const PEERS: (&str, &str) = ("tollgate", "governor");
const DENY_ALLOW: (&str, &str) = ("deny", "allow");

/// Every case, built lazily (the 1 M-key ones take a second each to fill).
fn cases() -> Vec<(&'static str, (&'static str, &'static str), MakeCase)> {
    #[allow(unused_mut)]
    let mut peers: Vec<(&'static str, MakeCase)> = vec![
        ("check/1key/allow", || single(Mode::Allow, 1)),
        ("check/1key/deny", || single(Mode::Deny, 1)),
        ("check/1M/allow", || single(Mode::Allow, KEYS)),
        ("check/1M/deny", || single(Mode::Deny, KEYS)),
        ("2thr/hot/allow", || threaded(Mode::Allow, 1)),
        ("2thr/hot/deny", || threaded(Mode::Deny, 1)),
        ("2thr/spread/allow", || threaded(Mode::Allow, KEYS)),
        ("clock/now", clocks),
        ("clock/tokio-instant", tokio_clock),
        ("clock/std-instant", std_clock),
        ("clock/coarse", coarse_clock),
        ("clock/between-misses", clocks_between_misses),
        ("hash/ipv4", hashes),
    ];
    #[cfg(feature = "tsc")]
    peers.extend([
        ("check/1key/allow/tsc", (|| single_tsc(1)) as MakeCase),
        ("check/1M/allow/tsc", || single_tsc(KEYS)),
        ("clock/tsc", tsc_clock),
    ]);
    let refusals: [(&'static str, MakeCase); 4] = [
        ("refusal/tollgate/1key", || refusal(false, 1)),
        ("refusal/tollgate/1M", || refusal(false, KEYS)),
        ("refusal/governor/1key", || refusal(true, 1)),
        ("refusal/governor/1M", || refusal(true, KEYS)),
    ];
    let tag = |labels| move |(name, make)| (name, labels, make);
    peers
        .into_iter()
        .map(tag(PEERS))
        .chain(refusals.into_iter().map(tag(DENY_ALLOW)))
        .collect()
}

fn build(filter: &str) -> impl Iterator<Item = Case> + '_ {
    cases()
        .into_iter()
        .filter(move |(name, _, _)| name.contains(filter))
        .map(|(name, labels, make)| {
            let (tollgate, governor) = make();
            Case {
                name,
                labels,
                tollgate,
                governor,
            }
        })
}

fn criterion_benches(c: &mut Criterion) {
    for mut case in build("") {
        let mut g = c.benchmark_group(case.name);
        if case.name.starts_with("2thr") {
            g.sample_size(30);
        }
        g.bench_function(case.labels.0, |b| b.iter_custom(&mut case.tollgate));
        g.bench_function(case.labels.1, |b| b.iter_custom(&mut case.governor));
        g.finish();
    }
}

criterion_group!(benches, criterion_benches);

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(v, 0.5)
}

/// The interleaved ratio table (see the module docs).
fn ratios(filter: &str) {
    const ROUNDS: usize = 101;
    let mut labels = None;
    for mut case in build(filter) {
        if labels != Some(case.labels) {
            labels = Some(case.labels);
            let (a, b) = case.labels;
            println!();
            println!("| figure | {a} ns | {b} ns | {a} / {b} (median of rounds) | p25..p75 | ratio of best rounds |");
            println!("|---|---|---|---|---|---|");
        }
        // Short samples fit between the other processes' time slices; the threaded cases
        // get longer ones to amortize the thread start.
        let sample = if case.name.starts_with("2thr") {
            Duration::from_millis(10)
        } else {
            Duration::from_millis(2)
        };
        // Calibrate the batch on the first contender, warming both up.
        let mut n = 100u64;
        loop {
            let t = (case.tollgate)(n);
            (case.governor)(n);
            if t >= sample / 4 {
                n = (n as f64 * sample.as_secs_f64() / t.as_secs_f64()).max(1.0) as u64;
                break;
            }
            n *= 4;
        }
        let (mut ts, mut gs, mut rs) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let (t, g) = if round % 2 == 0 {
                let t = (case.tollgate)(n);
                (t, (case.governor)(n))
            } else {
                let g = (case.governor)(n);
                ((case.tollgate)(n), g)
            };
            let (t, g) = (
                t.as_nanos() as f64 / n as f64,
                g.as_nanos() as f64 / n as f64,
            );
            ts.push(t);
            gs.push(g);
            rs.push(t / g);
        }
        let (t, g, r) = (median(&mut ts), median(&mut gs), median(&mut rs));
        println!(
            "| {} | {:.1} | {:.1} | {:.2} | {:.2}..{:.2} | {:.2} |",
            case.name,
            t,
            g,
            r,
            percentile(&rs, 0.25),
            percentile(&rs, 0.75),
            ts[0] / gs[0],
        );
    }
}

/// `TOLLGATE_PROFILE=<case> [TOLLGATE_PROFILE_WHO=tollgate|governor]
/// [TOLLGATE_PROFILE_N=1000000]`: one side's batch of the case named exactly, for
/// `bench/core_instructions.sh`.
fn profile(name: &str) {
    let n = std::env::var("TOLLGATE_PROFILE_N").map_or(1_000_000, |n| n.parse().unwrap());
    let who = std::env::var("TOLLGATE_PROFILE_WHO").unwrap_or_else(|_| "tollgate".into());
    PROFILING.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut case = build(name)
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case {name}"));
    let batch = if who == "governor" {
        &mut case.governor
    } else {
        &mut case.tollgate
    };
    black_box(batch(n));
}

fn main() {
    if let Ok(filter) = std::env::var("TOLLGATE_RATIOS") {
        ratios(&filter);
        return;
    }
    if let Ok(name) = std::env::var("TOLLGATE_PROFILE") {
        profile(&name);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
