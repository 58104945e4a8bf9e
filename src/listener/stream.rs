//! [`LimitedStream`]: an admitted connection, holding its place in the listener's counts
//! until it closes; its bytes followed both ways to know whose turn it is, closed when it
//! is late or too slow while the server waits on it, or when it gives way to a new one.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

use super::gate::Place;
use super::progress::{Clock, Close, Phase};
use super::track::{Found, Track};

/// A connection admitted by a [`LimitedListener`](super::LimitedListener): the TCP stream,
/// its place in the listener's counts (given back when it is dropped), and where its
/// requests stand. A read or write after the connection was closed by the listener fails
/// ([`io::ErrorKind::TimedOut`] for a late or slow request, [`io::ErrorKind::ConnectionAborted`]
/// for one that gave way), and the server closes it.
///
/// See the [module docs](super).
// Public only as the listener's `Io` type, unnamed by users: they see an
// `AsyncRead + AsyncWrite` stream.
pub struct LimitedStream {
    io: TcpStream,
    track: Track,
    clock: Clock,
    /// A wake-up at the deadline of a wait, made when a read first has to wait.
    sleep: Option<Pin<Box<Sleep>>>,
    /// The waker of the task reading the connection, and whether the slot and the wake-up
    /// have it (the wake-up: at its deadline, since that was last set).
    waker: Option<Waker>,
    slot_woken: bool,
    sleep_polled: bool,
    /// Why the listener closed the connection.
    closed: Option<Close>,
    place: Place,
}

impl fmt::Debug for LimitedStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitedStream")
            .field("io", &self.io)
            .field("track", &self.track)
            .field("clock", &self.clock)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl LimitedStream {
    pub(super) fn new(io: TcpStream, place: Place) -> Self {
        let clock = Clock::new(place.accepted);
        LimitedStream {
            io,
            track: Track::default(),
            clock,
            sleep: None,
            waker: None,
            slot_woken: false,
            sleep_polled: false,
            closed: None,
            place,
        }
    }

    /// The TCP stream.
    pub fn get_ref(&self) -> &TcpStream {
        &self.io
    }

    /// The error of every read and write once the listener closed the connection, counted
    /// when it first closes it.
    fn close(&mut self, why: Close) -> io::Error {
        if self.closed.is_none() {
            self.closed = Some(why);
            self.place.slot.rank(None);
            // An eviction is counted when it is decided.
            if why != Close::Evicted {
                self.place.gate.watch.closed_by(why);
            }
        }
        let (kind, what) = match why {
            Close::Head => (io::ErrorKind::TimedOut, "request head late or too slow"),
            Close::Body => (io::ErrorKind::TimedOut, "request body too slow"),
            Close::Idle => (io::ErrorKind::TimedOut, "idle past the listener's timeout"),
            Close::Evicted => (
                io::ErrorKind::ConnectionAborted,
                "closed to make room for a new connection",
            ),
        };
        io::Error::new(kind, what)
    }

    /// The listener's verdict, if it has closed the connection.
    fn verdict(&mut self) -> Option<io::Error> {
        if let Some(why) = self.closed {
            return Some(self.close(why));
        }
        self.place
            .slot
            .evicted()
            .then(|| self.close(Close::Evicted))
    }

    /// The server waits on the connection at `now` (a read is pending): its rank published
    /// for the listener and a wake-up set at its deadline, or why it is to be closed when
    /// that has passed.
    fn wait(&mut self, now: u64, cx: &mut Context<'_>) -> Option<Close> {
        let new_waker = !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if new_waker {
            self.waker = Some(cx.waker().clone());
            self.slot_woken = false;
            self.sleep_polled = false;
        }
        if let Some((at, why)) = self.clock.deadline(&self.place.gate.timing) {
            if now >= at || self.passed(at, cx) {
                return Some(why);
            }
        }
        // The waker first: a connection ranked is one the listener may evict and wake. An
        // eviction that took the waker kept before this one is seen here.
        let rank = self.clock.rank();
        if rank.is_some() && !self.slot_woken {
            self.place.slot.wake_with(cx.waker());
            self.slot_woken = true;
            if self.place.slot.evicted() {
                return Some(Close::Evicted);
            }
        }
        self.place.slot.rank(rank);
        None
    }

    /// Whether `deadline` (on the connection's clock) has passed, registering for a wake-up
    /// at it if not. The wake-up set for an earlier deadline is kept, then moved on when it
    /// fires early. It is polled once per deadline set and waker: while neither changes
    /// and it has not fired, it is registered already.
    fn passed(&mut self, deadline: u64, cx: &mut Context<'_>) -> bool {
        let gate = &self.place.gate;
        let at = gate.epoch + std::time::Duration::from_nanos(deadline);
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if self.sleep_polled && sleep.deadline() <= at && !sleep.is_elapsed() {
            return false;
        }
        loop {
            if sleep.deadline() > at {
                sleep.as_mut().reset(at);
            }
            match sleep.as_mut().poll(cx) {
                Poll::Pending => {
                    self.sleep_polled = true;
                    return false;
                }
                Poll::Ready(()) if sleep.deadline() >= at => return true,
                Poll::Ready(()) => sleep.as_mut().reset(at),
            }
        }
    }
}

impl AsyncRead for LimitedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.verdict() {
            return Poll::Ready(Err(e));
        }
        let now = this.place.gate.now();
        this.clock.reading(now);
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let new = &buf.filled()[before..];
                if this.track.read(new) == Found::Tls {
                    this.place.gate.watch.tls();
                }
                let timing = &this.place.gate.timing;
                this.clock.read(now, new.len(), this.track.phase(), timing);
                this.place.slot.rank(None);
                // Bytes that keep trickling do not push a passed deadline back.
                match this.clock.deadline(timing) {
                    Some((at, why)) if now >= at => Poll::Ready(Err(this.close(why))),
                    _ => Poll::Ready(Ok(())),
                }
            }
            Poll::Pending => match this.wait(now, cx) {
                Some(why) => Poll::Ready(Err(this.close(why))),
                None => Poll::Pending,
            },
            err => err,
        }
    }
}

impl LimitedStream {
    /// Follows `n` bytes written from `bufs`. When they end the server's turn (a response
    /// written whole), the server waits on the connection from now: a read is pending (the
    /// server reads while it answers, to see the connection close), so the task is woken
    /// when the wait's deadline passes, and the read then fails.
    fn wrote(&mut self, bufs: &[io::IoSlice<'_>], mut n: usize, cx: &mut Context<'_>) {
        if n == 0 {
            return;
        }
        let before = self.track.phase();
        for b in bufs {
            let part = &b[..n.min(b.len())];
            self.track.wrote(part);
            n -= part.len();
            if n == 0 {
                break;
            }
        }
        let phase = self.track.phase();
        if phase != before || phase == Phase::Opaque {
            let now = self.place.gate.now();
            self.clock.wrote(now, phase);
            if before == Phase::Server && self.wait(now, cx).is_some() {
                cx.waker().wake_by_ref();
            }
        }
    }
}

impl AsyncWrite for LimitedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(e) = this.verdict() {
            return Poll::Ready(Err(e));
        }
        let written = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            this.wrote(&[io::IoSlice::new(buf)], n, cx);
        }
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(e) = this.verdict() {
            return Poll::Ready(Err(e));
        }
        let written = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = written {
            this.wrote(bufs, n, cx);
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
