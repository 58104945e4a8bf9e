//! Policies to replay against, from the command line or a policies file.

use tollgate::{policy::PolicySet, Policy};

use super::{quoted, SimError};

/// A policy to replay against and the name it is shown under.
#[derive(Debug, Clone)]
pub struct Named {
    pub label: String,
    pub policy: Policy,
}

/// A policy written on the command line: its text is its label.
pub fn policy_arg(text: &str) -> Result<Named, SimError> {
    let policy = text
        .parse::<Policy>()
        .map_err(|e| SimError::new(format!("policy {}: {e}", quoted(text))))?;
    Ok(Named {
        label: text.to_owned(),
        policy,
    })
}

/// A policies file, as [`PolicySet::from_text`] reads it: `name = policy` per line, `*`
/// for limits every policy also applies, `#` comments. Each named policy is replayed.
pub fn policies_file(text: &str) -> Result<Vec<Named>, SimError> {
    let set = PolicySet::from_text(text).map_err(|e| match e {
        tollgate::ConfigError::Line { line, error } => SimError::at(line, error.to_string()),
        other => SimError::new(other.to_string()),
    })?;
    let named: Vec<Named> = set
        .names()
        .filter_map(|name| {
            Some(Named {
                label: name.to_owned(),
                policy: set.policy(name)?.clone(),
            })
        })
        .collect();
    if named.is_empty() {
        return Err(SimError::new("the policies file names no policy"));
    }
    Ok(named)
}
