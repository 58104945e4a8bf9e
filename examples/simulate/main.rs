//! See the policies: replays traffic against one or more policies under a manual clock,
//! through the store's own decisions (the code the middleware runs), and reports what each
//! policy did: a table, a CSV of the series, an SVG chart.
//!
//! ```sh
//! # A burst after 5 s idle, and a sustained overload, against a token bucket, a leaky
//! # meter and a leaky queue: prints the tables and writes docs/charts/*.svg (the charts
//! # in the `algorithm` docs).
//! cargo run --example simulate -- showcase [--out DIR]
//!
//! # Your traffic against your policies.
//! cargo run --example simulate -- --trace examples/simulate/sample.csv \
//!     --policy "10/s burst 20" --policy "10/s meter" --policy "queue 10/s 20" \
//!     --csv series.csv --svg chart.svg
//! cargo run --example simulate -- --pattern zipf:keys=20,rate=400 --policies plans.txt
//! ```
//!
//! # Traffic
//!
//! - `--trace FILE`: CSV (`time,key,cost` per line; time in seconds since the trace's
//!   start, such as `1.250`; cost optional, default 1; an optional first line
//!   `time,key,cost` or `time,key`; `#` comments) or JSON lines when the file ends in
//!   `.jsonl`, `.ndjson` or `.json` (`{"time": 1.25, "key": "alice", "cost": 2}`). Times
//!   must not go backwards nor past about 89 years (the clock counts nanoseconds in 64
//!   bits), and costs must be whole numbers not below zero: an error names the line and
//!   quotes at most 64 bytes of the field.
//! - `--pattern SPEC`: a built-in pattern, `name` or `name:k=v,k=v`:
//!   `idle-burst` (idle=5s n=200 over=100ms), `overload` (rate=300 for=2s), `sawtooth`
//!   (peak=300 period=1s for=4s), `on-off` (rate=300 on=500ms off=1s for=4s), `zipf`
//!   (keys=50 s=1.1 rate=500 for=2s seed=1: many keys with heavy-tailed popularity). The
//!   single-key patterns take `key=`, all take `cost=`.
//!
//! # Policies
//!
//! In the text syntax of the serde configuration (`tollgate::policy`): `--policy "100/s
//! burst 200"` (repeatable, labelled by its text), or `--policies FILE` with
//! `name = policy` per line as `PolicySet::from_text` reads it (`*` for limits every policy
//! also applies). Each policy is replayed on its own fresh store.
//!
//! # Output
//!
//! A table per run (admitted, refused, delayed, p50/p99/max wait, the most requests passed
//! downstream within any 100 ms, the distribution of `Retry-After`), `--csv FILE` for the
//! series (`policy,time_ms,admitted_cumulative,downstream_rate_per_s`), `--svg FILE` for
//! the chart (`--title TEXT` to name it). An admitted request passes downstream at its
//! arrival plus its wait (a queue's delay).
//!
//! # Redis
//!
//! With the feature `redis`, `--redis URL` decides on a `RedisStore` (its clock overridden
//! by the manual clock, a fresh namespace per run, no negative cache) instead of the
//! in-memory store: `cargo run --example simulate --features redis -- --redis
//! redis://127.0.0.1:6379 --pattern overload --policy "100/s burst 200"`. The Redis
//! store decides on whole microseconds: on a trace whose times are finer (a rate such as
//! 120/s) a queue's waits may differ from the in-memory store's by under a microsecond,
//! which can move a departure across a sample of the series.
//!
//! Why an example and not a binary behind a feature: its dependencies (the plotting
//! library) are dev-dependencies, so the crate's users never compile them.

mod sim;

use std::{path::PathBuf, process::ExitCode};

use sim::{Arrival, Named, SimError};

/// What the command line asks for.
#[derive(Debug, Default)]
struct Args {
    showcase: bool,
    out: Option<PathBuf>,
    trace: Option<String>,
    pattern: Option<String>,
    policies: Vec<Named>,
    csv: Option<PathBuf>,
    svg: Option<PathBuf>,
    title: Option<String>,
    redis: Option<String>,
}

const USAGE: &str = "\
usage: simulate showcase [--out DIR]
       simulate (--trace FILE | --pattern SPEC) (--policy TEXT ... | --policies FILE)
                [--csv FILE] [--svg FILE] [--title TEXT] [--redis URL]
See the top of examples/simulate/main.rs. Patterns:";

fn parse_args(mut argv: impl Iterator<Item = String>) -> Result<Args, SimError> {
    let mut args = Args::default();
    while let Some(arg) = argv.next() {
        let mut value = |name: &str| {
            argv.next()
                .ok_or_else(|| SimError::new(format!("{name} needs a value")))
        };
        match arg.as_str() {
            "showcase" => args.showcase = true,
            "--out" => args.out = Some(value("--out")?.into()),
            "--trace" => args.trace = Some(value("--trace")?),
            "--pattern" => args.pattern = Some(value("--pattern")?),
            "--policy" => args.policies.push(sim::policy_arg(&value("--policy")?)?),
            "--policies" => {
                let path = value("--policies")?;
                let text = read(&path)?;
                let named =
                    sim::policies_file(&text).map_err(|e| SimError::new(format!("{path}: {e}")))?;
                args.policies.extend(named);
            }
            "--csv" => args.csv = Some(value("--csv")?.into()),
            "--svg" => args.svg = Some(value("--svg")?.into()),
            "--title" => args.title = Some(value("--title")?),
            "--redis" => args.redis = Some(value("--redis")?),
            "-h" | "--help" => return Err(SimError::new("")),
            other => {
                let other = sim::quoted(other);
                return Err(SimError::new(format!("unexpected argument {other}")));
            }
        }
    }
    Ok(args)
}

fn read(path: &str) -> Result<String, SimError> {
    std::fs::read_to_string(path).map_err(|e| SimError::new(format!("reading {path}: {e}")))
}

fn write(path: &std::path::Path, text: &str) -> Result<(), SimError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| SimError::new(format!("creating {}: {e}", dir.display())))?;
    }
    std::fs::write(path, text)
        .map_err(|e| SimError::new(format!("writing {}: {e}", path.display())))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The showcase: its two scenarios, their tables printed and their charts written.
async fn showcase(out: PathBuf) -> Result<(), SimError> {
    for s in sim::showcase() {
        let report = sim::run_memory(&s.trace, &s.policies).await?;
        println!(
            "== {} ({} requests)\n{}",
            s.title,
            s.trace.len(),
            report.table()
        );
        write(&out.join(format!("{}.svg", s.name)), &report.svg(s.title)?)?;
        println!();
    }
    Ok(())
}

async fn run(args: Args) -> Result<(), SimError> {
    if args.showcase {
        return showcase(args.out.unwrap_or_else(|| "docs/charts".into())).await;
    }
    let trace: Vec<Arrival> = match (&args.trace, &args.pattern) {
        (Some(path), None) => sim::parse_trace(&read(path)?, sim::Format::of_path(path))
            .map_err(|e| SimError::new(format!("{path}: {e}")))?,
        (None, Some(spec)) => sim::pattern(spec)?,
        _ => return Err(SimError::new("give one of --trace FILE or --pattern SPEC")),
    };
    if args.policies.is_empty() {
        return Err(SimError::new(
            "give at least one --policy TEXT or --policies FILE",
        ));
    }
    let report = match &args.redis {
        #[cfg(feature = "redis")]
        Some(url) => sim::run_redis(url, &trace, &args.policies).await?,
        #[cfg(not(feature = "redis"))]
        Some(_) => {
            return Err(SimError::new(
                "--redis needs the feature: cargo run --example simulate --features redis",
            ))
        }
        None => sim::run_memory(&trace, &args.policies).await?,
    };
    let keys = trace
        .iter()
        .map(|a| a.key.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let last = trace.last().map_or(0, |a| a.at);
    println!(
        "{} requests from {keys} key(s) over {} s\n\n{}",
        trace.len(),
        sim::secs(last),
        report.table()
    );
    if let Some(path) = &args.csv {
        write(path, &report.csv())?;
    }
    if let Some(path) = &args.svg {
        let title = args.title.clone().unwrap_or_else(|| {
            let source = args
                .trace
                .as_deref()
                .or(args.pattern.as_deref())
                .unwrap_or("");
            format!("{source}: {} requests", trace.len())
        });
        write(path, &report.svg(&title)?)?;
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if !e.message.is_empty() {
                eprintln!("error: {e}\n");
            }
            eprintln!("{USAGE}\n{}", sim::PATTERNS);
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
