//! The idle timeouts of a connection's reads and writes.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// An idle timeout: it runs while the I/O it watches is pending, restarts from the
/// next wait after any progress, and is armed (and allocated) only when a wait begins.
pub(super) struct IdleTimer {
    pub(super) limit: Option<Duration>,
    sleep: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl IdleTimer {
    pub(super) fn new(limit: Option<Duration>) -> Self {
        IdleTimer {
            limit,
            sleep: None,
            armed: false,
        }
    }

    /// The watched I/O made progress: the next wait starts a new period.
    pub(super) fn progress(&mut self) {
        self.armed = false;
    }

    /// The watched I/O is pending: whether the limit is over (else `cx` is woken
    /// when it will be).
    pub(super) fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(limit) = self.limit else {
            return false;
        };
        if !self.armed {
            self.armed = true;
            let deadline = Instant::now() + limit;
            match &mut self.sleep {
                Some(sleep) => sleep.as_mut().reset(deadline),
                None => self.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        self.sleep
            .as_mut()
            .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready())
    }
}

pub(super) fn write_stalled(limit: Option<Duration>) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "the upstream took no bytes of the request for {:?} (write idle timeout)",
            limit.unwrap_or_default()
        ),
    )
}

pub(super) fn read_stalled(limit: Option<Duration>) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "the upstream sent nothing for {:?} (read idle timeout)",
            limit.unwrap_or_default()
        ),
    )
}
