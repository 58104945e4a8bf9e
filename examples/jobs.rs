//! Jobs, not requests: several worker processes drain one queue of jobs (a Redis list)
//! against one global limit of the API they call, each waiting its turn through Redis,
//! without dividing the limit by the number of workers.
//!
//! ```sh
//! cargo run --example jobs --features redis,upstream -- --redis REDIS_URL [--workers 3] [--jobs 100]
//! cargo run --example jobs --features redis,upstream   # starts its own redis-server
//! TOLLGATE_EXAMPLE_SELFTEST=1 cargo run --example jobs --features redis,upstream   # the same
//! ```
//!
//! A job sends an SMS through a provider that allows 20 per second: it refuses a send
//! when 20 were sent in the second before it, and says when to come back. The provider
//! is simulated in Redis: a script records every attempt's time (Redis's clock, one for
//! every process) and refuses as the provider would.
//!
//! The run pushes the jobs, starts the workers (this program again, with `--worker`) and
//! waits for them. Each worker takes jobs off the list and, before each send, waits for
//! the provider's turn with [`UpstreamLayer::acquire`]: the limit (`20/s meter`, one send
//! every 50 ms) lives in a `RedisStore`, so the turns are the whole fleet's, and a
//! refusal the provider reports pauses every worker ([`UpstreamLayer::pause`]). It then
//! checks the attempts the provider saw: never more than 20 in any second (a sliding
//! 1 s window), and prints the fleet's rate against the limit.

use std::net::TcpListener;
use std::process::Stdio;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use tokio::process::{Child, Command};
use tollgate::store::{RedisConnection, RedisStore};
use tollgate::upstream::UpstreamLayer;
use tower::BoxError;

/// What the provider allows, and the limit the workers share.
const PER_SECOND: usize = 20;
const LIMIT: &str = "20/s meter";

/// The provider, at Redis's time in µs: every attempt is recorded in `KEYS[2]`; a send
/// is accepted (0) and recorded in `KEYS[1]` unless `ARGV[2]` were accepted in the second
/// before it, when it is refused with the milliseconds until the oldest of them leaves
/// that second.
const PROVIDER: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZADD', KEYS[2], now, ARGV[1] .. '@' .. now)
if redis.call('ZCOUNT', KEYS[1], now - 999999, now) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now, ARGV[1])
  return 0
end
local oldest = redis.call('ZRANGEBYSCORE', KEYS[1], now - 999999, now, 'WITHSCORES', 'LIMIT', 0, 1)
return math.floor((tonumber(oldest[2]) + 1000000 - now) / 1000) + 1
";

const USAGE: &str = "usage: jobs [--redis REDIS_URL] [--workers N] [--jobs N]";

/// The names of one run's keys: the queue, the sends the provider accepted, every
/// attempt.
struct Keys(String);

impl Keys {
    fn queue(&self) -> String {
        format!("{}:queue", self.0)
    }
    fn sent(&self) -> String {
        format!("{}:sent", self.0)
    }
    fn attempts(&self) -> String {
        format!("{}:attempts", self.0)
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = if args.first().map(String::as_str) == Some("--worker") {
        match (args.get(1), args.get(2)) {
            (Some(url), Some(run)) => worker(url, Keys(run.clone())).await,
            _ => Err("--worker REDIS_URL RUN".into()),
        }
    } else {
        match parse(&args) {
            Ok(run) => fleet(run).await,
            Err(e) => {
                eprintln!("{e}\n{USAGE}");
                std::process::exit(2);
            }
        }
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

struct Run {
    redis: Option<String>,
    workers: usize,
    jobs: usize,
}

fn parse(args: &[String]) -> Result<Run, String> {
    let mut run = Run {
        redis: None,
        workers: 3,
        jobs: 100,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let count = || match value.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "{flag} takes a positive whole number, not {value:?}"
            )),
        };
        match flag.as_str() {
            "--redis" => run.redis = Some(value.clone()),
            "--workers" => run.workers = count()?,
            "--jobs" => run.jobs = count()?,
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    Ok(run)
}

/// Pushes the jobs, runs the workers, checks what the provider saw.
async fn fleet(run: Run) -> Result<(), BoxError> {
    let (url, _own) = match run.redis {
        Some(url) => (url, None),
        None => match OwnRedis::start().await? {
            Some(own) => (own.url(), Some(own)),
            None => return Ok(()), // a self-test without redis-server, skipped
        },
    };
    let mut redis = redis::Client::open(url.as_str())
        .map_err(|e| format!("--redis {url}: {e}"))?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("--redis {url}: {e}"))?;
    let keys = Keys(format!("jobs-example:{}", std::process::id()));
    let jobs: Vec<String> = (1..=run.jobs).map(|i| format!("sms-{i}")).collect();
    let _: usize = redis.rpush(keys.queue(), &jobs).await?;

    let started = Instant::now();
    let exe = std::env::current_exe()?;
    let workers: Vec<Child> = (0..run.workers)
        .map(|_| {
            Command::new(&exe)
                .args(["--worker", &url, &keys.0])
                .kill_on_drop(true)
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    for mut worker in workers {
        let status = tokio::time::timeout(Duration::from_secs(120), worker.wait())
            .await
            .map_err(|_| "a worker still runs after 2 minutes")??;
        if !status.success() {
            return Err("a worker failed".into());
        }
    }
    let took = started.elapsed();

    let sent = times(&mut redis, keys.sent()).await?;
    let attempts = times(&mut redis, keys.attempts()).await?;
    let _: usize = redis
        .del(&[keys.queue(), keys.sent(), keys.attempts()])
        .await?;
    let most = most_in_one_second(&attempts);
    let span = (sent.last().unwrap_or(&0) - sent.first().unwrap_or(&0)) as f64 / 1e6;
    let rate = if span > 0.0 {
        (sent.len() - 1) as f64 / span
    } else {
        0.0
    };
    println!(
        "jobs={} workers={} sent={} refused={} max_in_1s={most} limit={PER_SECOND}/s rate={rate:.1}/s took_ms={}",
        run.jobs,
        run.workers,
        sent.len(),
        attempts.len() - sent.len(),
        took.as_millis(),
    );
    if sent.len() != run.jobs {
        return Err(format!("{} of {} jobs sent", sent.len(), run.jobs).into());
    }
    if most > PER_SECOND {
        return Err(format!("{most} attempts in one second: the fleet went over the limit").into());
    }
    Ok(())
}

/// The times (µs) in the sorted set `key`, in order.
async fn times(
    redis: &mut redis::aio::MultiplexedConnection,
    key: String,
) -> Result<Vec<u64>, BoxError> {
    let scored: Vec<(String, f64)> = redis.zrange_withscores(key, 0, -1).await?;
    Ok(scored.into_iter().map(|(_, us)| us as u64).collect())
}

/// The most of `times` (µs, sorted) in any second: `(t - 1 s, t]` for each `t`.
fn most_in_one_second(times: &[u64]) -> usize {
    let mut first = 0;
    let mut most = 0;
    for (i, &t) in times.iter().enumerate() {
        while times[first] + 1_000_000 <= t {
            first += 1;
        }
        most = most.max(i + 1 - first);
    }
    most
}

/// One worker: takes jobs until the queue is empty, each sent in the fleet's turn.
async fn worker(url: &str, keys: Keys) -> Result<(), BoxError> {
    // Every worker's store has this name and this limit: their turns and pauses are one
    // limit's.
    let limit: tollgate::Policy = LIMIT.parse()?;
    let store =
        RedisStore::builder("jobs-example", limit).build(RedisConnection::connect(url).await?)?;
    let limit = UpstreamLayer::builder()
        .max_wait(Duration::from_secs(30))
        .build_with(store)?;
    let provider = redis::Script::new(PROVIDER);
    let mut redis = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let mut done = 0;
    while let Some(job) = redis.lpop::<_, Option<String>>(keys.queue(), None).await? {
        loop {
            if let Err(e) = limit.acquire("sms-provider".to_owned()).await {
                // No turn within the limit's `max_wait`: the job goes back for later.
                let _: usize = redis.lpush(keys.queue(), &job).await?;
                return Err(e);
            }
            let retry_ms: u64 = provider
                .key(keys.sent())
                .key(keys.attempts())
                .arg(&job)
                .arg(PER_SECOND)
                .invoke_async(&mut redis)
                .await?;
            if retry_ms == 0 {
                break;
            }
            // The provider refused: every worker waits as long as it asked.
            limit
                .pause("sms-provider".to_owned(), Duration::from_millis(retry_ms))
                .await?;
        }
        done += 1;
    }
    println!("worker {}: {done} jobs", std::process::id());
    Ok(())
}

/// A `redis-server` of this run's own, on a free port, stopped when dropped.
struct OwnRedis {
    port: u16,
    _child: Child,
}

impl OwnRedis {
    /// `redis-server` (or `TOLLGATE_REDIS_SERVER`) started; `None` when it is missing in
    /// a self-test that does not require it (as the test suite skips).
    async fn start() -> Result<Option<Self>, BoxError> {
        let program =
            std::env::var("TOLLGATE_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(&program)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) => {
                let selftest = std::env::var("TOLLGATE_EXAMPLE_SELFTEST").as_deref() == Ok("1");
                let required = std::env::var("TOLLGATE_REQUIRE_REDIS").as_deref() == Ok("1");
                if selftest && !required {
                    println!("skipping: {program} not found (TOLLGATE_REQUIRE_REDIS=1 makes this a failure)");
                    return Ok(None);
                }
                return Err(format!("no --redis given, and {program} does not start: {e}").into());
            }
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                return Err(format!("{program} did not listen on port {port}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Some(OwnRedis {
            port,
            _child: child,
        }))
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}
