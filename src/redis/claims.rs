//! Which limits the stores of one connection apply under each name: two stores that
//! would share keys (the same namespace, kind and name) while applying different limits
//! are refused, since each would read the other's state as its own.
//!
//! A store claims its identity when it is built, with what it applies; the claim follows
//! what its layer installs (a set of plans, a swap) and ends when the store (every clone
//! of it) is dropped. One connection (with its clones) is one instance, as for the fleet:
//! separate instances of a rolling deploy may apply different quotas under one name, and
//! share its state on purpose.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::connection::RedisConnection;
use crate::error::ConfigError;
use crate::policy::Policy;

/// The claims of one connection, by identity (attached to the connection).
#[derive(Default)]
pub(crate) struct Claims(Mutex<HashMap<String, Vec<Entry>>>);

struct Entry {
    id: u64,
    /// What the limits read and write (a policy's fingerprints, a pool's parameters).
    fingerprint: u64,
    /// The same, in words, for the error.
    applies: String,
}

/// A store's claim on its identity; gone when dropped.
pub(crate) struct Claim {
    claims: Arc<Claims>,
    identity: String,
    name: String,
    namespace: String,
    id: u64,
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.identity)
    }
}

impl Claims {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Entry>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Claim {
    /// Claims `kind` `name` in `namespace` on `conn` for limits of `fingerprint`
    /// (`applies` says which). Refused when another live store of the same identity on
    /// this connection applies other limits.
    pub(crate) fn new(
        conn: &RedisConnection,
        namespace: &str,
        kind: &str,
        name: &str,
        fingerprint: u64,
        applies: String,
    ) -> Result<Claim, ConfigError> {
        static IDS: AtomicU64 = AtomicU64::new(1);
        let claims = conn.attached::<Claims>();
        let identity = format!("{namespace}:{name}:{kind}");
        let claim = Claim {
            claims,
            identity,
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            id: IDS.fetch_add(1, Ordering::Relaxed),
        };
        let mut all = claim.claims.entries();
        let entries = all.entry(claim.identity.clone()).or_default();
        claim.check(entries, fingerprint, &applies)?;
        entries.push(Entry {
            id: claim.id,
            fingerprint,
            applies,
        });
        drop(all);
        Ok(claim)
    }

    /// The claim now applies limits of `fingerprint` (a layer installed other policies on
    /// the store); refused, leaving it as it was, when another store of the same identity
    /// applies others.
    pub(crate) fn update(&self, fingerprint: u64, applies: String) -> Result<(), ConfigError> {
        let mut all = self.claims.entries();
        let entries = all.entry(self.identity.clone()).or_default();
        self.check(entries, fingerprint, &applies)?;
        if let Some(e) = entries.iter_mut().find(|e| e.id == self.id) {
            e.fingerprint = fingerprint;
            e.applies = applies;
        }
        Ok(())
    }

    fn check(&self, entries: &[Entry], fingerprint: u64, applies: &str) -> Result<(), ConfigError> {
        match entries
            .iter()
            .find(|e| e.id != self.id && e.fingerprint != fingerprint)
        {
            None => Ok(()),
            Some(other) => Err(ConfigError::Store(format!(
                "two Redis stores named {name:?} (namespace {ns:?}) on one connection would \
                 share each key's state while applying different limits: one applies {other}, \
                 this one {applies}. Give each limit a name of its own; stores share state \
                 only under the same name, on purpose",
                name = self.name,
                ns = self.namespace,
                other = other.applies,
            ))),
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut all = self.claims.entries();
        if let Some(entries) = all.get_mut(&self.identity) {
            entries.retain(|e| e.id != self.id);
            if entries.is_empty() {
                all.remove(&self.identity);
            }
        }
    }
}

/// Checks a store's name: 1 to 64 of ASCII letters, digits, `.`, `_` and `-`.
pub(crate) fn check_name(name: &str) -> Result<(), ConfigError> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(ConfigError::Store(format!(
            "Redis store name {name:?} must be 1-64 ASCII letters, digits, '.', '_' or '-'"
        )));
    }
    Ok(())
}

/// What a store applying `policies` reads and writes, for its claim: one fingerprint of
/// them all (in any order), and their limits in words.
pub(crate) fn policies_claim<'a>(policies: impl IntoIterator<Item = &'a Policy>) -> (u64, String) {
    let mut prints = Vec::new();
    let mut words = Vec::new();
    for p in policies {
        prints.push(p.fingerprint());
        let limits: Vec<&str> = p.limits().iter().map(|l| l.name()).collect();
        words.push(limits.join(" + "));
    }
    prints.sort_unstable();
    prints.dedup();
    words.sort();
    words.dedup();
    let fingerprint = prints.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, p| {
        (h ^ p).wrapping_mul(0x0100_0000_01b3)
    });
    (fingerprint, format!("[{}]", words.join(", ")))
}
