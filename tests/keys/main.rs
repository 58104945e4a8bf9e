//! Key extractors through the public API: spoofing, proxy chains, IPv6 grouping, garbage,
//! bearer claims, and a bearer claim refused without a usable crypto provider.

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "jwt")]
mod jwt_provider;
mod keys;
