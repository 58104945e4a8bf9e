//! Where a single-node connection goes: one address (a URL, its host name resolved again
//! at every connection), or the master of a Sentinel-managed group, asked of its
//! sentinels each time. Either way a new connection is checked with `ROLE` before it is
//! used: a replica, or a demoted master, is not a place to decide.

use std::fmt;
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use ::redis::{AsyncConnectionConfig, Client, IntoConnectionInfo, RedisError, TlsMode};

use crate::error::StoreError;

/// The most one connection attempt may take (TCP, TLS, `HELLO`, `ROLE`).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Where a connection goes. See the [module docs](self).
pub(crate) enum Target {
    /// One server.
    Node(Client),
    /// The master of `service`, as its sentinels name it.
    Sentinel {
        /// The sentinels, with their own connections (kept between lookups).
        sentinels: tokio::sync::Mutex<Sentinel>,
        service: String,
        /// How to reach the master: TLS, credentials, database.
        node: SentinelNodeConnectionInfo,
        /// What the URL named, for messages (without credentials).
        shown: String,
    },
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Node(c) => write!(f, "{:?}", c.get_connection_info().addr()),
            Target::Sentinel { shown, .. } => f.write_str(shown),
        }
    }
}

fn backend(e: RedisError) -> StoreError {
    StoreError::backend(e)
}

fn refused(url: &str, why: &str) -> StoreError {
    StoreError::backend(format!("invalid Redis Sentinel URL {url:?}: {why}"))
}

impl Target {
    /// The target a URL names: `redis://`, `rediss://`, `redis+unix://`, `unix://` (one
    /// server), or `redis+sentinel://` / `rediss+sentinel://` (see [`Target::sentinel`]).
    pub(crate) fn parse(url: &str) -> Result<Target, StoreError> {
        match url.split_once("+sentinel://") {
            Some((scheme @ ("redis" | "rediss"), rest)) => Target::sentinel(url, scheme, rest),
            _ => Client::open(url).map(Target::Node).map_err(backend),
        }
    }

    /// `redis+sentinel://[user:pass@]host[:port][,host[:port]...]/service[/db]`, the form
    /// Python's `limits`, Celery and Kombu read (port 26379 by default). The credentials
    /// are sent to the sentinels and to the master alike; `rediss+sentinel://` speaks TLS
    /// to both (`#insecure` at the end skips certificate checks, for tests).
    fn sentinel(url: &str, scheme: &str, rest: &str) -> Result<Target, StoreError> {
        let (rest, insecure) = match rest.strip_suffix("#insecure") {
            Some(r) => (r, true),
            None => (rest, false),
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let mut parts = path.split('/');
        let service = parts.next().unwrap_or("");
        if service.is_empty() {
            return Err(refused(url, "no master name (…/NAME[/DB])"));
        }
        let db = parts.next().filter(|d| !d.is_empty()).unwrap_or("0");
        if db.parse::<u32>().is_err() || parts.next().is_some() {
            return Err(refused(url, "the path must be /NAME or /NAME/DB"));
        }
        let node_scheme = if scheme == "rediss" {
            "rediss"
        } else {
            "redis"
        };
        let auth = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        let fragment = if insecure { "#insecure" } else { "" };
        let mut sentinels = Vec::new();
        for host in hosts.split(',') {
            if host.is_empty() {
                return Err(refused(url, "an empty sentinel address"));
            }
            // A port is written after the host (an IPv6 address in brackets).
            let has_port = if host.starts_with('[') {
                host.contains("]:")
            } else {
                host.contains(':')
            };
            let with_port = if has_port {
                host.to_owned()
            } else {
                format!("{host}:26379")
            };
            let info = format!("{node_scheme}://{auth}{with_port}/{fragment}")
                .into_connection_info()
                .map_err(|e| refused(url, &e.to_string()))?;
            sentinels.push(info);
        }
        // The master's credentials and database, decoded as redis-rs decodes a URL.
        let master = format!("{node_scheme}://{auth}{}/{db}{fragment}", "localhost")
            .into_connection_info()
            .map_err(|e| refused(url, &e.to_string()))?;
        let mut node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(master.redis_settings().clone());
        if scheme == "rediss" {
            node = node.set_tls_mode(if insecure {
                TlsMode::Insecure
            } else {
                TlsMode::Secure
            });
        }
        let sentinel = Sentinel::build(sentinels).map_err(backend)?;
        Ok(Target::Sentinel {
            sentinels: tokio::sync::Mutex::new(sentinel),
            service: service.to_owned(),
            node,
            shown: format!("{scheme}+sentinel://{hosts}/{service}/{db}"),
        })
    }

    /// The client of the server to use now: the URL's, or the master the sentinels name
    /// (checked with `ROLE` by redis-rs).
    async fn client(&self) -> Result<Client, RedisError> {
        match self {
            Target::Node(c) => Ok(c.clone()),
            Target::Sentinel {
                sentinels,
                service,
                node,
                ..
            } => {
                let mut s = sentinels.lock().await;
                s.async_master_for(service, Some(node)).await
            }
        }
    }

    /// A new connection to the server to use now, checked to be a master: refused when
    /// `ROLE` names it a replica (a demoted master, or a name still pointing at one).
    /// A server where `ROLE` is not allowed (a restricted user) is taken as it is.
    pub(crate) async fn connect(&self) -> Result<(MultiplexedConnection, String), StoreError> {
        let attempt = async {
            let client = self.client().await.map_err(backend)?;
            let config = AsyncConnectionConfig::new().set_connection_timeout(Some(CONNECT_TIMEOUT));
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(backend)?;
            let role: Result<::redis::Value, RedisError> =
                ::redis::cmd("ROLE").query_async(&mut conn).await;
            let addr = format!("{:?}", client.get_connection_info().addr());
            if let Ok(::redis::Value::Array(parts)) = &role {
                let is = |want: &[u8]| {
                    matches!(parts.first(), Some(::redis::Value::BulkString(b)) if b == want)
                        || matches!(parts.first(), Some(::redis::Value::SimpleString(s)) if s.as_bytes() == want)
                };
                if !is(b"master") {
                    return Err(StoreError::backend(format!(
                        "{addr} is not a master (ROLE says it is a replica): not used"
                    )));
                }
            }
            Ok((conn, addr))
        };
        match tokio::time::timeout(CONNECT_TIMEOUT * 2, attempt).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(CONNECT_TIMEOUT * 2)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(url: &str) -> String {
        match Target::parse(url) {
            Ok(Target::Sentinel { shown, service, .. }) => format!("{shown} {service}"),
            Ok(Target::Node(_)) => "node".into(),
            Err(e) => format!("error: {e}"),
        }
    }

    #[test]
    fn sentinel_urls() {
        assert_eq!(
            shown("redis+sentinel://10.0.0.1:26379,10.0.0.2,s3:26380/mymaster"),
            "redis+sentinel://10.0.0.1:26379,10.0.0.2,s3:26380/mymaster/0 mymaster"
        );
        assert_eq!(
            shown("redis+sentinel://:secret@[::1]:5000,[::2]/m/3"),
            "redis+sentinel://[::1]:5000,[::2]/m/3 m"
        );
        assert!(
            !shown("redis+sentinel://u:sekret@h/m").contains("sekret"),
            "no credentials shown"
        );
        assert_eq!(shown("redis://127.0.0.1:6379/0"), "node");
        for bad in [
            "redis+sentinel://h1,h2",
            "redis+sentinel://h1/",
            "redis+sentinel://h1/m/x",
            "redis+sentinel://h1/m/1/2",
            "redis+sentinel://h1,,h2/m",
        ] {
            assert!(shown(bad).starts_with("error: "), "{bad}: {}", shown(bad));
        }
    }
}
