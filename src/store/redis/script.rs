//! The Lua scripts, their arguments and their replies.
//!
//! Each script is composed at compile time from the files in `lua/`: a head, the shared
//! `gcra_decay.lua` (a GCRA state's fill as of now, written out inline, since a Lua
//! function call per request would cost more) and a tail.

use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

use ::redis::{FromRedisValue, ParsingError, Script, Value};

use crate::algorithm::{Params, MAX_WORDS};
use crate::decision::MAX_LIMITS;
use crate::decision::{Decision, LimitReport, Outcome, Source};
use crate::error::{ConfigError, StoreError};
use crate::policy::{Combine, Policy};
use crate::redis::Invocation;

/// The general script's text: `general_head.lua`, `gcra_decay.lua`, `general_tail.lua`.
macro_rules! general_lua {
    () => {
        concat!(
            include_str!("lua/general_head.lua"),
            include_str!("lua/gcra_decay.lua"),
            include_str!("lua/general_tail.lua"),
        )
    };
}

/// The batch script's text after its first lines (which say whether it runs on a
/// cluster): the general script wrapped, unchanged, in a function whose parameters `KEYS`,
/// `ARGV` and `redis` shadow the globals of a plain call, then `batch_head.lua`,
/// `gcra_decay.lua` and `batch_tail.lua`.
macro_rules! batch_lua {
    () => {
        concat!(
            "local function general(KEYS, ARGV, redis)\n",
            general_lua!(),
            "\nend\n",
            include_str!("lua/batch_head.lua"),
            include_str!("lua/gcra_decay.lua"),
            include_str!("lua/batch_tail.lua"),
        )
    };
}

/// The decision script (one for every policy: the limits travel as arguments).
pub(super) static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(general_lua!()));

/// The fast path for a single GCRA-based limit (check and peek): a third of the work of
/// the general script on the server (no tables, no per-limit reports: the client rebuilds
/// them).
pub(super) static GCRA_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("lua/gcra_head.lua"),
        include_str!("lua/gcra_decay.lua"),
        include_str!("lua/gcra_tail.lua"),
    ))
});

/// The batch script: the general script wrapped, unchanged, in a function whose
/// parameters `KEYS`, `ARGV` and `redis` shadow the globals of a plain call, then
/// `batch_head.lua`, `gcra_decay.lua` and `batch_tail.lua`, which decide the fast script's
/// requests themselves and call the general one for the others, in order, with their own
/// `redis` that reads and writes the batch's values in a table.
pub(super) static BATCH_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(concat!("local CLUSTER = false\n", batch_lua!())));

/// The batch script for one node of a Redis Cluster: its keys, of several slots of that
/// node, travel among the arguments (a command's keys must share a slot; a script flagged
/// `allow-cross-slot-keys`, Redis 7 and Valkey, may touch any key of its node), each read
/// with its own `GET`.
pub(super) static CLUSTER_BATCH_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        "#!lua flags=allow-cross-slot-keys\nlocal CLUSTER = true\n",
        batch_lua!()
    ))
});

/// Largest GCRA capacity (`cap`, ns) and largest `limit * window_us` of a window: the
/// script's arithmetic adds and doubles these, and must stay below 2^53 to be exact.
pub(super) const MAX_EXACT: u64 = 1 << 51;
/// Longest window in nanoseconds (its doubled value is returned in ns).
const MAX_WINDOW_NS: u64 = 1 << 52;
/// Costs are clamped to this before they reach Lua (any larger cost exceeds every limit).
const MAX_COST: u64 = 1 << 52;
/// Extra TTL (ms) of state written at an overridden time: the override runs in fake time,
/// and real time must not expire state that the fake clock still considers live.
const SLACK_MS: u64 = 60_000;

/// What the script is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Check = 0,
    Peek = 1,
    Refund = 2,
    Sync = 3,
    Ban = 4,
}

/// The policy's limits as script arguments; refuses limits the script cannot decide
/// exactly.
pub(super) fn limit_args(policy: &Policy) -> Result<Vec<u64>, ConfigError> {
    let mut args = vec![
        u64::from(policy.shadow_mask()),
        policy.limits().len() as u64,
    ];
    for (i, l) in policy.limits().iter().enumerate() {
        match l.params {
            Params::Gcra(g) => {
                if g.cap > MAX_EXACT {
                    return Err(ConfigError::Store(format!(
                        "limit {i} ({}): the Redis store needs (burst + queue) * emission interval \
                         <= 2^51 ns (about 26 days); it is {:?}",
                        l.name(),
                        Duration::from_nanos(g.cap)
                    )));
                }
                args.extend([1, g.t, g.tau, g.cap, g.free]);
            }
            Params::Fixed(w) | Params::Sliding(w) => {
                if w.w % 1000 != 0 {
                    return Err(ConfigError::Store(format!(
                        "limit {i} ({}): the Redis store needs a window of whole microseconds",
                        l.name()
                    )));
                }
                if w.w > MAX_WINDOW_NS {
                    return Err(ConfigError::Store(format!(
                        "limit {i} ({}): the Redis store needs a window of at most 2^52 ns (about 52 days)",
                        l.name()
                    )));
                }
                if w.shift % 1000 != 0 {
                    return Err(ConfigError::Store(format!(
                        "limit {i} ({}): the Redis store needs a window offset of whole microseconds",
                        l.name()
                    )));
                }
                let w_us = w.w / 1000;
                if u128::from(w.limit) * u128::from(w_us) > u128::from(MAX_EXACT) {
                    return Err(ConfigError::Store(format!(
                        "limit {i} ({}): the Redis store needs limit * window (in microseconds) <= 2^51",
                        l.name()
                    )));
                }
                let kind = if matches!(l.params, Params::Fixed(_)) {
                    2
                } else {
                    3
                };
                args.extend([kind, w_us, w.limit, w.shift / 1000]);
            }
        }
    }
    Ok(args)
}

/// One call of a decision script: what it is asked, and the limits it decides under.
#[derive(Clone)]
pub(super) struct Args {
    pub(super) mode: Mode,
    /// Units (a duration in ns for a ban).
    pub(super) cost: u64,
    /// The time to decide at (ns), instead of the server's `TIME`.
    pub(super) now_ns: Option<u64>,
    /// The policy's limits, as [`limit_args`] gives them (shared: a store keeps its own
    /// policy's).
    pub(super) limits: Arc<[u64]>,
    /// Whether the general script decides even what the fast one could.
    pub(super) general: bool,
    /// A sync's floor: the state this instance holds for the key (see [`floor_args`]),
    /// which the shared state is raised to before the units are charged; empty for none.
    pub(super) floor: Vec<u64>,
}

impl Args {
    /// The call as one invocation on `key`: the fast GCRA script for checks and peeks of
    /// a single GCRA-based limit, the general script otherwise (or when `general`).
    pub(super) fn invocation(&self, key: &[u8], general: bool) -> Invocation {
        let (limits, now_ns) = (&self.limits, self.now_ns);
        let fast = fast_args(self.mode, limits, general);
        let script: &'static Script = if fast.is_some() {
            &GCRA_SCRIPT
        } else {
            &SCRIPT
        };
        let mut cmd =
            ::redis::Cmd::with_capacity(10 + limits.len(), 96 + key.len() + 8 * limits.len());
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(1).arg(key);
        let cost = self.cost.min(MAX_COST);
        if let Some((t, cap)) = fast {
            // See gcra_head.lua: one argument of four doubles (every value an integer below
            // 2^53, exact).
            let mut packed = [0u8; 32];
            for (slot, x) in packed
                .chunks_exact_mut(8)
                .zip([self.mode as u64, cost, t, cap])
            {
                slot.copy_from_slice(&(x as f64).to_le_bytes());
            }
            cmd.arg(&packed[..]);
            if let Some(ns) = now_ns {
                cmd.arg(ns / 1000).arg(SLACK_MS);
            }
            return Invocation { script, cmd };
        }
        cmd.arg(self.mode as u8).arg(cost);
        general_tail(&mut cmd, now_ns, limits);
        for a in &self.floor {
            cmd.arg(*a);
        }
        Invocation { script, cmd }
    }

    /// Appends the call to a batch's `records` (see `batch_head.lua`): the index of its
    /// key among the batch's keys and of its limits among the batch's lists (both 1-based,
    /// below 256), its kind (0 the fast GCRA path, 1 the general script), mode and cost,
    /// and the time override with its TTL slack.
    pub(super) fn batch_item(&self, records: &mut Vec<u8>, key: usize, list: usize) {
        let kind = u64::from(fast_args(self.mode, &self.limits, self.general).is_none());
        let timed = u64::from(self.now_ns.is_some());
        batch_record(
            records,
            key,
            list,
            kind,
            self.mode as u64,
            timed,
            self.cost.min(MAX_COST),
        );
        if let Some(ns) = self.now_ns {
            for x in [ns / 1000, SLACK_MS] {
                records.extend_from_slice(&(x as f64).to_le_bytes());
            }
        }
    }
}

/// A state of `policy` in the in-memory layout (at the server's time) as a sync's floor
/// (`general_head.lua`): a GCRA limit's TAT in microseconds, rounded up (0: none), a
/// window's tag and counts as they are. Refused by the script as nothing when a window's
/// tag is not the current one (or, for a sliding window, the previous one).
pub(super) fn floor_args(policy: &Policy, state: &[u64]) -> Vec<u64> {
    let mut out = Vec::with_capacity(policy.state_words());
    for (l, span) in policy.spans() {
        match l.params {
            Params::Gcra(_) => out.push(state[span.start].div_ceil(1000)),
            _ => out.extend_from_slice(&state[span]),
        }
    }
    out
}

/// A ban's duration as the scripts take it: nanoseconds, at most 2^52 (Lua numbers are
/// exact below 2^53 ns, about 104 days).
pub(super) fn ban_ns(ban: Duration) -> u64 {
    u64::try_from(ban.as_nanos())
        .unwrap_or(u64::MAX)
        .min(1 << 52)
}

/// The fast script's `(T, cap)` when it can decide this call.
fn fast_args(mode: Mode, limits: &[u64], general: bool) -> Option<(u64, u64)> {
    match mode {
        Mode::Check | Mode::Peek if !general => fast_gcra(limits),
        _ => None,
    }
}

/// The general script's arguments after mode and cost: the time override, the TTL slack
/// and the limits.
fn general_tail(cmd: &mut ::redis::Cmd, now_ns: Option<u64>, limits: &[u64]) {
    match now_ns {
        Some(ns) => cmd.arg(ns / 1000).arg(SLACK_MS),
        None => cmd.arg("").arg(0u64),
    };
    for a in limits {
        cmd.arg(*a);
    }
}

/// Appends a delete of the key at `key` to a batch's `records`.
pub(super) fn batch_delete(records: &mut Vec<u8>, key: usize, list: usize) {
    batch_record(records, key, list, 2, 0, 0, 0);
}

/// A request's first two doubles: its key, list, kind, mode and whether it is timed in
/// one, then its cost. Every value is an integer below 2^53, exact as a double.
fn batch_record(
    records: &mut Vec<u8>,
    key: usize,
    list: usize,
    kind: u64,
    mode: u64,
    timed: u64,
    cost: u64,
) {
    debug_assert!(key > 0 && key < 256 && list > 0 && list < 256);
    let what = key as u64 + 256 * (list as u64 + 256 * (kind + 4 * (mode + 8 * timed)));
    records.extend_from_slice(&(what as f64).to_le_bytes());
    records.extend_from_slice(&(cost as f64).to_le_bytes());
}

/// `(T, cap)` when the limit arguments describe one GCRA-based limit.
fn fast_gcra(limits: &[u64]) -> Option<(u64, u64)> {
    match limits {
        [_shadow, 1, 1, t, _tau, cap, _free] => Some((*t, *cap)),
        _ => None,
    }
}

/// A decision script's reply: an array of integers as it is, or the fast script's single
/// integer `fill * 4 + code` (see `gcra_head.lua`) as `[code, fill]`, its call for the
/// general script (3) as `[3]`.
pub(super) struct Ints(pub(super) Vec<i64>);

impl FromRedisValue for Ints {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::Int(3) => Ok(Ints(vec![3])),
            Value::Int(n) if n >= 0 => Ok(Ints(vec![n & 3, n >> 2])),
            v => Vec::<i64>::from_redis_value(v).map(Ints),
        }
    }
}

fn bad_reply(what: &str) -> StoreError {
    StoreError::backend(format!(
        "unexpected reply from the rate-limit script: {what}"
    ))
}

/// Turns a check / peek reply into the decision the in-memory store would have made.
pub(super) fn decode_decision(
    reply: &[i64],
    policy: &Policy,
    cost: u64,
) -> Result<Decision, StoreError> {
    if let (2, Some(g)) = (reply.len(), policy.single_gcra()) {
        // Fast path: the same decision function as the memory store, on the server's fill.
        // GCRA depends on TAT - now alone, so "now" is 0 here and the TAT is the fill.
        let fill = u64::try_from(reply[1]).map_err(|_| bad_reply("negative value"))?;
        let (outcome, _, report) = g.eval(fill, 0, cost.min(MAX_COST));
        let code = match outcome {
            Outcome::Allowed { .. } => 0,
            Outcome::Denied { .. } => 1,
            Outcome::Exceeds => 2,
        };
        if code != reply[0] {
            return Err(bad_reply("fast GCRA outcome disagrees with the client"));
        }
        return Ok(
            Decision::single_in(outcome, report, policy.name_tag(0), policy.shadow_mask())
                .with_source(Source::Store),
        );
    }
    let n = policy.limits().len();
    if reply.len() != 1 + 6 * n || reply[0] != n as i64 {
        return Err(bad_reply("length"));
    }
    let nn = |v: i64| u64::try_from(v).map_err(|_| bad_reply("negative value"));
    let mut reports = [LimitReport::default(); MAX_LIMITS];
    let mut wait = 0u64;
    let mut retry: Option<u64> = None;
    let mut exceeds = false;
    let mut would = Combine::default();
    let shadow = policy.shadow_mask();
    for (i, r) in reports.iter_mut().enumerate().take(n) {
        let f = &reply[1 + 6 * i..7 + 6 * i];
        let value = nn(f[1])?;
        let in_shadow = shadow & (1 << i) != 0;
        match f[0] {
            0 if in_shadow => {}
            0 => wait = wait.max(value),
            1 if in_shadow => would.add(Outcome::Denied {
                retry_after: Duration::from_nanos(value),
            }),
            2 if in_shadow => would.add(Outcome::Exceeds),
            1 => retry = Some(retry.map_or(value, |r| r.max(value))),
            2 => exceeds = true,
            _ => return Err(bad_reply("outcome code")),
        }
        *r = LimitReport {
            index: i as u8,
            name: policy.name_tag(i),
            allowed: f[2] == 1,
            remaining: nn(f[3])?,
            reset_after: nn(f[4])?,
            next_after: nn(f[5])?,
        };
    }
    let outcome = if exceeds {
        Outcome::Exceeds
    } else if let Some(r) = retry {
        Outcome::Denied {
            retry_after: Duration::from_nanos(r),
        }
    } else {
        Outcome::Allowed {
            wait: Duration::from_nanos(wait),
        }
    };
    let admitted = matches!(outcome, Outcome::Allowed { .. });
    Ok(Decision {
        outcome,
        source: Source::Store,
        len: n as u8,
        limits: reports,
        shadow: if admitted {
            crate::decision::shadow_code(would.outcome())
        } else {
            0
        },
    })
}

/// Turns a sync reply into the server's time (ns) and the state words in the in-memory
/// format, in the server's clock (GCRA: absolute TAT in ns; windows: tags and counts).
pub(super) fn decode_sync(
    reply: &[i64],
    policy: &Policy,
) -> Result<(u64, [u64; MAX_WORDS]), StoreError> {
    let words = policy.state_words();
    if reply.len() != 1 + words {
        return Err(bad_reply("sync length"));
    }
    let nn = |v: i64| u64::try_from(v).map_err(|_| bad_reply("negative value"));
    let now_ns = nn(reply[0])? * 1000;
    let mut out = [0u64; MAX_WORDS];
    let mut w = 0;
    for l in policy.limits() {
        match l.params {
            Params::Gcra(_) => {
                let fill = nn(reply[1 + w])?;
                out[w] = if fill == 0 { 0 } else { now_ns + fill };
                w += 1;
            }
            Params::Fixed(_) => {
                out[w] = nn(reply[1 + w])?;
                out[w + 1] = nn(reply[2 + w])?;
                w += 2;
            }
            Params::Sliding(_) => {
                for x in 0..3 {
                    out[w + x] = nn(reply[1 + w + x])?;
                }
                w += 3;
            }
        }
    }
    Ok((now_ns, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_scripts_one_integer_is_code_and_fill() {
        let ints = |v: Value| Ints::from_redis_value(v).map(|i| i.0).unwrap();
        assert_eq!(ints(Value::Int(0)), [0, 0]);
        assert_eq!(ints(Value::Int(4 * 7 + 1)), [1, 7]);
        assert_eq!(
            ints(Value::Int(4 * ((1 << 51) - 1) + 2)),
            [2, (1 << 51) - 1]
        );
        assert_eq!(ints(Value::Int(3)), [3], "the general script's turn");
        // The long form, and every other script's reply, as it is.
        assert_eq!(
            ints(Value::Array(vec![Value::Int(1), Value::Int(1 << 52)])),
            [1, 1 << 52]
        );
        assert!(Ints::from_redis_value(Value::Int(-4)).is_err());
    }
}
