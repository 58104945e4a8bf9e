//! Traces from files: CSV or JSON lines, an error naming its line.

use super::replay::check_time;
use super::units::{cost_of, decimal_ns};
use super::{shown, Arrival, SimError, NS};

/// How a trace file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `time,key,cost` per line: time in seconds since the trace's start, cost optional
    /// (default 1); an optional header line; `#` comments.
    Csv,
    /// One JSON object per line: `{"time": 1.25, "key": "alice", "cost": 2}`, cost
    /// optional (default 1).
    JsonLines,
}

impl Format {
    /// By the file's extension: `.jsonl`, `.ndjson` and `.json` are JSON lines, anything
    /// else CSV.
    pub fn of_path(path: &str) -> Format {
        let lower = path.to_ascii_lowercase();
        if [".jsonl", ".ndjson", ".json"]
            .iter()
            .any(|e| lower.ends_with(e))
        {
            Format::JsonLines
        } else {
            Format::Csv
        }
    }
}

/// Reads a trace. Times must not go backwards; an error names its line.
pub fn parse_trace(text: &str, format: Format) -> Result<Vec<Arrival>, SimError> {
    let mut trace = Vec::new();
    // The previous arrival's time, as written and in ns.
    let mut previous: Option<(String, u64)> = None;
    let mut header_allowed = true;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let content = raw.trim();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let (time, key, cost) = match format {
            Format::Csv => {
                let fields: Vec<&str> = content.split(',').map(str::trim).collect();
                // The first line may be a header: `time,key` or `time,key,cost`.
                if header_allowed && is_header(&fields) {
                    header_allowed = false;
                    continue;
                }
                if !(2..=3).contains(&fields.len()) {
                    return Err(SimError::at(
                        line,
                        format!(
                            "expected `time,key` or `time,key,cost`, found {} fields",
                            fields.len()
                        ),
                    ));
                }
                let cost = match fields.get(2) {
                    Some(c) => cost_of(c).map_err(|e| SimError::at(line, e))?,
                    None => 1,
                };
                (fields[0].to_owned(), fields[1].to_owned(), cost)
            }
            Format::JsonLines => json_line(content).map_err(|e| SimError::at(line, e))?,
        };
        header_allowed = false;
        if key.is_empty() {
            return Err(SimError::at(line, "the key is empty"));
        }
        let at = decimal_ns(&time, NS)
            .map_err(|e| format!("time {e}"))
            .and_then(|at| check_time(at, &time))
            .map_err(|e| SimError::at(line, e))?;
        if let Some((prev_text, prev)) = &previous {
            if at < *prev {
                return Err(SimError::at(
                    line,
                    format!(
                        "time {} is before the previous {}",
                        shown(&time),
                        shown(prev_text)
                    ),
                ));
            }
        }
        previous = Some((time, at));
        trace.push(Arrival { at, key, cost });
    }
    if trace.is_empty() {
        return Err(SimError::new("the trace has no requests"));
    }
    Ok(trace)
}

/// Whether CSV fields are the header line: `time,key` or `time,key,cost`, in any case.
fn is_header(fields: &[&str]) -> bool {
    let names = ["time", "key", "cost"];
    (2..=3).contains(&fields.len())
        && fields
            .iter()
            .zip(names)
            .all(|(f, name)| f.eq_ignore_ascii_case(name))
}

/// One JSON line: its time (as written), key and cost.
fn json_line(content: &str) -> Result<(String, String, u64), String> {
    let value: serde_json::Value =
        serde_json::from_str(content).map_err(|e| format!("not JSON: {e}"))?;
    let obj = value
        .as_object()
        .ok_or("expected an object such as {\"time\": 1.5, \"key\": \"a\", \"cost\": 1}")?;
    let time = match obj.get("time") {
        Some(serde_json::Value::Number(n)) => {
            let text = n.to_string();
            if text.contains(['e', 'E']) {
                // An exponent (1e-7): to nanoseconds through a float, the only place one is
                // used.
                let secs = n.as_f64().unwrap_or(-1.0);
                if secs < 0.0 {
                    return Err(format!("time {} is negative", shown(&text)));
                }
                format!("{:.9}", secs)
            } else {
                text
            }
        }
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => {
            let other = other.to_string();
            return Err(format!("time {} is not a number of seconds", shown(&other)));
        }
        None => return Err("no \"time\" field".into()),
    };
    let key = match obj.get("key") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        Some(other) => return Err(format!("key {} is not a string", shown(&other.to_string()))),
        None => return Err("no \"key\" field".into()),
    };
    let cost = match obj.get("cost") {
        None => 1,
        Some(serde_json::Value::Number(n)) => cost_of(&n.to_string())?,
        Some(other) => {
            let other = other.to_string();
            return Err(format!("cost {} is not a whole number", shown(&other)));
        }
    };
    Ok((time, key, cost))
}
