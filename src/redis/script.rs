//! Lua scripts on Redis: one call ready to send, sent by `EVALSHA` and loaded again when
//! the server has lost it.

use ::redis::{
    aio::ConnectionLike, Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind,
};

/// One script call, ready to send: the script (for loading it again after a `NOSCRIPT`)
/// and its `EVALSHA` command, built straight into one buffer (redis-rs's
/// `ScriptInvocation` keeps every argument in its own allocation and then copies them into
/// a command).
pub(crate) struct Invocation {
    pub(crate) script: &'static Script,
    pub(crate) cmd: Cmd,
}

impl Invocation {
    /// `script` on `keys` with `args`.
    pub(crate) fn new(script: &'static Script, keys: &[&[u8]], args: &[&[u8]]) -> Self {
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len());
        for k in keys {
            cmd.arg(*k);
        }
        for a in args {
            cmd.arg(*a);
        }
        Invocation { script, cmd }
    }
}

/// Runs one invocation on `conn`; a server that lost its scripts (`NOSCRIPT`: restarted,
/// or `SCRIPT FLUSH`) gets the script loaded again and the call repeated once.
pub(crate) async fn run<T: FromRedisValue, C: ConnectionLike>(
    inv: &Invocation,
    conn: &mut C,
) -> RedisResult<T> {
    match inv.cmd.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            // Boxed: the load is rare, and the future of every call would carry its size.
            Box::pin(reload(inv, conn)).await
        }
        r => r,
    }
}

/// Loads the script of `inv` and sends `inv` again.
async fn reload<T: FromRedisValue, C: ConnectionLike>(
    inv: &Invocation,
    conn: &mut C,
) -> RedisResult<T> {
    inv.script.load_async(conn).await?;
    inv.cmd.query_async(conn).await
}
