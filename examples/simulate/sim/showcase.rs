//! The showcase: a burst after idle time and a sustained overload, measured.

use super::{patterns::pattern, policies::Named, Arrival};

/// A scenario of the showcase.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The chart's file name, without `.svg`.
    pub name: &'static str,
    pub title: &'static str,
    pub trace: Vec<Arrival>,
    pub policies: Vec<Named>,
}

/// Three readings of "100 per second": a token bucket with a burst of 200,
/// a strict leaky meter, a leaky-bucket queue of 200.
pub fn showcase_policies() -> Vec<Named> {
    [
        ("token bucket: 100/s burst 200", "100/s burst 200"),
        ("leaky meter: 100/s meter", "100/s meter"),
        ("leaky queue: queue 100/s 200", "queue 100/s 200"),
    ]
    .into_iter()
    .map(|(label, text)| Named {
        label: label.to_owned(),
        policy: text.parse().expect("the showcase's policies parse"),
    })
    .collect()
}

/// The scenarios: 5 s idle then 200 requests in 100 ms; 300 per second for 2 s.
pub fn showcase() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "idle-then-burst",
            title: "5 s idle, then 200 requests in 100 ms, against 100/s",
            trace: pattern("idle-burst:idle=5s,n=200,over=100ms").expect("a valid pattern"),
            policies: showcase_policies(),
        },
        Scenario {
            name: "sustained-overload",
            title: "300 requests per second for 2 s, against 100/s",
            trace: pattern("overload:rate=300,for=2s").expect("a valid pattern"),
            policies: showcase_policies(),
        },
    ]
}
