//! What every layer does the same way: its name, reading a request's key and what a
//! request without one becomes, and what a failed store means.

use std::sync::Arc;

use http::{Request, StatusCode};

use crate::error::ConfigError;
use crate::key::KeyExtractor;
use crate::observe::KeylessWarning;
use crate::options::{MissingKey, OnStoreError};
use crate::response::{grpc, own_answer, OwnAnswer};

/// The words of a layer's own answers and events.
#[derive(Debug)]
pub(crate) struct Wording {
    /// The layer's kind in events: `in-flight limit`.
    pub(crate) kind: &'static str,
    /// The detail of a keyless request's rejection.
    pub(crate) no_key: &'static str,
    /// The detail of a failed store's `503` under `OnStoreError::FailClosed`.
    pub(crate) store_down: &'static str,
}

/// The options every layer's builder holds, set by its `label`, `on_missing_key` and
/// `on_store_error`.
#[derive(Clone, Debug)]
pub(crate) struct CommonOptions {
    pub(crate) label: String,
    pub(crate) missing: MissingKey,
    pub(crate) on_error: OnStoreError,
}

impl CommonOptions {
    /// Named `label`, keyless requests refused, stores failing open.
    pub(crate) fn new(label: &str) -> Self {
        CommonOptions {
            label: label.into(),
            missing: MissingKey::default(),
            on_error: OnStoreError::default(),
        }
    }

    /// The options at work. Refuses a label that cannot be sent in a header (empty, or not
    /// printable ASCII) or holds one of `forbidden`.
    pub(crate) fn build(
        self,
        forbidden: &[u8],
        wording: &'static Wording,
    ) -> Result<Common, ConfigError> {
        let label = self.label;
        if label.is_empty()
            || !label
                .bytes()
                .all(|b| (0x20..=0x7e).contains(&b) && !forbidden.contains(&b))
        {
            return Err(ConfigError::InvalidName(label));
        }
        Ok(Common {
            label: label.into(),
            missing: self.missing,
            on_error: self.on_error,
            warned: KeylessWarning::default(),
            wording,
        })
    }
}

/// What a request's key makes of it.
pub(crate) enum Keyed<K> {
    /// Decided on this key (`None`: the state keyless requests share).
    Key(Option<K>),
    /// Through, unlimited (a keyless request under `MissingKey::Allow`).
    Unlimited,
    /// Refused with this status (a keyless request under `MissingKey::Reject`).
    Refuse(StatusCode),
}

/// The options at work, shared by every service of one layer.
#[derive(Debug)]
pub(crate) struct Common {
    /// The layer's name (checked).
    pub(crate) label: Arc<str>,
    missing: MissingKey,
    on_error: OnStoreError,
    /// Whether the extractor's misconfiguration was logged already (once per layer).
    warned: KeylessWarning,
    pub(crate) wording: &'static Wording,
}

impl Common {
    /// What a failed store means for the layer's requests.
    #[inline]
    pub(crate) fn on_error(&self) -> OnStoreError {
        self.on_error
    }

    /// `req`'s key, or what a request without one becomes.
    #[inline]
    pub(crate) fn key<Req, X: KeyExtractor<Req>>(&self, key: &X, req: &Req) -> Keyed<X::Key> {
        match key.extract(req) {
            Some(k) => Keyed::Key(Some(k)),
            None => self.keyless(key, req),
        }
    }

    /// A request without a key: logged once per layer when the extractor says why, then
    /// `MissingKey` decides.
    #[cold]
    fn keyless<Req, X: KeyExtractor<Req>>(&self, key: &X, req: &Req) -> Keyed<X::Key> {
        self.warned
            .keyless(key, req, &self.label, self.missing, self.wording.kind);
        match self.missing {
            MissingKey::Reject(status) => Keyed::Refuse(status),
            MissingKey::Allow => Keyed::Unlimited,
            _ => Keyed::Key(None),
        }
    }

    /// An HTTP layer's answer to a request without a key, refused with `status`: a
    /// problem body, or a gRPC status for a gRPC request.
    #[cold]
    pub(crate) fn keyless_answer<B>(&self, req: &Request<B>, status: StatusCode) -> OwnAnswer {
        Box::new(own_answer(
            grpc::is_grpc(req.headers()),
            status,
            self.wording.no_key,
        ))
    }
}

/// What a layer makes of an HTTP request it decided at once: the inner service called,
/// the response getting `H` (`Ok`; `None`: through without fields), or an answer of the
/// layer's own (`Err`).
pub(crate) type Verdict<H> = Result<Option<H>, OwnAnswer>;

/// What a failed store makes of an HTTP request under `on_error`: through without fields
/// (fail open), or a `503` of the layer's own with `wording`'s detail (fail closed).
#[cold]
pub(crate) fn store_failed<B, H>(
    on_error: OnStoreError,
    wording: &Wording,
    req: &Request<B>,
) -> Verdict<H> {
    match on_error {
        OnStoreError::FailClosed => Err(Box::new(own_answer(
            grpc::is_grpc(req.headers()),
            StatusCode::SERVICE_UNAVAILABLE,
            wording.store_down,
        ))),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static WORDS: Wording = Wording {
        kind: "test limit",
        no_key: "no key",
        store_down: "store down",
    };

    fn label(label: &str, forbidden: &[u8]) -> Result<Arc<str>, ConfigError> {
        let mut options = CommonOptions::new("default");
        options.label = label.into();
        options.build(forbidden, &WORDS).map(|c| c.label)
    }

    #[test]
    fn labels_must_be_printable_and_without_the_forbidden_bytes() {
        assert!(label("", b"").is_err());
        assert!(label("é", b"").is_err());
        assert!(label("a\nb", b"").is_err());
        assert!(label("a{b}", b"{}").is_err());
        assert_eq!(&*label("a{b}", b"").unwrap(), "a{b}");
        assert_eq!(&*label("a\"b", b"{}").unwrap(), "a\"b");
    }
}
