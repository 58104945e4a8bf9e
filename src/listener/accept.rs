//! [`LimitedListener`]: the accept loop, which closes refused connections as it accepts
//! them, and its `axum::serve::Listener` implementation.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use super::gate::Gate;
use super::stream::LimitedStream;

/// How long to pause after an accept error that is not the peer's (out of descriptors):
/// connections may close meanwhile.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// How long new connections wait in the backlog, at most, for evicted ones to close
/// (each closes when its task next runs, later on a busy server), before the next is
/// refused.
const EVICTED_CLOSE_WAIT: Duration = Duration::from_millis(250);

/// A `tokio::net::TcpListener` that enforces [`ConnectionLimits`](super::ConnectionLimits) as it accepts: a refused
/// connection is closed at once, before any byte of it is read. It is an
/// `axum::serve::Listener`: `axum::serve(listener, app)`.
///
/// See the [module docs](super).
pub struct LimitedListener {
    inner: TcpListener,
    gate: Arc<Gate>,
}

impl fmt::Debug for LimitedListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (open, groups) = self.gate.open();
        f.debug_struct("LimitedListener")
            .field("inner", &self.inner)
            .field("open", &open)
            .field("address_groups", &groups)
            .finish_non_exhaustive()
    }
}

impl LimitedListener {
    pub(super) fn new(inner: TcpListener, gate: Arc<Gate>) -> Self {
        LimitedListener { inner, gate }
    }

    /// How many connections are open through this listener now.
    pub fn open_connections(&self) -> usize {
        self.gate.open().0 as usize
    }

    /// The cap on open connections ([`ConnectionLimits::max_total`](super::ConnectionLimits::max_total),
    /// or the one derived from the descriptor limit), if any.
    pub fn max_connections(&self) -> Option<usize> {
        self.gate.max_total.map(|n| n as usize)
    }

    /// Accepts the next admitted connection: refused ones are closed and counted on the
    /// way, and accept errors are logged and retried. While the listener is full and the
    /// connections evicted to make room have not closed yet, new ones wait in the backlog
    /// (a moment: an evicted connection closes at its task's next poll).
    async fn next(&mut self) -> (LimitedStream, SocketAddr) {
        loop {
            let until = tokio::time::Instant::now() + EVICTED_CLOSE_WAIT;
            loop {
                // Told of a close after this point (a close before it may have left a
                // permit: hence the loop).
                let closed = self.gate.evicted_closed.notified();
                if !self.gate.saturated() || tokio::time::timeout_at(until, closed).await.is_err() {
                    break;
                }
            }
            let (io, addr) = match self.inner.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    self.gate.watch.accept_failed(&e);
                    if !is_connection_error(&e) {
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    }
                    continue;
                }
            };
            match self.gate.admit(addr.ip()) {
                Ok(place) => return (LimitedStream::new(io, place), addr),
                Err(why) => {
                    close_now(io);
                    self.gate
                        .watch
                        .refused(why, self.gate.group.group(addr.ip()));
                }
            }
        }
    }
}

/// Closes a refused connection with a reset: the client learns at once, and the server
/// keeps no `TIME_WAIT` state for it. A zero linger never blocks on close.
fn close_now(io: TcpStream) {
    #[allow(deprecated)] // deprecated for non-zero lingers, which block on drop
    let _ = io.set_linger(Some(Duration::ZERO));
    drop(io);
}

/// Errors of one connection (it went away before it was accepted), not of the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

impl axum::serve::Listener for LimitedListener {
    type Io = LimitedStream;
    type Addr = SocketAddr;

    fn accept(&mut self) -> impl std::future::Future<Output = (LimitedStream, SocketAddr)> + Send {
        self.next()
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}
