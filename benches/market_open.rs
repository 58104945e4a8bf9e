//! A market-open thundering herd, scaled to one machine: `INSTANCES` limiter instances in
//! one process (each with its own Redis connection) share one Redis; requests come from
//! 1.4 M clients; the offered load is steady, then jumps 15x within 200 ms and holds (an
//! API at the market open: 285 000 requests per second against a backend that serves
//! 80 000). Each request is checked against its client's limit (200/s, burst 400: never
//! binding, the herd being many clients each within its limit) and a global limit (the
//! backend's capacity, 0.28 of the peak). The load is open-loop: requests are sent on
//! schedule whether or not earlier ones have been answered, so a slow limiter shows as
//! latency.
//!
//! ```sh
//! cargo bench -p tollgate-benches --features redis --bench market_open    # starts its own redis-server
//! ```
//!
//! Modes: every decision a Redis call, failing open past an 8 ms deadline (the common
//! setup, which lets requests through unchecked once Redis cannot keep up); the same
//! falling back locally (the default failure policy: each key from the state Redis last
//! returned, at 1/N of each quota with N the instances counted on Redis, charged to Redis
//! when it answers again); both again with the concurrent calls of a connection batched
//! into one script call (`.batching(..)`, the default); and local-first, deciding in
//! memory and reconciling every 200 ms (per-client state kept local). Reported: the
//! limiter's latency per request (both checks), Redis commands per second, and the
//! admitted rate during the peak against the global limit.
//! `MARKET_STEADY`, `MARKET_PEAK`, `MARKET_INSTANCES` and `MARKET_MODES` (a comma-separated
//! list of substrings of the mode names) override the defaults.

#[path = "../tests/support/redis.rs"]
mod support;

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use tollgate::decision::Source;
use tollgate::store::{FailurePolicy, LocalFirstStore, RedisConnection, RedisStore};
use tollgate::Decision;
use tollgate::Limit;
use tollgate::Quota;

const CLIENTS: u64 = 1_400_000;
const STEADY_FOR: Duration = Duration::from_secs(1);
const RAMP: Duration = Duration::from_millis(200);
const PEAK_FOR: Duration = Duration::from_millis(1800);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One instance's two limiters.
enum Instance {
    Redis {
        client: RedisStore,
        global: RedisStore,
    },
    LocalFirst {
        client: LocalFirstStore,
        global: LocalFirstStore,
    },
}

impl Instance {
    /// Both checks of one request: admitted, and whether a decision was degraded (made
    /// without Redis on a path that should have asked it).
    async fn decide(&self, client_id: u64) -> (bool, bool) {
        let key = client_id.to_le_bytes();
        let key = key.as_slice();
        let (a, b): (Decision, Decision) = match self {
            Instance::Redis { client, global } => {
                let a = client
                    .check(key, 1)
                    .await
                    .expect("the failure policy answers");
                if !a.is_allowed() {
                    return (false, degraded(&a));
                }
                let b = global
                    .check(b"global".as_slice(), 1)
                    .await
                    .expect("answered");
                (a, b)
            }
            Instance::LocalFirst { client, global } => {
                let a = client.check_local(key, 1);
                if !a.is_allowed() {
                    return (false, false);
                }
                (a, global.check_local(b"global".as_slice(), 1))
            }
        };
        (b.is_allowed(), degraded(&a) || degraded(&b))
    }
}

impl Instance {
    /// Whether the fallback (if any) counts `n` instances.
    fn counts(&self, n: usize) -> bool {
        let share = |s: &RedisStore| s.fallback_share().is_none_or(|x| x == 1.0 / n as f64);
        match self {
            Instance::Redis { client, global } => share(client) && share(global),
            Instance::LocalFirst { .. } => true,
        }
    }
}

fn degraded(d: &Decision) -> bool {
    matches!(
        d.source(),
        Source::Fallback | Source::FailOpen | Source::FailClosed
    )
}

#[derive(Clone, Copy)]
enum Mode {
    FailOpen,
    Fallback,
    BatchedFailOpen,
    BatchedFallback,
    LocalFirst,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::FailOpen => "per request, fail open past 8 ms",
            Mode::Fallback => "per request, fallback at the fleet's 1/N past 8 ms",
            Mode::BatchedFailOpen => "batched, fail open past 8 ms",
            Mode::BatchedFallback => "batched, fallback at the fleet's 1/N past 8 ms",
            Mode::LocalFirst => "local-first, reconciled every 200 ms",
        }
    }
}

async fn instance(url: &str, mode: Mode, ns: &str, global: Limit) -> Instance {
    let client_limit =
        Limit::token_bucket(Quota::per_second(200).unwrap().with_burst(400).unwrap()).unwrap();
    let conn = RedisConnection::connect(url).await.unwrap();
    let failure = match mode {
        Mode::FailOpen | Mode::BatchedFailOpen => FailurePolicy::FailOpen,
        _ => FailurePolicy::default(),
    };
    let batching = matches!(mode, Mode::BatchedFailOpen | Mode::BatchedFallback);
    let builder = |limit: Limit, part: &str| {
        RedisStore::builder("market", limit)
            .namespace(format!("{ns}-{part}"))
            .deadline(Duration::from_millis(8))
            .failure_policy(failure)
            .batching(batching)
    };
    match mode {
        Mode::LocalFirst => {
            let every = Duration::from_millis(200);
            let client = builder(client_limit, "client")
                .build_local_first(conn.clone(), every)
                .unwrap();
            let global = builder(global, "global")
                .build_local_first(conn, every)
                .unwrap();
            client.start();
            global.start();
            Instance::LocalFirst { client, global }
        }
        _ => Instance::Redis {
            client: builder(client_limit, "client").build(conn.clone()).unwrap(),
            global: builder(global, "global").build(conn).unwrap(),
        },
    }
}

/// The offered rate at `t` since the start.
fn rate_at(t: Duration, steady: u64, peak: u64) -> u64 {
    if t < STEADY_FOR {
        steady
    } else if t < STEADY_FOR + RAMP {
        let f = (t - STEADY_FOR).as_secs_f64() / RAMP.as_secs_f64();
        steady + ((peak - steady) as f64 * f) as u64
    } else {
        peak
    }
}

fn total_commands(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_connection().unwrap();
    let info: String = redis::cmd("INFO").arg("stats").query(&mut conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

struct Outcome {
    sent: u64,
    latencies_us: Vec<u64>,
    commands_per_s: f64,
    peak_admitted_per_s: f64,
    degraded: u64,
}

async fn run(url: &str, mode: Mode, n: usize, steady: u64, peak: u64, global: u64) -> Outcome {
    let ns = format!("market-{}-{}", std::process::id(), mode as u8);
    let global_limit = Limit::token_bucket(
        Quota::per_second(global)
            .unwrap()
            .with_burst(global / 10)
            .unwrap(),
    )
    .unwrap();
    let mut instances = Vec::new();
    for _ in 0..n {
        instances.push(Arc::new(
            instance(url, mode, &ns, global_limit.clone()).await,
        ));
    }
    // The fallback's share: every instance counted by every other.
    let counted = Instant::now();
    while !instances.iter().all(|i| i.counts(n)) {
        assert!(
            counted.elapsed() < Duration::from_secs(5),
            "fleet not counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let peak_admitted = Arc::new(AtomicU64::new(0));
    let degraded = Arc::new(AtomicU64::new(0));
    let before = total_commands(url);
    let start = Instant::now();
    let end = STEADY_FOR + RAMP + PEAK_FOR;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let (mut sent, mut owed) = (0u64, 0.0f64);
    let mut tasks = Vec::new();
    loop {
        tick.tick().await;
        let t = start.elapsed();
        if t >= end {
            break;
        }
        owed += rate_at(t, steady, peak) as f64 / 1000.0;
        while owed >= 1.0 {
            owed -= 1.0;
            sent += 1;
            // A pseudo-random client of 1.4 M: most send once or twice.
            let client = sent.wrapping_mul(0x9E37_79B9_7F4A_7C15) % CLIENTS;
            let inst = Arc::clone(&instances[(sent % n as u64) as usize]);
            let (latencies, peak_admitted, degraded) =
                (latencies.clone(), peak_admitted.clone(), degraded.clone());
            let in_peak = t >= STEADY_FOR + RAMP;
            tasks.push(tokio::spawn(async move {
                let t0 = Instant::now();
                let (admitted, was_degraded) = inst.decide(client).await;
                let us = t0.elapsed().as_micros() as u64;
                latencies.lock().unwrap().push(us);
                if admitted && in_peak {
                    peak_admitted.fetch_add(1, Ordering::Relaxed);
                }
                if was_degraded {
                    degraded.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let commands = total_commands(url) - before;
    let mut latencies_us = std::mem::take(&mut *latencies.lock().unwrap());
    latencies_us.sort_unstable();
    Outcome {
        sent,
        latencies_us,
        commands_per_s: commands as f64 / elapsed,
        peak_admitted_per_s: peak_admitted.load(Ordering::Relaxed) as f64 / PEAK_FOR.as_secs_f64(),
        degraded: degraded.load(Ordering::Relaxed),
    }
}

fn pct(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(target) = support::Target::get() else {
        println!("market-open bench skipped: no redis-server (install it or set REDIS_URL)");
        return;
    };
    let url = target.url();
    let n = env_u64("MARKET_INSTANCES", 4) as usize;
    let steady = env_u64("MARKET_STEADY", 1_000);
    let peak = env_u64("MARKET_PEAK", 15 * steady);
    // The backend's capacity: 0.28 of the peak, as 80 000 requests per second of 285 000.
    let global = peak * 28 / 100;
    let only = std::env::var("MARKET_MODES").ok();
    println!(
        "{n} instances, {CLIENTS} clients, {steady}/s for 1 s, then {peak}/s within 200 ms for 1.8 s; \
         per client 200/s burst 400; global limit {global}/s burst {}",
        global / 10
    );
    println!();
    println!("| mode | requests | limiter p50 | p99 | max | Redis commands/s | admitted/s at peak vs global limit | degraded (fallback, fail-open) |");
    println!("|---|---|---|---|---|---|---|---|");
    for mode in [
        Mode::FailOpen,
        Mode::Fallback,
        Mode::BatchedFailOpen,
        Mode::BatchedFallback,
        Mode::LocalFirst,
    ] {
        if let Some(only) = &only {
            if !only.split(',').any(|o| mode.name().contains(o)) {
                continue;
            }
        }
        let o = run(&url, mode, n, steady, peak, global).await;
        println!(
            "| {} | {} | {} us | {} us | {} us | {:.0} | {:.0} ({:.2}x) | {} |",
            mode.name(),
            o.sent,
            pct(&o.latencies_us, 0.5),
            pct(&o.latencies_us, 0.99),
            o.latencies_us.last().copied().unwrap_or(0),
            o.commands_per_s,
            o.peak_admitted_per_s,
            o.peak_admitted_per_s / global as f64,
            o.degraded,
        );
        // Let the previous mode's background work and Redis settle.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
