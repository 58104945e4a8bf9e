//! Policy sets and their text under hostile input: a set of any size is validated and
//! installed in linear time, and an error names its line and quotes the input cut short.

use axum::{body::Body, routing::get, Router};
use http::Request;
use tollgate::key::{HeaderBytes, HeaderKey, RequestHead};
use tollgate::policy::PolicySet;
use tollgate::{ConfigError, Policy, Quota, RateLimitLayer};
use tower::ServiceExt;

/// `n` policies, `p0 = 1/min` to `p{n-1} = {n}/min`, one a line.
fn policies(n: usize) -> String {
    (0..n).map(|i| format!("p{i} = {}/min\n", i + 1)).collect()
}

/// The key is the policy's name.
fn by_key(_: &RequestHead<'_>, key: Option<&HeaderBytes>) -> String {
    key.map(|k| String::from_utf8_lossy(k).into_owned())
        .unwrap_or_default()
}

/// A set of 300,000 policies is read, checked for duplicates and installed, and a request
/// finds its own among them. Checking each name against every earlier one took minutes at
/// this size (10,000 names 0.2 s, 20,000 0.4 s, growing with the square); a name is now
/// looked up in a hash map.
#[tokio::test]
async fn a_set_of_300_000_policies_is_read_and_installed() {
    const N: usize = 300_000;
    let text = policies(N);
    let set = PolicySet::from_text(&text).unwrap();
    assert_eq!(set.names().count(), N);
    assert_eq!(set.names().last(), Some("p299999"));
    let last = set.policy("p299999").unwrap().limits();
    assert_eq!(last[0].quota(), &Quota::per_minute(300_000).unwrap());

    let layer = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key").unwrap())
        .policy("1/min")
        .select(by_key)
        .build()
        .unwrap();
    let handle = layer.policy_handle();
    handle.swap(set).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    for (key, quota) in [("p299998", 299_999), ("p7", 8), ("unknown", 1)] {
        let req = Request::get("/")
            .header("x-api-key", key)
            .body(Body::empty())
            .unwrap();
        let res = app.clone().oneshot(req).await.unwrap();
        let policy = res.headers()["ratelimit-policy"].to_str().unwrap();
        let name = if key == "unknown" { "p0" } else { key };
        assert_eq!(policy, format!("\"{name}\";q={quota};w=60"), "{key}");
    }

    // A duplicate at the very end is found, and named with its line.
    let twice = format!("{text}p123456 = 5/s\n");
    let err = handle.swap_text(&twice).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "line {}: policy set: policy \"p123456\" appears twice",
            N + 1
        )
    );
}

#[test]
fn set_errors_name_the_line_and_the_policy() {
    let line = |text: &str| match PolicySet::from_text(text).unwrap_err() {
        ConfigError::Line { line, error } => (line, error.to_string()),
        other => panic!("no line: {other}"),
    };
    assert_eq!(
        line("free = 1/s\n# pro\npro = 2/s\nfree = 3/s\n"),
        (4, "policy set: policy \"free\" appears twice".into())
    );
    assert_eq!(
        line("free = 1/s\n* = 1/day\n\n* = 2/day\n"),
        (4, "policy set: \"*\" appears twice".into())
    );
    let (n, err) = line("free = 1/s\nbad name = 2/s\n");
    assert_eq!(n, 2);
    assert!(
        err.contains("\"bad name\" must be printable ASCII"),
        "{err}"
    );
    // A policy that, with the common limits, has too many: its own line.
    let (n, err) = line("a = 1/s\nb = 1/s, 2/min, 3/h\n* = 1/day, 2/min\n");
    assert_eq!(n, 2);
    assert!(err.contains("policy \"b\""), "{err}");
    // Sets built in code: the same checks, no line.
    let one = || "1/s".parse::<Policy>().unwrap();
    let err = PolicySet::named([("a", one()), ("b", one()), ("a", one())], []).unwrap_err();
    assert_eq!(
        err,
        ConfigError::PolicySet("policy \"a\" appears twice".into())
    );
}

/// A one-line file of 10 MB that did not parse gave an error quoting it twice (20 MB);
/// what an error quotes is now cut after 64 bytes, saying how long the text was. (1 MB
/// here, to keep the test quick: the cut does not depend on the size.)
#[test]
fn an_error_quotes_a_huge_text_cut_short() {
    let huge = "9".repeat(1 << 20);
    for text in [
        format!("free = {huge}"),
        format!("free = 10/s burst {huge}x"),
        format!("free = 10/{huge}x"),
        format!("free = 10/s {huge}"),
        format!("free = 10/s, \u{1}{huge}: 5/s"),
        format!("free = 10/s\nfree {huge} = 5/s"),
        format!("free = 10/s\nfree{huge} = 5/s\nfree{huge} = 5/s"),
        format!("{huge} 10/s"),
    ] {
        let Err(err) = PolicySet::from_text(&text) else {
            panic!("accepted: {}", &text[..100]);
        };
        let err = err.to_string();
        assert!(err.len() < 1_000, "{} bytes: {}", err.len(), &err[..300]);
        assert!(err.contains(" bytes)"), "{err}");
    }
    let err = format!("10/s burst {huge}").parse::<Policy>().unwrap_err();
    let shown = err.to_string();
    assert!(shown.starts_with("in \"10/s burst 9999"), "{shown}");
    assert!(
        shown.contains("... (1048587 bytes)\": the burst \"9999"),
        "{shown}"
    );
    assert!(
        shown.ends_with("\"... (1048576 bytes) is not a whole number"),
        "{shown}"
    );
}

/// A name a selector can return, which the large set below lacks.
struct Missing;

impl tollgate::policy::PolicyName for Missing {
    fn policy_name(&self) -> &str {
        "gold"
    }
    fn all_names() -> Option<&'static [&'static str]> {
        Some(&["p0", "gold"])
    }
}

/// A set that lacks a name the selector can return is refused with a message that lists
/// the set's first ten names, not all of them (a set may hold hundreds of thousands).
#[test]
fn a_set_lacking_a_selector_name_is_refused_in_a_short_message() {
    let err = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key").unwrap())
        .policies(PolicySet::from_text(&policies(20)).unwrap())
        .select(|_: &RequestHead<'_>, _: Option<&HeaderBytes>| Missing)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "policy set: the selector can name \"gold\", which the set lacks \
         (it has p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, ...)"
    );
}

/// Regression: a file of one policy had to name it (`default = 100/s burst 200`); a text of
/// one line without `name =` is now that policy alone, as `PolicySet::single` makes, and a
/// layer's handle swaps to it.
#[test]
fn a_file_of_one_policy_needs_no_name() {
    let set = PolicySet::from_text("# the API's limit\n\n100/s burst 200 # per key\n").unwrap();
    assert_eq!(
        set,
        PolicySet::single("100/s burst 200".parse::<Policy>().unwrap())
    );
    assert_eq!(set.names().count(), 0);
    let layer = RateLimitLayer::new(
        HeaderKey::new("x-api-key").unwrap(),
        "1/s".parse::<Policy>().unwrap(),
    );
    layer.policy_handle().swap_text("minute: 10/min").unwrap();
    assert_eq!(layer.policies().fallback().limits()[0].name(), "minute");
    // Named, it is a set of one named policy, as before.
    let named = PolicySet::from_text("default = 100/s").unwrap();
    assert_eq!(named.names().collect::<Vec<_>>(), ["default"]);
    // Two policies need their names; an error names the line.
    let err = PolicySet::from_text("100/s\n200/s")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("line 1") && err.contains("name = policy"),
        "{err}"
    );
    let err = PolicySet::from_text("\n100/fortnight")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("line 2") && err.contains("fortnight"),
        "{err}"
    );
}

mod printed {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;
    use tollgate::Limit;

    /// Periods in whole units of every size the text has.
    fn period() -> impl Strategy<Value = Duration> {
        let unit = prop::sample::select(vec![
            1u64,
            1_000,
            1_000_000,
            1_000_000_000,
            60_000_000_000,
            3_600_000_000_000,
            86_400_000_000_000,
        ]);
        (1u64..=120, unit, 0u64..=999).prop_map(|(n, unit, odd)| {
            // Now and then a period that is no whole number of the larger units.
            Duration::from_nanos(n * unit + if odd % 7 == 0 { odd } else { 0 })
        })
    }

    /// Any limit the API builds: every algorithm and option, any printable name.
    fn limit() -> impl Strategy<Value = Limit> {
        (
            (1u64..=10_000, period(), prop::option::of(1u64..=1_000)),
            0u8..5,
            (
                0u32..=100,
                0u32..=100,
                prop::option::of(0u64..=10_000_000_000),
            ),
            prop::option::of(0u64..=200_000_000_000_000),
            prop::option::of("[ -~]{1,12}"),
            0u16..=10_000,
        )
            .prop_filter_map(
                "a limit the API refuses",
                |((n, period, burst), kind, (queue, nodelay, max_wait), offset, name, share)| {
                    let mut quota = tollgate::Quota::new(n, period).ok()?;
                    let mut l = match kind {
                        0 => {
                            if let Some(b) = burst {
                                quota = quota.with_burst(b).ok()?;
                            }
                            Limit::token_bucket(quota)
                        }
                        1 => Limit::leaky_meter(quota),
                        2 => Limit::leaky_queue_nodelay(quota, queue, nodelay.min(queue)),
                        3 => Limit::fixed_window(quota),
                        _ => Limit::sliding_window(quota),
                    }
                    .ok()?;
                    if let (2, Some(w)) = (kind, max_wait) {
                        l = l.with_max_wait(Duration::from_nanos(w)).ok()?;
                    }
                    if let (3 | 4, Some(o)) = (kind, offset) {
                        l = l.with_window_offset(Duration::from_nanos(o)).ok()?;
                    }
                    if let Some(name) = name {
                        l = l.named(name).ok()?;
                    }
                    match share {
                        0 => Some(l.shadow()),
                        10_000 => Some(l),
                        n if n % 3 == 0 => l.enforce_percent(f64::from(n) / 100.0).ok(),
                        _ => Some(l),
                    }
                },
            )
    }

    fn policy() -> impl Strategy<Value = Policy> {
        prop::collection::vec(limit(), 1..=4)
            .prop_filter_map("too many limits", |l| Policy::from_limits(l).ok())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Any policy reads back from its text as an equal policy.
        #[test]
        fn a_policy_reads_back_from_its_text(p in policy()) {
            let text = p.to_string();
            prop_assert_eq!(text.parse::<Policy>().unwrap(), p, "{}", text);
        }

        /// Any set, named policies and common limits or one policy alone, reads back from
        /// its text as an equal set.
        #[test]
        fn a_set_reads_back_from_its_text(
            named in prop::collection::vec(("[!-~]{1,10}", prop::collection::vec(limit(), 1..=2)), 1..=4),
            every in prop::collection::vec(limit(), 0..=2),
            single in policy(),
        ) {
            let policies = named
                .into_iter()
                .filter_map(|(n, l)| Some((n, Policy::from_limits(l).ok()?)));
            if let Ok(set) = PolicySet::named(policies, every) {
                let text = set.to_string();
                prop_assert_eq!(PolicySet::from_text(&text).unwrap(), set, "{}", text);
            }
            let set = PolicySet::single(single);
            let text = set.to_string();
            prop_assert_eq!(PolicySet::from_text(&text).unwrap(), set, "{}", text);
        }
    }
}
