//! [`LimitedStream`]: an admitted connection, holding its place in the listener's counts
//! until it closes, and closed when its first request head is late.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::gate::Place;

/// A connection admitted by a [`LimitedListener`](super::LimitedListener): the TCP stream,
/// its place in the listener's counts (given back when it is dropped), and, until its
/// first request head has arrived, that head's deadline. A read that finds the deadline
/// passed fails with [`io::ErrorKind::TimedOut`], and the server closes the connection.
///
/// See the [module docs](super).
// Public only as the listener's `Io` type, unnamed by users: they see an
// `AsyncRead + AsyncWrite` stream.
pub struct LimitedStream {
    io: TcpStream,
    head: Option<Head>,
    place: Place,
}

impl fmt::Debug for LimitedStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitedStream")
            .field("io", &self.io)
            .field("awaiting_head", &self.head.is_some())
            .finish_non_exhaustive()
    }
}

/// The first request head, still to come: its deadline, and how far the bytes read so far
/// are into the blank line that ends it.
struct Head {
    deadline: Instant,
    /// Made when a read first has to wait.
    sleep: Option<Pin<Box<Sleep>>>,
    scan: Scan,
}

/// Where the bytes stand on the way to a blank line (`\r\n\r\n`, or `\n\n` as parsers
/// accept too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scan {
    /// Nothing read yet.
    Start,
    /// Inside a line.
    Line,
    /// Just after a line feed.
    Lf,
    /// After a line feed and a carriage return.
    LfCr,
}

impl Scan {
    /// Moves over `bytes`; `true` once a blank line has been read.
    fn over(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            *self = match (b, *self) {
                (b'\n', Scan::Lf | Scan::LfCr) => return true,
                (b'\n', _) => Scan::Lf,
                (b'\r', Scan::Lf) => Scan::LfCr,
                _ => Scan::Line,
            };
        }
        false
    }
}

/// The first byte of a TLS record carrying a handshake: a TLS client's first byte.
const TLS_HANDSHAKE: u8 = 0x16;

impl LimitedStream {
    pub(super) fn new(io: TcpStream, place: Place) -> Self {
        let head = place.gate.head_timeout.map(|timeout| Head {
            deadline: Instant::now() + timeout,
            sleep: None,
            scan: Scan::Start,
        });
        LimitedStream { io, head, place }
    }

    /// The TCP stream.
    pub fn get_ref(&self) -> &TcpStream {
        &self.io
    }

    /// Whether the head's deadline has passed, registering for a wake-up at it if not.
    fn late(head: &mut Head, cx: &mut Context<'_>) -> bool {
        let deadline = head.deadline;
        let sleep = head
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        sleep.as_mut().poll(cx).is_ready()
    }

    /// What a read's new bytes say of the head: arrived (the deadline is off), a TLS
    /// client's (whose head the deadline cannot read), or still to come.
    fn scanned(&mut self, new: &[u8]) {
        let Some(head) = &mut self.head else { return };
        if head.scan == Scan::Start && new.first() == Some(&TLS_HANDSHAKE) {
            self.place.gate.watch.tls_under_head_deadline();
            self.head = None;
        } else if head.scan.over(new) {
            self.head = None;
        }
    }

    fn timed_out(&mut self) -> io::Error {
        self.head = None;
        self.place.gate.watch.head_timed_out();
        io::Error::new(
            io::ErrorKind::TimedOut,
            "no request head before the listener's deadline",
        )
    }
}

impl AsyncRead for LimitedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.head.is_some() {
                    this.scanned(&buf.filled()[before..]);
                    // Bytes that keep trickling do not push the deadline back.
                    if this
                        .head
                        .as_ref()
                        .is_some_and(|h| Instant::now() >= h.deadline)
                    {
                        return Poll::Ready(Err(this.timed_out()));
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                if this.head.as_mut().is_some_and(|head| Self::late(head, cx)) {
                    return Poll::Ready(Err(this.timed_out()));
                }
                Poll::Pending
            }
            err => err,
        }
    }
}

impl AsyncWrite for LimitedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
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

#[cfg(test)]
mod tests {
    use super::Scan;

    fn ends(chunks: &[&[u8]]) -> Option<usize> {
        let mut s = Scan::Start;
        chunks.iter().position(|c| s.over(c))
    }

    #[test]
    fn a_blank_line_ends_the_head_across_reads() {
        assert_eq!(ends(&[b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"]), Some(0));
        assert_eq!(
            ends(&[b"GET / HTTP/1.1\r\n", b"Host: a\r", b"\n\r", b"\n"]),
            Some(3)
        );
        assert_eq!(ends(&[b"GET / HTTP/1.1\n\n"]), Some(0));
        assert_eq!(
            ends(&[b"GET / HTTP/1.1\r\nHost: a\r\n", b"X: \r\r\n"]),
            None
        );
        assert_eq!(ends(&[b"G", b"E", b"T"]), None);
        // The HTTP/2 preface's first blank line counts.
        assert_eq!(ends(&[b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"]), Some(0));
    }
}
