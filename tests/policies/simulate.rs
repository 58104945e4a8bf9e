//! The `simulate` example's engine: the showcase's exact counts, the simulator deciding
//! as the middleware does on the same trace, the chart's structure, and bad input named by
//! its line.

#[path = "../../examples/simulate/sim/mod.rs"]
mod sim;

use std::collections::BTreeMap;

use axum::{body::Body, routing::get, Extension, Router};
use http::{Request, StatusCode};
use sim::{Fate, Stats, MS, NS};
use tollgate::clock::ManualClock;
use tollgate::key::HeaderKey;
use tollgate::store::MemoryStore;
use tollgate::Decision;
use tollgate::Policy;
use tollgate::RateLimitLayer;
use tower::ServiceExt;

/// The figures the showcase's table prints for a policy that refused with
/// `Retry-After: 1` only.
fn counts(s: &Stats) -> (usize, usize, usize, usize, u64) {
    (s.admitted, s.refused, s.delayed, s.max_burst, s.wait_max)
}

fn retry_after(s: &Stats) -> Vec<(Option<u64>, usize)> {
    s.retry_after.iter().map(|(k, v)| (*k, *v)).collect()
}

/// The showcase's two scenarios, measured: these are the counts in the `algorithm` docs.
#[tokio::test]
async fn the_showcase_measures_a_burst_after_idle_and_a_sustained_overload() {
    let scenarios = sim::showcase();
    let labels: Vec<&str> = scenarios[0]
        .policies
        .iter()
        .map(|p| p.label.as_str())
        .collect();
    assert_eq!(
        labels,
        [
            "token bucket: 100/s burst 200",
            "leaky meter: 100/s meter",
            "leaky queue: queue 100/s 200"
        ]
    );

    // 5 s idle, then 200 requests in 100 ms (one every 0.5 ms).
    let burst = &scenarios[0];
    assert_eq!(burst.name, "idle-then-burst");
    assert_eq!(burst.trace.len(), 200);
    assert_eq!(burst.trace[0].at, 5 * NS);
    assert_eq!(burst.trace[199].at, 5 * NS + 199 * MS / 2);
    let r = sim::run_memory(&burst.trace, &burst.policies)
        .await
        .unwrap();
    // The token bucket spends its banked burst: all 200 pass at once.
    assert_eq!(counts(&r.stats[0]), (200, 0, 0, 200, 0));
    assert!(retry_after(&r.stats[0]).is_empty());
    // The meter admits one per 10 ms of the burst: 10, and refuses 190 with
    // `Retry-After: 1` (exact waits of at most 9.5 ms).
    assert_eq!(counts(&r.stats[1]), (10, 190, 0, 10, 0));
    assert_eq!(retry_after(&r.stats[1]), [(Some(1), 190)]);
    assert_eq!(r.stats[1].retry_max, 9_500_000);
    // The queue admits all 200, 199 of them delayed, the last until 6.99 s: 1.8905 s.
    assert_eq!(counts(&r.stats[2]), (200, 0, 199, 10, 1_890_500_000));
    assert_eq!(r.stats[2].wait_p50, 940_500_000);
    assert!(retry_after(&r.stats[2]).is_empty());

    // 300 per second for 2 s (600 requests, one every 3.33 ms).
    let overload = &scenarios[1];
    assert_eq!(overload.name, "sustained-overload");
    assert_eq!(overload.trace.len(), 600);
    let r = sim::run_memory(&overload.trace, &overload.policies)
        .await
        .unwrap();
    // The burst of 200 plus 100/s of refill: 399 (the last arrival is at 1.997 s, 3.3 ms
    // short of the 400th token), at up to 30 per 100 ms while the burst lasts.
    assert_eq!(counts(&r.stats[0]), (399, 201, 0, 30, 0));
    assert_eq!(retry_after(&r.stats[0]), [(Some(1), 201)]);
    // The meter: the rate, 200, never more than 10 per 100 ms.
    assert_eq!(counts(&r.stats[1]), (200, 400, 0, 10, 0));
    assert_eq!(retry_after(&r.stats[1]), [(Some(1), 400)]);
    // The queue: the rate plus the 200 it holds, delayed up to 2 s.
    assert_eq!(counts(&r.stats[2]), (400, 200, 399, 10, 2 * NS));
    assert_eq!(retry_after(&r.stats[2]), [(Some(1), 200)]);
}

/// Sends `trace` through an axum router limited by `text` on a manual clock, one request
/// at a time at its arrival time: what the middleware answered, as fates.
async fn through_the_middleware(text: &str, trace: &[sim::Arrival]) -> Vec<(StatusCode, Fate)> {
    let clock = ManualClock::at(sim::BASE);
    let store = MemoryStore::new(text.parse::<Policy>().unwrap()).with_clock(clock.clone());
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::new("x-key").unwrap())
        .policy(text)
        .expose_decision(true)
        .build_with(store)
        .unwrap();
    // The handler reports the wait the layer made the request sit out.
    let app = Router::new()
        .route(
            "/",
            get(|Extension(d): Extension<Decision>| async move { d.wait().as_nanos().to_string() }),
        )
        .layer(layer);
    let mut got = Vec::new();
    for a in trace {
        clock.set(sim::BASE.as_nanos() as u64 + a.at);
        let req = Request::get("/")
            .header("x-key", &a.key)
            .body(Body::empty())
            .unwrap();
        let res = app.clone().oneshot(req).await.unwrap();
        let status = res.status();
        let header = res
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        let fate = if status == StatusCode::OK {
            Fate::Admitted {
                wait: std::str::from_utf8(&body).unwrap().parse().unwrap(),
            }
        } else {
            // Retry-After in whole seconds, as the simulator's exact value rounds up.
            Fate::Refused {
                retry_after: header,
            }
        };
        got.push((status, fate));
    }
    got
}

/// The simulator replays through the store as the middleware does: on a trace of many
/// keys with Zipf popularity, each request is admitted, delayed by the same wait, or
/// refused with the same `Retry-After` by both. (Paused tokio time lets a queued request's
/// sleep pass at once; the manual clock drives the decisions.)
#[tokio::test(start_paused = true)]
async fn the_simulator_decides_as_the_middleware_does() {
    let trace = sim::pattern("zipf:keys=8,s=1.2,rate=120,for=3s,seed=7").unwrap();
    assert_eq!(trace.len(), 360);
    let keys: std::collections::BTreeSet<&str> = trace.iter().map(|a| a.key.as_str()).collect();
    assert!(keys.len() >= 6, "{keys:?}");
    for text in [
        "5/s burst 10",
        "5/s meter",
        "queue 5/s 10",
        "20/s window",
        "8/s burst 4, 30/10s sliding",
    ] {
        let policy: Policy = text.parse().unwrap();
        let simulated = sim::replay_memory(&policy, &trace).await.unwrap();
        let served = through_the_middleware(text, &trace).await;
        let mut tally = BTreeMap::new();
        for (i, (sim, (status, served))) in simulated.iter().zip(&served).enumerate() {
            let sim_as_served = match *sim {
                Fate::Admitted { wait } => Fate::Admitted { wait },
                Fate::Refused { retry_after } => Fate::Refused {
                    retry_after: retry_after
                        .map(|r| retry_after_secs(std::time::Duration::from_nanos(r))),
                },
            };
            assert_eq!(
                sim_as_served, *served,
                "{text}: request {i} ({:?}) answered {status}",
                trace[i]
            );
            let kind = match sim {
                Fate::Admitted { wait: 0 } => "admitted",
                Fate::Admitted { .. } => "delayed",
                Fate::Refused { .. } => "refused",
            };
            *tally.entry(kind).or_insert(0) += 1;
        }
        // Every policy both admits and refuses some of this trace, and the queue delays.
        assert!(
            tally.get("refused").copied().unwrap_or(0) > 0,
            "{text}: {tally:?}"
        );
        assert!(
            tally.get("admitted").copied().unwrap_or(0) > 0,
            "{text}: {tally:?}"
        );
        assert_eq!(
            tally.contains_key("delayed"),
            text.starts_with("queue"),
            "{text}: {tally:?}"
        );
    }
}

/// The chart is XML with one series per policy in each panel, in its colour, and a legend
/// naming each policy.
#[tokio::test]
async fn the_chart_has_one_series_per_policy() {
    let trace = sim::pattern("on-off:rate=300,on=500ms,off=1s,for=3s").unwrap();
    let policies: Vec<sim::Named> = [
        "10/s burst 20",
        "10/s meter",
        "queue 10/s 20",
        "20/s window",
    ]
    .into_iter()
    .map(|t| sim::policy_arg(t).unwrap())
    .collect();
    let report = sim::run_memory(&trace, &policies).await.unwrap();
    let svg = report.svg("on/off").unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("the chart parses as XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");

    // A series is a polyline of many points; a legend's sample line has two. The axes and
    // ticks, also polylines, are black (left out).
    let mut series: BTreeMap<String, usize> = BTreeMap::new();
    let mut samples: BTreeMap<String, usize> = BTreeMap::new();
    for node in doc.descendants().filter(|n| n.has_tag_name("polyline")) {
        let stroke = node.attribute("stroke").unwrap_or("").to_owned();
        let points = node
            .attribute("points")
            .unwrap_or("")
            .split_whitespace()
            .count();
        if stroke == "#000000" {
            continue;
        }
        let tally = if points > 2 {
            &mut series
        } else {
            &mut samples
        };
        *tally.entry(stroke).or_insert(0) += 1;
    }
    let colours: BTreeMap<String, usize> = (0..policies.len())
        .map(|i| (sim::colour_hex(i), 2))
        .collect();
    // Two panels (cumulative, rate): each policy's colour twice, and no other series.
    assert_eq!(series, colours, "{series:?}");
    assert_eq!(samples, colours, "{samples:?}");
    let texts: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    for p in &policies {
        let n = texts.iter().filter(|t| **t == p.label).count();
        assert_eq!(n, 2, "legend entries for {:?} in {texts:?}", p.label);
    }
    for axis in [
        "time since the trace started (s)",
        "requests",
        "requests per second",
    ] {
        assert!(texts.contains(&axis), "axis label {axis:?} in {texts:?}");
    }

    // The series CSV: a header, then one row per policy per sample.
    let csv = report.csv();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("policy,time_ms,admitted_cumulative,downstream_rate_per_s")
    );
    assert_eq!(lines.count(), policies.len() * report.series[0].len());
}

/// The chart is the same bytes on every run, so CI can check the checked-in ones.
#[tokio::test]
async fn the_showcase_charts_are_deterministic() {
    for s in sim::showcase() {
        let a = sim::run_memory(&s.trace, &s.policies).await.unwrap();
        let b = sim::run_memory(&s.trace, &s.policies).await.unwrap();
        assert_eq!(a.svg(s.title).unwrap(), b.svg(s.title).unwrap());
    }
}

#[test]
fn bad_traces_name_their_line() {
    let csv = |text: &str| {
        sim::parse_trace(text, sim::Format::Csv)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        csv("time,key,cost\n1.5,a,1\n# a comment\n1.2,b,1\n"),
        "line 4: time 1.2 is before the previous 1.5"
    );
    assert_eq!(csv("0,a\n0.5,a,-3\n"), "line 2: cost -3 is negative");
    assert_eq!(csv("0,a\n-1,a,1\n"), "line 2: time -1 is negative");
    assert_eq!(
        csv("0,a\n1,a,x\n"),
        "line 2: cost \"x\" is not a whole number"
    );
    assert_eq!(
        csv("0,a,1,9\n"),
        "line 1: expected `time,key` or `time,key,cost`, found 4 fields"
    );
    assert_eq!(csv("time,key\n"), "the trace has no requests");

    let jsonl = |text: &str| {
        sim::parse_trace(text, sim::Format::JsonLines)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        jsonl("{\"time\": 2, \"key\": \"a\"}\n\n{\"time\": 1.999, \"key\": \"a\"}\n"),
        "line 3: time 1.999 is before the previous 2"
    );
    assert_eq!(
        jsonl("{\"time\": 0, \"key\": \"a\", \"cost\": -1}\n"),
        "line 1: cost -1 is negative"
    );
    assert!(jsonl("{\"time\": 0,\n").starts_with("line 1: not JSON"));
    assert_eq!(jsonl("{\"key\": \"a\"}"), "line 1: no \"time\" field");
}

#[test]
fn good_traces_read_exactly() {
    let t = sim::parse_trace(
        "time,key,cost\n0,alice\n0.0005,bob,3\n1.25,alice,0\n",
        sim::Format::Csv,
    )
    .unwrap();
    let got: Vec<(u64, &str, u64)> = t.iter().map(|a| (a.at, a.key.as_str(), a.cost)).collect();
    assert_eq!(
        got,
        [
            (0, "alice", 1),
            (500_000, "bob", 3),
            (1_250_000_000, "alice", 0)
        ]
    );
    let j = sim::parse_trace(
        "{\"time\": 0.25, \"key\": \"a\", \"cost\": 2}\n{\"time\": \"1.5\", \"key\": 7}\n",
        sim::Format::JsonLines,
    )
    .unwrap();
    assert_eq!((j[0].at, j[0].cost), (250_000_000, 2));
    assert_eq!(
        (j[1].at, j[1].key.as_str(), j[1].cost),
        (1_500_000_000, "7", 1)
    );
    // The sample trace the CI runs the command on reads.
    let sample = include_str!("../../examples/simulate/sample.csv");
    assert!(sim::parse_trace(sample, sim::Format::Csv).unwrap().len() > 10);
}

#[test]
fn bad_policies_name_their_line() {
    let err = sim::policies_file("# plans\nfree = 10/min\npro = 100/fortnight\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("line 3: ") && err.contains("\"fortnight\""),
        "{err}"
    );
    let err = sim::policies_file("free = 10/min\nturbo 5/s\n")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("line 2: "), "{err}");
    let err = sim::policy_arg("100/s turbo").unwrap_err().to_string();
    assert!(err.contains("unexpected \"turbo\""), "{err}");

    let named = sim::policies_file("free = 10/min\npro = 100/min\n* = 1000/day window\n").unwrap();
    let labels: Vec<&str> = named.iter().map(|n| n.label.as_str()).collect();
    assert_eq!(labels, ["free", "pro"]);
    assert_eq!(
        named[0].policy.limits().len(),
        2,
        "the common limit applies"
    );
}

#[test]
fn patterns_are_what_they_say() {
    let burst = sim::pattern("idle-burst").unwrap();
    assert_eq!(burst.len(), 200);
    let saw = sim::pattern("sawtooth:peak=300,period=1s,for=4s").unwrap();
    // 150 per period (the area under a ramp from 0 to 300 over 1 s), four periods.
    assert_eq!(saw.len(), 600);
    assert!(saw.windows(2).all(|w| w[0].at <= w[1].at));
    let on_off = sim::pattern("on-off:rate=100,on=500ms,off=500ms,for=2s").unwrap();
    assert_eq!(on_off.len(), 100);
    assert!(on_off.iter().all(|a| (a.at / (500 * MS)).is_multiple_of(2)));
    // Zipf: the most popular key takes the largest share.
    let zipf = sim::pattern("zipf:keys=20,rate=1000,for=2s").unwrap();
    let mut by_key: BTreeMap<&str, usize> = BTreeMap::new();
    for a in &zipf {
        *by_key.entry(a.key.as_str()).or_insert(0) += 1;
    }
    let top = by_key.iter().max_by_key(|(_, n)| **n).unwrap();
    assert_eq!(*top.0, "k01", "{by_key:?}");
    assert_eq!(zipf, sim::pattern("zipf:keys=20,rate=1000,for=2s").unwrap());

    for (spec, needle) in [
        ("bursty", "unknown pattern \"bursty\""),
        ("overload:rate=fast", "rate=fast is not a whole number"),
        ("overload:speed=3", "takes no parameter \"speed\""),
        ("idle-burst:idle=5", "needs a unit"),
    ] {
        let err = sim::pattern(spec).unwrap_err().to_string();
        assert!(err.contains(needle), "{spec}: {err}");
    }
}

/// `Retry-After` as tollgate sends it: the wait in whole seconds, rounded up.
fn retry_after_secs(wait: std::time::Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

/// A label of 65,536 characters or more made the table's `format!` width panic; labels are
/// now cut to 48 characters in the table.
#[tokio::test]
async fn a_huge_label_is_cut_in_the_table() {
    let trace = sim::parse_trace("0,a\n0.5,a\n", sim::Format::Csv).unwrap();
    let mut named = sim::policy_arg("1/s").unwrap();
    named.label = format!("{}tail", "x".repeat(70_000));
    let short = sim::policy_arg("1/s meter").unwrap();
    let report = sim::run_memory(&trace, &[named, short]).await.unwrap();
    let table = report.table();
    let cut = format!("{}...", "x".repeat(45));
    let rows: Vec<&str> = table.lines().collect();
    assert!(rows[1].starts_with(&format!("{cut}  ")), "{}", rows[1]);
    assert!(
        rows[2].starts_with(&format!("1/s meter{}  ", " ".repeat(39))),
        "{}",
        rows[2]
    );
    assert!(table.len() < 2_000, "{table}");
}

/// An error quoted a whole field, however long (100 MB of one); it now quotes 64 bytes and
/// says how long the field was.
#[test]
fn errors_quote_a_huge_field_cut_short() {
    let huge = "x".repeat(1 << 20);
    let csv = |text: &str| {
        sim::parse_trace(text, sim::Format::Csv)
            .unwrap_err()
            .to_string()
    };
    let cut = format!("\"{}\"... (1048576 bytes)", "x".repeat(64));
    assert_eq!(
        csv(&format!("0,a\n1,a,{huge}\n")),
        format!("line 2: cost {cut} is not a whole number")
    );
    assert_eq!(
        csv(&format!("0,a\n{huge},a\n")),
        format!("line 2: time {cut} is not a number such as 1.25")
    );
    let zeros = format!("{}1", "0".repeat(1 << 20));
    assert_eq!(
        csv(&format!("2,a\n{zeros},a\n")),
        format!(
            "line 2: time {}... (1048577 bytes) is before the previous 2",
            "0".repeat(64)
        )
    );
    let jsonl = sim::parse_trace(
        &format!("{{\"time\": 0, \"key\": [\"{huge}\"]}}\n"),
        sim::Format::JsonLines,
    )
    .unwrap_err()
    .to_string();
    assert!(jsonl.len() < 200, "{}", &jsonl[..200]);
    assert!(
        jsonl.ends_with("... (1048580 bytes) is not a string"),
        "{jsonl}"
    );
    let policy = sim::policy_arg(&format!("10/s {huge}"))
        .unwrap_err()
        .to_string();
    assert!(policy.len() < 600, "{}", &policy[..600]);
    assert!(policy.starts_with("policy \"10/s xxxx"), "{policy}");
    let pattern = sim::pattern(&format!("overload:rate={huge}"))
        .unwrap_err()
        .to_string();
    assert!(pattern.len() < 200, "{}", &pattern[..200]);
}

/// A first line that did not parse was taken for a header, and a one-line trace with a
/// typo reported "no requests"; only `time,key[,cost]` is a header now, and any other bad
/// first line is named.
#[test]
fn a_bad_first_line_is_named_not_taken_for_a_header() {
    let csv = |text: &str| sim::parse_trace(text, sim::Format::Csv).map(|t| t.len());
    let err = |text: &str| csv(text).unwrap_err().to_string();
    assert_eq!(
        err("1.5s,alice\n"),
        "line 1: time \"1.5s\" is not a number such as 1.25"
    );
    assert_eq!(
        err("t,user\n1,alice\n"),
        "line 1: time \"t\" is not a number such as 1.25"
    );
    assert_eq!(
        err("1.2.3,alice\n2,bob\n"),
        "line 1: time \"1.2.3\" is not a number such as 1.25"
    );
    assert_eq!(csv("Time, Key, Cost\n1,alice\n"), Ok(1));
    assert_eq!(csv("time,key\n1,alice\n2,bob,3\n"), Ok(2));
    assert_eq!(err("time,key\n"), "the trace has no requests");
    // Only the first line may be a header.
    assert_eq!(
        err("1,alice\ntime,key\n"),
        "line 2: time \"time\" is not a number such as 1.25"
    );
}

/// Two arrivals 1.8e10 s apart overflowed the clock (trace time zero sits at 2027, and the
/// clock counts nanoseconds in 64 bits): a panic in a debug build, and wrong decisions in
/// a release build, where the time wrapped around to 1970. A time later than the replay
/// can place on the clock is now refused, naming its line; the latest one is decided right.
#[tokio::test]
async fn a_time_past_the_clock_is_refused_and_the_latest_is_decided_right() {
    let err = sim::parse_trace("0,a\n18000000000,a\n", sim::Format::Csv)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "line 2: time 18000000000 is later than a trace can reach (2811714818 s, about 89 years)"
    );
    let past = sim::parse_trace("2811714818.427387905,a\n", sim::Format::Csv);
    assert!(past
        .unwrap_err()
        .to_string()
        .starts_with("line 1: time 2811714818.427387905 is later"));
    let err = sim::pattern("idle-burst:idle=18000000000s")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("pattern idle-burst: idle: time 18000000000s is later"),
        "{err}"
    );

    // The latest time, two days after the second pair: decided as at the start.
    let trace = sim::parse_trace(
        "0,a\n0,a\n2811542018,a\n2811542018,a\n2811714818.427387904,a\n2811714818.427387904,a\n",
        sim::Format::Csv,
    )
    .unwrap();
    let policies = [
        sim::policy_arg("1/day").unwrap(),
        sim::policy_arg("queue 1/day 1").unwrap(),
    ];
    let r = sim::run_memory(&trace, &policies).await.unwrap();
    let fates = sim::replay_memory(&policies[0].policy, &trace)
        .await
        .unwrap();
    let admitted: Vec<bool> = fates
        .iter()
        .map(|f| matches!(f, Fate::Admitted { .. }))
        .collect();
    assert_eq!(admitted, [true, false, true, false, true, false]);
    assert_eq!((r.stats[1].admitted, r.stats[1].delayed), (6, 3));
}
