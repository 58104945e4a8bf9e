//! A connection's progress while the server waits on it, with time passed in (nanoseconds
//! since the listener was built): when it is to be closed, and its rank when the listener
//! is full (the lower, the less it has done; the lowest gives way).
//!
//! The clock follows the connection's [`Phase`]. While the server waits for a request
//! (between requests), the time runs from the end of the last response: a connection that
//! waits past the idle timeout is closed (its first request: past the head timeout from the
//! accept). A head or a body must keep up its minimum rate: each byte pays for
//! `1 / rate` of a second, and what the connection has paid for never runs past the time
//! it was read, so bytes sent early buy no time to stall later; once it lags more than the
//! rate's grace, the connection is closed. A head must also end within the head timeout of
//! its first byte (the first request's: of the accept), however fast its bytes come. Time
//! the server spends not reading (a handler that reads its body slowly) is not the
//! client's. In the server's turn nothing is timed; a connection the listener cannot read
//! is ranked by its last byte either way and never timed.

use std::time::Duration;

/// Where a connection stands, as its bytes tell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// The server waits for a request: none of its bytes yet.
    Waiting,
    /// A request head under way.
    Head,
    /// A request body under way (HTTP/2: a stream the client is still sending, or a frame
    /// half read).
    Body,
    /// The server's turn: a request read whole and not yet answered.
    Server,
    /// Bytes the listener cannot read: TLS, or a connection upgraded to another protocol.
    Opaque,
}

/// A minimum rate: the time a byte pays for, and how far the connection may lag behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rate {
    per_byte: u64,
    grace: u64,
}

impl Rate {
    /// `bytes_per_second` (0: no minimum), lagging at most `grace`.
    pub(super) fn new(bytes_per_second: u32, grace: Duration) -> Rate {
        match bytes_per_second {
            0 => Rate {
                per_byte: u64::MAX,
                grace: u64::MAX,
            },
            n => Rate {
                per_byte: 1_000_000_000 / u64::from(n),
                grace: nanos(grace),
            },
        }
    }
}

/// A duration in nanoseconds, `u64::MAX` (never) past about 584 years.
pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The listener's deadlines and rates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Timing {
    pub(super) head_timeout: u64,
    pub(super) idle_timeout: u64,
    pub(super) head_rate: Rate,
    pub(super) body_rate: Rate,
}

/// Why a connection is closed by the listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Close {
    /// Its request head was late or too slow.
    Head,
    /// Its request body was too slow.
    Body,
    /// It waited for its next request past the idle timeout.
    Idle,
    /// The listener was full and it had made the least progress.
    Evicted,
}

/// One connection's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Clock {
    phase: Phase,
    /// No byte read yet.
    first: bool,
    /// When the server began to wait for the current request: the accept, or the end of
    /// the last response.
    turn: u64,
    /// The current head's start: its first byte (the first request's: the accept).
    head_start: u64,
    /// Up to when the connection has paid for its wait, with bytes at the minimum rate (in
    /// a head or a body), or by moving a byte either way (opaque).
    paid: u64,
    /// When the last read returned bytes, until the server reads again.
    read_at: Option<u64>,
}

impl Clock {
    pub(super) fn new(accepted: u64) -> Clock {
        Clock {
            phase: Phase::Waiting,
            first: true,
            turn: accepted,
            head_start: accepted,
            paid: accepted,
            read_at: None,
        }
    }

    /// The server reads again at `now`: the time since its last read returned is not the
    /// client's.
    pub(super) fn reading(&mut self, now: u64) {
        if let Some(at) = self.read_at.take() {
            if matches!(self.phase, Phase::Head | Phase::Body) {
                self.paid = self.paid.saturating_add(now.saturating_sub(at)).min(now);
            }
        }
    }

    /// `n` bytes read at `now` (0: none, the end of the stream); the connection now at
    /// `phase`.
    pub(super) fn read(&mut self, now: u64, n: usize, phase: Phase, t: &Timing) {
        self.enter(phase, now);
        if n == 0 {
            return;
        }
        self.first = false;
        self.read_at = Some(now);
        let per_byte = match phase {
            Phase::Head => t.head_rate.per_byte,
            Phase::Body => t.body_rate.per_byte,
            Phase::Opaque => u64::MAX,
            Phase::Waiting | Phase::Server => return,
        };
        let bought = per_byte.saturating_mul(n as u64);
        self.paid = self.paid.saturating_add(bought).min(now);
    }

    /// Bytes written at `now`; the connection now at `phase`.
    pub(super) fn wrote(&mut self, now: u64, phase: Phase) {
        self.enter(phase, now);
        if phase == Phase::Opaque {
            self.paid = now;
        }
    }

    fn enter(&mut self, phase: Phase, now: u64) {
        let was = std::mem::replace(&mut self.phase, phase);
        if was == phase {
            return;
        }
        match phase {
            Phase::Waiting if was == Phase::Server => self.turn = now,
            Phase::Head => {
                self.head_start = if self.first && was == Phase::Waiting {
                    self.turn
                } else {
                    now
                };
                self.paid = now;
            }
            Phase::Body | Phase::Opaque => self.paid = now,
            Phase::Waiting | Phase::Server => {}
        }
    }

    /// When the connection is to be closed, and why, if nothing changes; `None` in the
    /// server's turn and for bytes the listener cannot read.
    pub(super) fn deadline(&self, t: &Timing) -> Option<(u64, Close)> {
        let at = |start: u64, d: u64| start.checked_add(d);
        let (deadline, why) = match self.phase {
            Phase::Waiting if self.first => (at(self.turn, t.head_timeout), Close::Head),
            Phase::Waiting => (at(self.turn, t.idle_timeout), Close::Idle),
            Phase::Head => {
                let whole = at(self.head_start, t.head_timeout);
                let rate = at(self.paid, t.head_rate.grace);
                (whole.min(rate).or(whole).or(rate), Close::Head)
            }
            Phase::Body => (at(self.paid, t.body_rate.grace), Close::Body),
            Phase::Server | Phase::Opaque => (None, Close::Head),
        };
        Some((deadline?, why))
    }

    /// Since when the connection has made no progress while the server waits on it: the
    /// lower, the sooner it gives way when the listener is full. `None` in the server's turn.
    pub(super) fn rank(&self) -> Option<u64> {
        match self.phase {
            Phase::Waiting => Some(self.turn),
            Phase::Head | Phase::Body | Phase::Opaque => Some(self.paid),
            Phase::Server => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn timing() -> Timing {
        Timing {
            head_timeout: 10 * S,
            idle_timeout: 75 * S,
            head_rate: Rate::new(250, Duration::from_secs(5)),
            body_rate: Rate::new(250, Duration::from_secs(5)),
        }
    }

    #[test]
    fn a_silent_connection_is_closed_at_the_head_timeout_from_the_accept() {
        let t = timing();
        let c = Clock::new(3 * S);
        assert_eq!(c.deadline(&t), Some((13 * S, Close::Head)));
        assert_eq!(c.rank(), Some(3 * S));
    }

    #[test]
    fn a_trickled_head_lags_its_rate_and_is_closed_after_the_grace() {
        let t = timing();
        let mut c = Clock::new(0);
        // A byte a second, from the first second: each pays for 4 ms. The server reads
        // again at once each time (and waits).
        for s in 1..=5 {
            c.read(s * S, 1, Phase::Head, &t);
            c.reading(s * S);
        }
        let paid = S + 4 * 4_000_000;
        assert_eq!(c.rank(), Some(paid));
        assert_eq!(c.deadline(&t), Some((paid + 5 * S, Close::Head)));
    }

    #[test]
    fn a_head_at_500_bytes_a_second_keeps_up_and_is_bounded_by_the_head_timeout() {
        let t = timing();
        let mut c = Clock::new(0);
        for tenth in 1..=60 {
            let now = tenth * S / 10;
            c.read(now, 50, Phase::Head, &t);
            c.reading(now);
            assert_eq!(c.rank(), Some(now), "paid up to each read");
        }
        assert_eq!(c.deadline(&t), Some((10 * S, Close::Head)));
    }

    #[test]
    fn bytes_sent_early_buy_no_time_to_stall() {
        let t = timing();
        let mut c = Clock::new(0);
        c.read(S, 4000, Phase::Head, &t);
        assert_eq!(c.rank(), Some(S));
        assert_eq!(c.deadline(&t), Some((6 * S, Close::Head)));
    }

    #[test]
    fn a_keep_alive_connection_waits_from_its_last_response() {
        let t = timing();
        let mut c = Clock::new(0);
        c.read(S, 100, Phase::Server, &t);
        c.wrote(2 * S, Phase::Waiting);
        assert_eq!(c.deadline(&t), Some((77 * S, Close::Idle)));
        assert_eq!(c.rank(), Some(2 * S));
        // Its next head is timed from its first byte.
        c.reading(50 * S);
        c.read(50 * S, 10, Phase::Head, &t);
        assert_eq!(c.deadline(&t), Some((55 * S, Close::Head)));
    }

    #[test]
    fn the_servers_time_is_not_the_clients() {
        let t = timing();
        let mut c = Clock::new(0);
        c.read(S, 100, Phase::Body, &t);
        // The handler reads its body again 20 s later: the body lags nothing.
        c.reading(21 * S);
        assert_eq!(c.rank(), Some(21 * S));
        assert_eq!(c.deadline(&t), Some((26 * S, Close::Body)));
    }

    #[test]
    fn the_servers_turn_is_untimed_and_never_ranked() {
        let t = timing();
        let mut c = Clock::new(0);
        c.read(S, 100, Phase::Server, &t);
        assert_eq!((c.deadline(&t), c.rank()), (None, None));
    }

    #[test]
    fn opaque_bytes_are_ranked_by_the_last_byte_either_way_and_untimed() {
        let t = timing();
        let mut c = Clock::new(0);
        c.read(S, 100, Phase::Opaque, &t);
        c.wrote(3 * S, Phase::Opaque);
        assert_eq!((c.deadline(&t), c.rank()), (None, Some(3 * S)));
    }

    #[test]
    fn no_minimum_rate_and_no_timeouts() {
        let t = Timing {
            head_timeout: u64::MAX,
            idle_timeout: u64::MAX,
            head_rate: Rate::new(0, Duration::from_secs(5)),
            body_rate: Rate::new(0, Duration::ZERO),
        };
        let mut c = Clock::new(S);
        assert_eq!(c.deadline(&t), None);
        c.read(2 * S, 1, Phase::Head, &t);
        assert_eq!((c.deadline(&t), c.rank()), (None, Some(2 * S)));
        c.read(3 * S, 1, Phase::Body, &t);
        assert_eq!(c.deadline(&t), None);
    }
}
