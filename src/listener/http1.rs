//! HTTP/1 framing as the listener follows it: where a connection's bytes stand in its
//! requests (the bytes read) and in the server's responses (the bytes written), from the
//! few header fields that frame a message, without keeping any of the bytes.
//!
//! Requests are read as RFC 9112 frames them: empty lines before a request line are not
//! a request (§2.2); a head ends at its first empty line; a body is chunked when the last
//! transfer coding is `chunked`, else `Content-Length` long, else empty (§6.3). Responses
//! are the server's own: no body for `1xx`, `204`, `304` and answers to `HEAD`; a `101`
//! or a `CONNECT`'s `2xx` turns the connection into a tunnel the listener does not read.
//! Malformed framing is read leniently: the server refuses such a request and closes the
//! connection, so what the listener makes of it does not last.

use super::progress::Phase;

/// Requests in flight the listener follows; one more pipelined behind the responses, and
/// it stops reading the connection ([`Phase::Opaque`]).
const MAX_PIPELINED: u64 = 64;

/// One HTTP/1 connection's framing, both ways.
#[derive(Debug, Default)]
pub(super) struct Http1 {
    request: Request,
    response: Response,
    /// Requests read whole, and final responses written whole.
    requests: u64,
    responses: u64,
    /// Bit `n % 64`: request `n` was a `HEAD`; a `CONNECT`.
    heads: u64,
    connects: u64,
    /// A request with `Expect: 100-continue` waits for the server's first bytes before it
    /// sends its body.
    awaiting_continue: bool,
    /// The bytes are no longer HTTP/1 (a tunnel, or more pipelined requests than followed).
    opaque: bool,
}

/// Where the request being read stands.
#[derive(Debug, Default)]
enum Request {
    /// No byte of it yet.
    #[default]
    Between,
    Head(Head),
    /// `Content-Length` bytes still to come.
    Length(u64),
    Chunked(Chunked),
}

/// Where the response being written stands.
#[derive(Debug)]
enum Response {
    Head(Head),
    Length(u64),
    Chunked(Chunked),
    /// A body without a length: it ends when the connection does.
    UntilClose,
}

impl Default for Response {
    fn default() -> Self {
        Response::Head(Head::default())
    }
}

impl Http1 {
    /// Follows bytes read from the client.
    pub(super) fn read(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && !self.opaque {
            match &mut self.request {
                Request::Between => self.request = Request::Head(Head::default()),
                Request::Head(head) => match head.feed(bytes, Side::Request) {
                    Some(n) => {
                        bytes = &bytes[n..];
                        let head = std::mem::take(head);
                        self.request_head(&head);
                    }
                    None => return,
                },
                Request::Length(left) => {
                    let n = (*left).min(bytes.len() as u64);
                    *left -= n;
                    bytes = &bytes[n as usize..];
                    if *left == 0 {
                        self.request_read();
                    }
                }
                Request::Chunked(chunked) => match chunked.feed(bytes) {
                    Some(n) => {
                        bytes = &bytes[n..];
                        self.request_read();
                    }
                    None => return,
                },
            }
        }
    }

    /// Follows bytes the server wrote.
    pub(super) fn wrote(&mut self, mut bytes: &[u8]) {
        if !bytes.is_empty() {
            self.awaiting_continue = false;
        }
        while !bytes.is_empty() && !self.opaque {
            match &mut self.response {
                Response::Head(head) => match head.feed(bytes, Side::Response) {
                    Some(n) => {
                        bytes = &bytes[n..];
                        let head = std::mem::take(head);
                        self.response_head(&head);
                    }
                    None => return,
                },
                Response::Length(left) => {
                    let n = (*left).min(bytes.len() as u64);
                    *left -= n;
                    bytes = &bytes[n as usize..];
                    if *left == 0 {
                        self.response_written();
                    }
                }
                Response::Chunked(chunked) => match chunked.feed(bytes) {
                    Some(n) => {
                        bytes = &bytes[n..];
                        self.response_written();
                    }
                    None => return,
                },
                Response::UntilClose => return,
            }
        }
    }

    /// Where the connection stands: the server's turn while a request read whole is not
    /// yet answered (or a request waits for its `100 Continue`), else the client's, at the
    /// request being read.
    pub(super) fn phase(&self) -> Phase {
        if self.opaque {
            Phase::Opaque
        } else if self.requests > self.responses || self.awaiting_continue {
            Phase::Server
        } else {
            match self.request {
                Request::Between => Phase::Waiting,
                Request::Head(_) => Phase::Head,
                Request::Length(_) | Request::Chunked(_) => Phase::Body,
            }
        }
    }

    fn request_head(&mut self, head: &Head) {
        let n = self.requests;
        if n - self.responses.min(n) >= MAX_PIPELINED {
            self.opaque = true;
            return;
        }
        let bit = 1 << (n % 64);
        let (heads, connects) = (self.heads & !bit, self.connects & !bit);
        self.heads = heads | if head.method == Method::Head { bit } else { 0 };
        self.connects = connects
            | if head.method == Method::Connect {
                bit
            } else {
                0
            };
        let body = if head.fields.transfer_encoding {
            head.fields
                .chunked
                .then(|| Request::Chunked(Chunked::default()))
        } else {
            head.fields.length.filter(|&n| n > 0).map(Request::Length)
        };
        match body {
            Some(body) => {
                self.awaiting_continue = head.fields.expect_continue;
                self.request = body;
            }
            None => self.request_read(),
        }
    }

    fn request_read(&mut self) {
        self.requests += 1;
        self.request = Request::Between;
    }

    fn response_head(&mut self, head: &Head) {
        let status = head.status;
        if status == 101 {
            self.opaque = true;
            return;
        }
        if (100..200).contains(&status) {
            return; // an interim response; the final one follows
        }
        let bit = 1 << (self.responses % 64);
        if self.connects & bit != 0 && (200..300).contains(&status) {
            self.opaque = true;
            return;
        }
        self.response = if self.heads & bit != 0 || status == 204 || status == 304 {
            return self.response_written();
        } else if head.fields.chunked {
            Response::Chunked(Chunked::default())
        } else {
            match head.fields.length {
                Some(0) => return self.response_written(),
                Some(n) => Response::Length(n),
                None => Response::UntilClose,
            }
        };
    }

    fn response_written(&mut self) {
        self.responses += 1;
        self.response = Response::default();
    }
}

/// Which way a head goes: the start line differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Request,
    Response,
}

/// A message head being read, line by line: its start line's first word (a request's
/// method) or status code, and the fields that frame its body.
#[derive(Debug, Default)]
struct Head {
    line: Line,
    /// Whether the current line has a byte other than CR.
    filled: bool,
    /// Whether the start line has ended (empty lines before it are skipped).
    started: bool,
    /// The start line's first word, or the current field's name: lowercased, the first
    /// [`Word::CAP`] bytes.
    word: Word,
    /// A request's method, from its start line.
    method: Method,
    status: u16,
    fields: Fields,
}

/// The methods whose responses frame differently.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Method {
    Head,
    Connect,
    #[default]
    Other,
}

/// How the current line is read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Line {
    /// The start line's first word.
    #[default]
    Start,
    /// A response's status code: the digits read so far.
    Status(u8),
    /// A field's name.
    Name,
    /// A field's value, of a field that frames the body.
    Value(Field),
    /// Nothing more to read in this line.
    Skip,
}

/// The fields the listener reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    ContentLength,
    TransferEncoding,
    Expect,
}

/// What a head's fields say of its body.
#[derive(Debug, Default)]
struct Fields {
    /// `Content-Length`, when it has one value.
    length: Option<u64>,
    /// Whether there is a `Transfer-Encoding`, and whether its last coding is `chunked`.
    transfer_encoding: bool,
    chunked: bool,
    /// `Expect: 100-continue`.
    expect_continue: bool,
    /// The value being read: digits of a length, or how much of a token matches.
    number: Option<u64>,
    matched: Match,
    /// A `Content-Length` that is not one number.
    bad_length: bool,
}

/// How much of an expected token the bytes of a value have matched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Match {
    /// None of the token yet.
    #[default]
    Empty,
    /// Its first `n` bytes.
    Part(u8),
    /// Something else.
    No,
}

impl Match {
    fn push(&mut self, token: &[u8], b: u8) {
        *self = match *self {
            Match::Empty if token.first() == Some(&b.to_ascii_lowercase()) => Match::Part(1),
            Match::Part(n) if token.get(n as usize) == Some(&b.to_ascii_lowercase()) => {
                Match::Part(n + 1)
            }
            _ => Match::No,
        };
    }

    fn is(self, token: &[u8]) -> bool {
        self == Match::Part(token.len() as u8)
    }
}

/// The first bytes of a word, lowercased.
#[derive(Clone, Copy, Debug, Default)]
struct Word {
    bytes: [u8; Word::CAP],
    len: u8,
}

impl Word {
    /// The longest name the listener looks for: `transfer-encoding`.
    const CAP: usize = 17;

    fn push(&mut self, b: u8) {
        if let Some(slot) = self.bytes.get_mut(self.len as usize) {
            *slot = b.to_ascii_lowercase();
        }
        self.len = self.len.saturating_add(1);
    }

    fn is(&self, word: &[u8]) -> bool {
        self.bytes.get(..self.len as usize) == Some(word)
    }
}

const CHUNKED: &[u8] = b"chunked";
const CONTINUE: &[u8] = b"100-continue";

impl Head {
    /// Reads `bytes` on: `Some(n)` once the head has ended, its last byte `bytes[n - 1]`.
    fn feed(&mut self, bytes: &[u8], side: Side) -> Option<usize> {
        let mut i = 0;
        while i < bytes.len() {
            match self.line {
                Line::Skip => i += memchr::memchr(b'\n', &bytes[i..])?,
                // A whole field name in these bytes: looked up at once.
                Line::Name if self.word.len == 0 => {
                    let rest = &bytes[i..];
                    let end = memchr::memchr2(b':', b'\n', rest);
                    if let Some(n) = end.filter(|&n| rest[n] == b':' && n > 0) {
                        self.filled = true;
                        self.line = self.field(&rest[..n], side);
                        i += n + 1;
                        continue;
                    }
                }
                _ => {}
            }
            let b = bytes[i];
            i += 1;
            match b {
                b'\n' => {
                    if self.end_line() {
                        return Some(i);
                    }
                }
                b'\r' => {}
                _ => {
                    self.filled = true;
                    self.byte(b, side);
                }
            }
        }
        None
    }

    /// Ends a line: `true` when it was the empty line that ends the head.
    fn end_line(&mut self) -> bool {
        if !std::mem::take(&mut self.filled) {
            return self.started;
        }
        if let Line::Value(field) = self.line {
            self.end_value(field);
        }
        self.started = true;
        self.line = Line::Name;
        self.word = Word::default();
        false
    }

    fn byte(&mut self, b: u8, side: Side) {
        match self.line {
            Line::Start if b == b' ' => {
                self.line = match side {
                    Side::Request => {
                        self.method = if self.word.is(b"head") {
                            Method::Head
                        } else if self.word.is(b"connect") {
                            Method::Connect
                        } else {
                            Method::Other
                        };
                        Line::Skip
                    }
                    Side::Response => Line::Status(0),
                }
            }
            Line::Start => self.word.push(b),
            Line::Status(n) if n < 3 && b.is_ascii_digit() => {
                self.status = self.status * 10 + u16::from(b - b'0');
                self.line = Line::Status(n + 1);
            }
            Line::Status(_) => self.line = Line::Skip,
            Line::Name if b == b':' => {
                let word = self.word;
                self.line = match word.bytes.get(..word.len as usize) {
                    Some(name) => self.field(name, side),
                    None => Line::Skip,
                };
            }
            Line::Name if (self.word.len as usize) < Word::CAP => self.word.push(b),
            Line::Name => self.line = Line::Skip,
            Line::Value(field) => self.value_byte(field, b),
            Line::Skip => {}
        }
    }

    /// How to read the value of the field `name` (as sent, or lowercased).
    fn field(&mut self, name: &[u8], side: Side) -> Line {
        self.fields.number = None;
        self.fields.matched = Match::Empty;
        if name.eq_ignore_ascii_case(b"content-length") {
            Line::Value(Field::ContentLength)
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.fields.transfer_encoding = true;
            Line::Value(Field::TransferEncoding)
        } else if side == Side::Request && name.eq_ignore_ascii_case(b"expect") {
            Line::Value(Field::Expect)
        } else {
            Line::Skip
        }
    }

    fn value_byte(&mut self, field: Field, b: u8) {
        let f = &mut self.fields;
        if b == b' ' || b == b'\t' {
            return;
        }
        match field {
            Field::ContentLength => match b {
                b'0'..=b'9' => {
                    let n = f.number.unwrap_or(0);
                    f.number = n
                        .checked_mul(10)
                        .and_then(|n| n.checked_add(u64::from(b - b'0')));
                    f.bad_length |= f.number.is_none();
                }
                b',' => Self::end_length(f),
                _ => f.bad_length = true,
            },
            Field::TransferEncoding if b == b',' => {
                if f.matched != Match::Empty {
                    f.chunked = f.matched.is(CHUNKED);
                }
                f.matched = Match::Empty;
            }
            Field::TransferEncoding => f.matched.push(CHUNKED, b),
            Field::Expect => f.matched.push(CONTINUE, b),
        }
    }

    fn end_value(&mut self, field: Field) {
        let f = &mut self.fields;
        match field {
            Field::ContentLength => Self::end_length(f),
            Field::TransferEncoding => {
                if f.matched != Match::Empty {
                    f.chunked = f.matched.is(CHUNKED);
                }
            }
            Field::Expect => f.expect_continue |= f.matched.is(CONTINUE),
        }
    }

    /// One element of a `Content-Length` list: every element must be the same number.
    fn end_length(f: &mut Fields) {
        if let Some(n) = f.number.take() {
            if f.length.is_some_and(|l| l != n) {
                f.bad_length = true;
            }
            f.length = Some(n);
        }
        if f.bad_length {
            f.length = None;
        }
    }
}

/// Where a chunked body stands (RFC 9112 §7.1).
#[derive(Debug)]
enum Chunked {
    /// A chunk's size, in hex digits.
    Size(u64),
    /// A chunk's extensions, to the end of the size line.
    Extension(u64),
    /// A chunk's data still to come.
    Data(u64),
    /// The line end after a chunk's data.
    DataEnd,
    /// Trailer lines after the last chunk; whether the current one has a byte.
    Trailers(bool),
}

impl Default for Chunked {
    fn default() -> Self {
        Chunked::Size(0)
    }
}

impl Chunked {
    /// Reads `bytes` on: `Some(n)` once the body has ended, its last byte `bytes[n - 1]`.
    fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut i = 0;
        while i < bytes.len() {
            if let Chunked::Data(left) = self {
                let n = (*left).min((bytes.len() - i) as u64);
                *left -= n;
                i += n as usize;
                if *left == 0 {
                    *self = Chunked::DataEnd;
                }
                continue;
            }
            if let Chunked::Extension(_) = self {
                i += memchr::memchr(b'\n', &bytes[i..])?;
            }
            let b = bytes[i];
            i += 1;
            *self = match (std::mem::take(self), b) {
                (Chunked::Size(size) | Chunked::Extension(size), b'\n') if size == 0 => {
                    Chunked::Trailers(false)
                }
                (Chunked::Size(size) | Chunked::Extension(size), b'\n') => Chunked::Data(size),
                (Chunked::Size(size), _) => match (b as char).to_digit(16) {
                    Some(d) => Chunked::Size(size.saturating_mul(16).saturating_add(d.into())),
                    None if b == b'\r' => Chunked::Size(size),
                    None => Chunked::Extension(size),
                },
                (Chunked::DataEnd, b'\n') => Chunked::Size(0),
                (Chunked::DataEnd, _) => Chunked::DataEnd,
                (Chunked::Trailers(filled), b'\n') if !filled => return Some(i),
                (Chunked::Trailers(_), b'\n') => Chunked::Trailers(false),
                (Chunked::Trailers(filled), b'\r') => Chunked::Trailers(filled),
                (Chunked::Trailers(_), _) => Chunked::Trailers(true),
                (state, _) => state,
            };
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The phase after each chunk is read (`r`) or written (`w`).
    fn phases(steps: &[(char, &[u8])]) -> Vec<Phase> {
        let mut h = Http1::default();
        steps
            .iter()
            .map(|&(dir, bytes)| {
                if dir == 'r' {
                    h.read(bytes);
                } else {
                    h.wrote(bytes);
                }
                h.phase()
            })
            .collect()
    }

    use Phase::{Body, Head as H, Opaque, Server, Waiting};

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    #[test]
    fn a_request_then_its_response_then_waiting() {
        assert_eq!(
            phases(&[
                ('r', b"GET / HTTP/1.1\r\nHost: a\r\n"),
                ('r', b"\r\n"),
                ('w', b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"),
                ('w', b"ok"),
            ]),
            [H, Server, Server, Waiting]
        );
    }

    /// Regression: leading empty lines were taken for a whole head, which switched the
    /// head deadline off.
    #[test]
    fn empty_lines_before_a_request_line_are_not_a_head() {
        assert_eq!(phases(&[('r', b"\r\n\r\n")]), [H]);
        assert_eq!(phases(&[('r', b"\n\n\n\n\r\n")]), [H]);
        assert_eq!(
            phases(&[('r', b"\r\n\r\nGET / HTTP/1.1\r\n"), ('r', b"\r\n")]),
            [H, Server]
        );
    }

    #[test]
    fn bare_line_feeds_end_a_head() {
        assert_eq!(phases(&[('r', b"GET / HTTP/1.1\nHost: a\n\n")]), [Server]);
        assert_eq!(
            phases(&[
                ('r', b"GET / HTTP/1.1\r\nHost: a\r"),
                ('r', b"\n\r"),
                ('r', b"\n")
            ]),
            [H, H, Server]
        );
    }

    #[test]
    fn a_content_length_body_is_the_clients_turn_until_read_whole() {
        assert_eq!(
            phases(&[
                ('r', b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab"),
                ('r', b"cd"),
                ('r', b"e"),
                ('w', OK),
            ]),
            [Body, Body, Server, Waiting]
        );
        // A list of one value repeated is that value; a field name's case does not matter.
        assert_eq!(
            phases(&[('r', b"POST / HTTP/1.1\r\ncontent-LENGTH: 3 , 3\r\n\r\nabc")]),
            [Server]
        );
        // Conflicting lengths: no body the listener waits for (the server refuses it).
        assert_eq!(
            phases(&[('r', b"POST / HTTP/1.1\r\ncontent-length: 3, 4\r\n\r\n")]),
            [Server]
        );
    }

    #[test]
    fn a_chunked_body_ends_at_its_last_chunk_and_trailers() {
        let mut h = Http1::default();
        h.read(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
        assert_eq!(h.phase(), Body);
        for part in [
            &b"5;ext=1\r\nhel"[..],
            b"lo\r\n",
            b"A\r\n0123456789\r\n0\r\n",
            b"x: y\r\n",
        ] {
            h.read(part);
            assert_eq!(h.phase(), Body);
        }
        h.read(b"\r\n");
        assert_eq!(h.phase(), Server);
        // A coding after `chunked` makes it not the last: no chunked body.
        assert_eq!(
            phases(&[(
                'r',
                b"POST / HTTP/1.1\r\ntransfer-encoding: chunked, gzip\r\n\r\n"
            )]),
            [Server]
        );
    }

    #[test]
    fn expect_continue_waits_on_the_server_until_it_writes() {
        assert_eq!(
            phases(&[
                (
                    'r',
                    b"PUT / HTTP/1.1\r\nExpect: 100-continue\r\ncontent-length: 2\r\n\r\n"
                ),
                ('w', b"HTTP/1.1 100 Continue\r\n\r\n"),
                ('r', b"hi"),
                ('w', OK),
            ]),
            [Server, Body, Server, Waiting]
        );
    }

    #[test]
    fn responses_without_a_body() {
        assert_eq!(
            phases(&[
                ('r', b"HEAD / HTTP/1.1\r\n\r\n"),
                ('w', b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n"),
                ('r', b"GET / HTTP/1.1\r\n\r\n"),
                (
                    'w',
                    b"HTTP/1.1 304 Not Modified\r\ncontent-length: 10\r\n\r\n"
                ),
                ('r', b"GET / HTTP/1.1\r\n\r\n"),
                (
                    'w',
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n"
                ),
                ('w', b"0\r\n\r\n"),
            ]),
            [Server, Waiting, Server, Waiting, Server, Server, Waiting]
        );
    }

    #[test]
    fn pipelined_requests_are_answered_in_turn() {
        assert_eq!(
            phases(&[
                (
                    'r',
                    b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\nGET /c HT"
                ),
                ('w', OK),
                ('w', OK),
                ('r', b"TP/1.1\r\n\r\n"),
                ('w', OK),
            ]),
            [Server, Server, H, Server, Waiting]
        );
    }

    #[test]
    fn upgrades_and_tunnels_are_not_read() {
        assert_eq!(
            phases(&[
                ('r', b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n"),
                ('w', b"HTTP/1.1 101 Switching Protocols\r\n\r\n"),
            ]),
            [Server, Opaque]
        );
        assert_eq!(
            phases(&[
                ('r', b"CONNECT a:443 HTTP/1.1\r\n\r\n"),
                ('w', b"HTTP/1.1 200 OK\r\n\r\n"),
            ]),
            [Server, Opaque]
        );
        // A refused CONNECT is a response like any other.
        assert_eq!(
            phases(&[
                ('r', b"CONNECT a:443 HTTP/1.1\r\n\r\n"),
                (
                    'w',
                    b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n"
                ),
            ]),
            [Server, Waiting]
        );
    }

    #[test]
    fn a_body_without_length_lasts_until_the_connection_closes() {
        assert_eq!(
            phases(&[
                ('r', b"GET / HTTP/1.0\r\n\r\n"),
                ('w', b"HTTP/1.0 200 OK\r\n\r\nabc")
            ]),
            [Server, Server]
        );
    }

    #[test]
    fn too_many_pipelined_requests_are_not_followed() {
        let mut h = Http1::default();
        h.read(&b"GET / HTTP/1.1\r\n\r\n".repeat(64));
        assert_eq!(h.phase(), Server);
        h.read(b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(h.phase(), Opaque);
    }

    #[test]
    fn long_and_odd_field_names_are_skipped() {
        assert_eq!(
            phases(&[(
                'r',
                b"POST / HTTP/1.1\r\nx-content-length: 5\r\ncontent-length-x: 5\r\ncontent-lengthx: 5\r\n\r\n"
            )]),
            [Server]
        );
    }
}
