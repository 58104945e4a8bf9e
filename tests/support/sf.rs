//! An independent parser of RFC 9651 structured-field lists (section 4.2, "Parsing
//! Structured Fields"), written from the RFC, not from the crate: what a client reads in
//! `RateLimit-Policy` and `RateLimit`. Lists of items and inner lists, with parameters;
//! bare items of every type but display strings. Anything the RFC says to fail on fails.
#![allow(dead_code, unreachable_pub)]

/// A bare item.
#[derive(Clone, Debug, PartialEq)]
pub enum Bare {
    Integer(i64),
    /// Thousandths (a decimal has at most three fraction digits).
    Decimal(i64),
    String(String),
    Token(String),
    Bytes(Vec<u8>),
    Boolean(bool),
    Date(i64),
}

impl Bare {
    pub fn int(&self) -> Option<i64> {
        match self {
            Bare::Integer(n) => Some(*n),
            _ => None,
        }
    }

    pub fn str(&self) -> Option<&str> {
        match self {
            Bare::String(s) => Some(s),
            _ => None,
        }
    }
}

/// An item (or an inner list's items) and its parameters, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    pub item: Option<Bare>,
    pub inner: Vec<Member>,
    pub params: Vec<(String, Bare)>,
}

impl Member {
    /// The value of parameter `key`, if present (the last one wins, as RFC 9651 says
    /// for duplicate keys).
    pub fn param(&self, key: &str) -> Option<&Bare> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }
}

/// Parses the field values of one field name (several lines are combined with ", ",
/// RFC 9651 section 4.2) as a list.
pub fn parse_list_lines<'a>(
    lines: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<Member>, String> {
    let joined = lines.into_iter().collect::<Vec<_>>().join(", ");
    parse_list(&joined)
}

/// Parses one field value as a list.
pub fn parse_list(input: &str) -> Result<Vec<Member>, String> {
    if !input.is_ascii() {
        return Err("not ASCII".into());
    }
    let mut p = Parser {
        s: input.as_bytes(),
        i: 0,
    };
    p.skip_sp();
    let mut members = Vec::new();
    while p.i < p.s.len() {
        members.push(p.member()?);
        p.skip_ows();
        if p.i == p.s.len() {
            return Ok(members);
        }
        if p.peek() != Some(b',') {
            return Err(format!("expected ',' at {} in {input:?}", p.i));
        }
        p.i += 1;
        p.skip_ows();
        if p.i == p.s.len() {
            return Err("trailing comma".into());
        }
    }
    Ok(members)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip_sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.i += 1;
        }
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }

    fn member(&mut self) -> Result<Member, String> {
        if self.peek() == Some(b'(') {
            self.i += 1;
            let mut inner = Vec::new();
            loop {
                self.skip_sp();
                if self.peek() == Some(b')') {
                    self.i += 1;
                    break;
                }
                let item = self.bare()?;
                let params = self.params()?;
                inner.push(Member {
                    item: Some(item),
                    inner: Vec::new(),
                    params,
                });
                if !matches!(self.peek(), Some(b' ' | b')')) {
                    return Err("bad inner list".into());
                }
            }
            let params = self.params()?;
            return Ok(Member {
                item: None,
                inner,
                params,
            });
        }
        let item = self.bare()?;
        let params = self.params()?;
        Ok(Member {
            item: Some(item),
            inner: Vec::new(),
            params,
        })
    }

    fn params(&mut self) -> Result<Vec<(String, Bare)>, String> {
        let mut params = Vec::new();
        while self.peek() == Some(b';') {
            self.i += 1;
            self.skip_sp();
            let key = self.key()?;
            let value = if self.peek() == Some(b'=') {
                self.i += 1;
                self.bare()?
            } else {
                Bare::Boolean(true)
            };
            params.push((key, value));
        }
        Ok(params)
    }

    fn key(&mut self) -> Result<String, String> {
        let start = self.i;
        match self.peek() {
            Some(b'a'..=b'z' | b'*') => self.i += 1,
            _ => return Err(format!("bad key at {start}")),
        }
        while matches!(
            self.peek(),
            Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*')
        ) {
            self.i += 1;
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    fn bare(&mut self) -> Result<Bare, String> {
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'"') => self.string(),
            Some(b':') => self.bytes(),
            Some(b'?') => self.boolean(),
            Some(b'@') => {
                self.i += 1;
                match self.number()? {
                    Bare::Integer(n) => Ok(Bare::Date(n)),
                    _ => Err("a date is an integer".into()),
                }
            }
            Some(b'A'..=b'Z' | b'a'..=b'z' | b'*') => Ok(self.token()),
            other => Err(format!(
                "bad bare item {:?} at {}",
                other.map(char::from),
                self.i
            )),
        }
    }

    /// RFC 9651 4.2.4: integers of at most 15 digits, decimals of at most 12 integer and
    /// 3 fraction digits.
    fn number(&mut self) -> Result<Bare, String> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.i += 1;
        }
        let start = self.i;
        let mut dot = None;
        while let Some(c) = self.peek() {
            match c {
                b'0'..=b'9' => {}
                b'.' if dot.is_none() => {
                    if self.i - start > 12 {
                        return Err("a decimal's integer part is longer than 12 digits".into());
                    }
                    dot = Some(self.i);
                }
                _ => break,
            }
            self.i += 1;
            let len = self.i - start;
            if dot.is_none() && len > 15 {
                return Err("an integer longer than 15 digits".into());
            }
            if dot.is_some() && len > 16 {
                return Err("a decimal longer than 16 characters".into());
            }
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).unwrap();
        if text.is_empty() || !text.as_bytes()[0].is_ascii_digit() {
            return Err("a number without digits".into());
        }
        let sign = if negative { -1 } else { 1 };
        match dot {
            None => Ok(Bare::Integer(
                sign * text.parse::<i64>().map_err(|e| e.to_string())?,
            )),
            Some(d) => {
                let frac = &text[d - start + 1..];
                if frac.is_empty() || frac.len() > 3 {
                    return Err("a decimal needs 1 to 3 fraction digits".into());
                }
                let int: i64 = text[..d - start]
                    .parse()
                    .map_err(|e: std::num::ParseIntError| e.to_string())?;
                let f: i64 = format!("{frac:0<3}").parse().unwrap();
                Ok(Bare::Decimal(sign * (int * 1000 + f)))
            }
        }
    }

    fn string(&mut self) -> Result<Bare, String> {
        self.i += 1;
        let mut out = String::new();
        loop {
            match self.peek() {
                None => return Err("an unterminated string".into()),
                Some(b'\\') => {
                    self.i += 1;
                    match self.peek() {
                        Some(c @ (b'"' | b'\\')) => out.push(char::from(c)),
                        _ => return Err("a bad escape in a string".into()),
                    }
                }
                Some(b'"') => {
                    self.i += 1;
                    return Ok(Bare::String(out));
                }
                Some(c @ 0x20..=0x7e) => out.push(char::from(c)),
                Some(_) => return Err("a control character in a string".into()),
            }
            self.i += 1;
        }
    }

    fn token(&mut self) -> Bare {
        let start = self.i;
        self.i += 1;
        while let Some(c) = self.peek() {
            let tchar = c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c);
            if !tchar {
                break;
            }
            self.i += 1;
        }
        Bare::Token(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    fn bytes(&mut self) -> Result<Bare, String> {
        self.i += 1;
        let start = self.i;
        while let Some(c) = self.peek() {
            if c == b':' {
                let text = &self.s[start..self.i];
                self.i += 1;
                return base64(text).map(Bare::Bytes);
            }
            if !(c.is_ascii_alphanumeric() || c == b'+' || c == b'/' || c == b'=') {
                return Err("a bad byte sequence".into());
            }
            self.i += 1;
        }
        Err("an unterminated byte sequence".into())
    }

    fn boolean(&mut self) -> Result<Bare, String> {
        self.i += 1;
        let b = match self.peek() {
            Some(b'1') => true,
            Some(b'0') => false,
            _ => return Err("a bad boolean".into()),
        };
        self.i += 1;
        Ok(Bare::Boolean(b))
    }
}

fn base64(text: &[u8]) -> Result<Vec<u8>, String> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let trimmed: Vec<u8> = text.iter().copied().take_while(|&c| c != b'=').collect();
    let mut out = Vec::new();
    for chunk in trimmed.chunks(4) {
        let mut n = 0u32;
        for (k, &c) in chunk.iter().enumerate() {
            n |= value(c).ok_or("bad base64")? << (18 - 6 * k);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Ok(out)
}
