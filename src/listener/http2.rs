//! HTTP/2 as the listener follows it, after the client's preface: frame headers both ways
//! (RFC 9113 §4.1), and from them the streams open, whose turn each is, and whether the
//! connection is idle. Payloads are skipped, never kept.

use super::progress::Phase;

/// Streams followed at once; more are not followed (a server allows 200 by default).
const MAX_STREAMS: usize = 256;

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// One HTTP/2 connection's streams, from the frames both ways.
#[derive(Debug, Default)]
pub(super) struct Http2 {
    read: Frames,
    written: Frames,
    streams: Vec<Stream>,
    /// A client's header block not yet ended (more `CONTINUATION` frames to come): its
    /// stream, and whether the block ends the stream.
    block: Option<(u32, bool)>,
}

/// A stream opened by the client and not yet closed.
#[derive(Clone, Copy, Debug)]
struct Stream {
    id: u32,
    /// The client has sent all of its request.
    sent: bool,
    /// The server has started its response.
    answering: bool,
}

/// Frames on one side: a frame header being read, then its payload skipped.
#[derive(Debug, Default)]
struct Frames {
    header: [u8; 9],
    have: u8,
    /// Payload bytes of the current frame still to come.
    left: u32,
}

/// A frame header: type, flags and stream.
#[derive(Clone, Copy, Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
}

impl Frames {
    fn frame(&self) -> Frame {
        let h = &self.header;
        Frame {
            kind: h[3],
            flags: h[4],
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        }
    }

    /// Reads `bytes` on, calling `each` for every frame: once its header is read
    /// (`at_header`) or once its payload is too.
    fn feed(&mut self, mut bytes: &[u8], at_header: bool, mut each: impl FnMut(Frame)) {
        while !bytes.is_empty() {
            if self.have < 9 {
                let n = (9 - self.have as usize).min(bytes.len());
                self.header[self.have as usize..][..n].copy_from_slice(&bytes[..n]);
                self.have += n as u8;
                bytes = &bytes[n..];
                if self.have < 9 {
                    return;
                }
                let h = &self.header;
                self.left = u32::from_be_bytes([0, h[0], h[1], h[2]]);
                if at_header {
                    each(self.frame());
                }
            }
            let n = (self.left as usize).min(bytes.len());
            self.left -= n as u32;
            bytes = &bytes[n..];
            if self.left == 0 {
                if !at_header {
                    each(self.frame());
                }
                self.have = 0;
            }
        }
    }

    /// A frame of request data (a header block, or data) half read: its type known.
    fn request_under_way(&self) -> bool {
        self.have > 3 && matches!(self.header[3], DATA | HEADERS | CONTINUATION)
    }
}

impl Http2 {
    /// Follows bytes read from the client.
    pub(super) fn read(&mut self, bytes: &[u8]) {
        let (frames, streams, block) = (&mut self.read, &mut self.streams, &mut self.block);
        frames.feed(bytes, false, |f| match f.kind {
            HEADERS => {
                let ends = f.flags & END_STREAM != 0;
                if f.flags & END_HEADERS == 0 {
                    *block = Some((f.stream, ends));
                }
                let ends = ends && block.is_none();
                if let Some(s) = streams.iter_mut().find(|s| s.id == f.stream) {
                    s.sent |= ends;
                } else if streams.len() < MAX_STREAMS {
                    streams.push(Stream {
                        id: f.stream,
                        sent: ends,
                        answering: false,
                    });
                }
            }
            CONTINUATION if f.flags & END_HEADERS != 0 => {
                if let Some((id, true)) = block.take() {
                    if let Some(s) = streams.iter_mut().find(|s| s.id == id) {
                        s.sent = true;
                    }
                }
            }
            DATA if f.flags & END_STREAM != 0 => {
                if let Some(s) = streams.iter_mut().find(|s| s.id == f.stream) {
                    s.sent = true;
                }
            }
            RST_STREAM => streams.retain(|s| s.id != f.stream),
            _ => {}
        });
    }

    /// Follows bytes the server wrote.
    pub(super) fn wrote(&mut self, bytes: &[u8]) {
        let streams = &mut self.streams;
        self.written.feed(bytes, true, |f| {
            let ends = f.flags & END_STREAM != 0;
            match f.kind {
                RST_STREAM => streams.retain(|s| s.id != f.stream),
                HEADERS | DATA if ends => streams.retain(|s| s.id != f.stream),
                HEADERS => {
                    if let Some(s) = streams.iter_mut().find(|s| s.id == f.stream) {
                        s.answering = true;
                    }
                }
                _ => {}
            }
        });
    }

    /// The server's turn while it owes a stream its response; else the client's, with a
    /// request under way (a header block, a stream it is still sending, a frame of either
    /// half read) or none (the connection idle: settings and pings are not requests).
    pub(super) fn phase(&self) -> Phase {
        if self.streams.iter().any(|s| s.sent || s.answering) {
            Phase::Server
        } else if self.block.is_some() || !self.streams.is_empty() || self.read.request_under_way()
        {
            Phase::Body
        } else {
            Phase::Waiting
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    const SETTINGS: u8 = 4;
    const PING: u8 = 6;

    #[test]
    fn settings_and_pings_leave_the_connection_idle() {
        let mut h = Http2::default();
        h.read(&frame(SETTINGS, 0, 0, &[0; 6]));
        h.wrote(&frame(SETTINGS, 0, 0, &[]));
        assert_eq!(h.phase(), Phase::Waiting);
        let ping = frame(PING, 0, 0, &[0; 8]);
        h.read(&ping[..12]);
        assert_eq!(h.phase(), Phase::Waiting, "a ping half read is no request");
        h.read(&ping[12..]);
        assert_eq!(h.phase(), Phase::Waiting);
    }

    #[test]
    fn a_request_is_the_clients_until_sent_then_the_servers_until_answered() {
        let mut h = Http2::default();
        let headers = frame(HEADERS, END_HEADERS, 1, &[0; 20]);
        h.read(&headers[..10]);
        assert_eq!(h.phase(), Phase::Body, "a header block half read");
        h.read(&headers[10..]);
        assert_eq!(h.phase(), Phase::Body, "the body still to come");
        h.read(&frame(DATA, END_STREAM, 1, b"abc"));
        assert_eq!(h.phase(), Phase::Server);
        h.wrote(&frame(HEADERS, END_HEADERS, 1, &[0; 5]));
        assert_eq!(h.phase(), Phase::Server);
        h.wrote(&frame(DATA, END_STREAM, 1, b"ok"));
        assert_eq!(h.phase(), Phase::Waiting);
    }

    #[test]
    fn a_stream_ended_in_a_header_block_is_sent_when_the_block_ends() {
        let mut h = Http2::default();
        h.read(&frame(HEADERS, END_STREAM, 3, &[0; 4]));
        assert_eq!(h.phase(), Phase::Body, "continuation to come");
        h.read(&frame(CONTINUATION, END_HEADERS, 3, &[0; 4]));
        assert_eq!(h.phase(), Phase::Server);
        h.read(&frame(RST_STREAM, 0, 3, &[0; 4]));
        assert_eq!(h.phase(), Phase::Waiting);
    }
}
