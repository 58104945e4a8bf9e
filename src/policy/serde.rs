//! Policies from configuration files (feature `serde`): a policy is its text, a set is a
//! map from names to texts, `*` holding the limits every policy applies, in document
//! order (the first policy is the fallback).
//!
//! ```
//! use tollgate::policy::PolicySet;
//!
//! let plans: PolicySet = serde_json::from_str(
//!     r#"{ "free": "10/min", "pro": "100/min", "*": "daily: 1000/day window" }"#,
//! )?;
//! assert_eq!(plans.names().collect::<Vec<_>>(), ["free", "pro"]);
//!
//! let bad = serde_json::from_str::<PolicySet>(r#"{ "free": "10/mni" }"#).unwrap_err();
//! assert!(bad.to_string().contains("\"mni\""), "{bad}");
//! # Ok::<(), serde_json::Error>(())
//! ```

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::Deserialize;
use serde::Deserializer;

use super::{Policy, PolicySet};

impl<'de> Deserialize<'de> for Policy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for PolicySet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = PolicySet;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from policy names to policies written as text")
            }

            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<PolicySet, M::Error> {
                let mut entries = Vec::new();
                let mut n = 0;
                while let Some((name, policy)) = map.next_entry::<String, Policy>()? {
                    n += 1;
                    entries.push((name, policy, n));
                }
                PolicySet::from_entries(entries).map_err(de::Error::custom)
            }
        }
        d.deserialize_map(Entries)
    }
}
