//! Redis key names: `{namespace}:{name}:{kind}:{material}` with the material in braces
//! (the cluster hash tag), `name` the store's (a limit's identity: stores share state only
//! under the same name) and `kind` naming the store and its layout (`rate:v4` for the rate
//! store, `inflight:v2`, `fair:v2`). The material is the SHA-1 of the key's bytes in hex, so a key
//! name shows no client's API key or address; in readable mode (for debugging) short
//! printable keys are written as they are.

use crate::error::ConfigError;

/// Key material longer than this is hashed.
const MAX_RAW: usize = 64;

/// Whether a byte may appear in raw key material: printable ASCII without space, the
/// braces (they delimit the hash tag) and `#` (it marks hashed material).
fn raw_ok(b: u8) -> bool {
    (0x21..=0x7e).contains(&b) && !matches!(b, b'{' | b'}' | b'#')
}

/// Checks a namespace: non-empty printable ASCII without braces or spaces.
pub(crate) fn check_namespace(ns: &str) -> Result<(), ConfigError> {
    if ns.is_empty()
        || ns.len() > 128
        || !ns
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b'{' && b != b'}')
    {
        return Err(ConfigError::Store(format!(
            "Redis namespace {ns:?} must be 1-128 printable ASCII characters without spaces or braces"
        )));
    }
    Ok(())
}

/// The key prefix of what a namespace's stores share (`fleet`): `{namespace}:{kind}:{`.
pub(crate) fn prefix(namespace: &str, kind: &str) -> Vec<u8> {
    format!("{namespace}:{kind}:{{").into_bytes()
}

/// The key prefix of the store `name` of `kind`: `{namespace}:{name}:{kind}:{`.
pub(crate) fn store_prefix(namespace: &str, name: &str, kind: &str) -> Vec<u8> {
    format!("{namespace}:{name}:{kind}:{{").into_bytes()
}

/// How one store names its keys: its prefix, and whether short printable key material is
/// written as it is (readable mode) instead of hashed.
#[derive(Clone, Debug)]
pub(crate) struct KeyNames {
    prefix: Vec<u8>,
    readable: bool,
}

impl KeyNames {
    /// The names of the store `name` of `kind` under `namespace`.
    pub(crate) fn new(namespace: &str, name: &str, kind: &str, readable: bool) -> Self {
        KeyNames {
            prefix: store_prefix(namespace, name, kind),
            readable,
        }
    }

    /// `{namespace}:{name}:{kind}:{`.
    pub(crate) fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The full Redis key of the material `write` appends: hashed, or in readable mode as
    /// it is when it is short and printable.
    pub(crate) fn key(&self, write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.prefix.len() + 44);
        out.extend_from_slice(&self.prefix);
        let start = out.len();
        write(&mut out);
        let material = &out[start..];
        if !self.readable || material.len() > MAX_RAW || !material.iter().all(|&b| raw_ok(b)) {
            let digest = sha1_smol::Sha1::from(material).digest().bytes();
            out.truncate(start);
            out.push(b'#');
            push_hex(&mut out, &digest);
        }
        out.push(b'}');
        out
    }
}

/// Appends the SHA-1 of `material` in lowercase hex: how key names hide a key's bytes.
pub(crate) fn push_sha1_hex(out: &mut Vec<u8>, material: &[u8]) {
    push_hex(out, &sha1_smol::Sha1::from(material).digest().bytes());
}

/// Each byte's two lowercase hex digits.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        pairs[i] = [HEX[i >> 4], HEX[i & 15]];
        i += 1;
    }
    pairs
};

/// Appends a SHA-1 digest in lowercase hex: what the digest's `Display` writes, without the
/// formatting machinery (a `String` and a formatter call per byte).
fn push_hex(out: &mut Vec<u8>, bytes: &[u8; 20]) {
    let mut hex = [0u8; 40];
    for (pair, &b) in hex.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&HEX_PAIRS[usize::from(b)]);
    }
    out.extend_from_slice(&hex);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key of `material` in the rate store's names.
    fn redis_key(names: &KeyNames, material: &str) -> Vec<u8> {
        names.key(|out| out.extend_from_slice(material.as_bytes()))
    }

    #[test]
    fn layout() {
        let p = KeyNames::new("tollgate", "api", "rate:v4", true);
        let k = String::from_utf8(redis_key(&p, "192.0.2.1")).unwrap();
        assert_eq!(k, "tollgate:api:rate:v4:{192.0.2.1}");
    }

    /// Regression: API keys were written into Redis key names as they were, readable with
    /// `SCAN` and `MONITOR`.
    #[test]
    fn key_material_is_hashed_by_default() {
        let p = KeyNames::new("tollgate", "api", "rate:v4", false);
        let k = String::from_utf8(redis_key(&p, "sk_live_abc123")).unwrap();
        assert!(!k.contains("sk_live_abc123"), "{k}");
        assert!(k.ends_with(&format!(
            "#{}}}",
            sha1_smol::Sha1::from("sk_live_abc123").digest()
        )));
    }

    #[test]
    fn long_or_binary_material_is_hashed() {
        let p = KeyNames::new("t", "api", "rate:v4", true);
        let long = "x".repeat(65);
        let k = String::from_utf8(redis_key(&p, &long)).unwrap();
        assert!(k.ends_with('}') && k.contains(":{#"), "{k}");
        assert_eq!(k.len(), p.prefix().len() + 1 + 40 + 1);
        let exactly = "x".repeat(64);
        assert!(String::from_utf8(redis_key(&p, &exactly))
            .unwrap()
            .contains(&exactly));
        for odd in ["a b", "a{b", "a}b", "#abc", "é"] {
            let k = redis_key(&p, odd);
            assert_eq!(k.len(), p.prefix().len() + 42, "{odd}");
        }
        // Stable: SHA-1 of "a b".
        let k = String::from_utf8(redis_key(&p, "a b")).unwrap();
        assert!(
            k.ends_with("#7dbde93504122a707f849f2c12bdd9de71b41929}"),
            "{k}"
        );
        assert_ne!(redis_key(&p, "a b"), redis_key(&p, "a  b"));
    }

    #[test]
    fn hex_is_what_a_digest_displays() {
        for input in ["", "a", "sk_live_abc123", "\u{ff}\u{0}"] {
            let digest = sha1_smol::Sha1::from(input).digest();
            let mut out = b"x".to_vec();
            push_hex(&mut out, &digest.bytes());
            assert_eq!(out, format!("x{digest}").into_bytes(), "{input:?}");
        }
    }

    #[test]
    fn namespaces() {
        assert!(check_namespace("tollgate").is_ok());
        assert!(check_namespace("").is_err());
        assert!(check_namespace("a{b").is_err());
        assert!(check_namespace("a b").is_err());
    }
}
