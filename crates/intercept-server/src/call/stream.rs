//! A streamed call, in stages: open the upstream (answering early and keeping the
//! harness's connection alive through a slow first byte), check the answer's head, relay
//! the event stream ([`StreamRelay`]), finish (assemble, or keep what arrived of a call
//! cut short; the response hook), record, and send the tail: the withheld terminal
//! event, a rewritten stream, the spooled stream, or an error event.

use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use crate::redact::Redactor;
use bytes::{Bytes, BytesMut};
use http::Response;
use intercept_core::internal::Heartbeat;
use intercept_core::internal::TokenCollector;
use intercept_core::internal::{Assembled, Relay, StreamAssembler};
use intercept_core::internal::{SseEvent, SseSplitter};
use intercept_core::{Error, RawJson};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Sleep};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{
    ms_since, stopped_by_hook, too_large, Call, Failed, HookOutcome, Outcome, Reply, KEEPALIVE,
    READY_BATCH_LIMIT,
};
use crate::config::{ServerConfig, StreamHeartbeat};
use crate::detach::{event_stream, ResponseBody};
use crate::relay::{send_or_cancel, Sent};
use crate::spool::Spool;
use crate::upstream::{Read, UpstreamBody};

impl Call {
    /// Runs a streamed call, stage by stage.
    pub(super) async fn run_stream(mut self, reply: Reply) {
        let capture = self.capture.take();
        let claim = self.claim.take();
        let (tx, rx) = mpsc::channel::<Bytes>(self.shared.config.stream_buffer.max(1));
        let mut head = Head::Pending(reply, rx);
        let mut heartbeat = Heartbeat::new(self.dialect.kind(), self.entry.session.model());
        let checked = match self.open_stream(&mut head, &tx, &mut heartbeat).await {
            Ok(resp) => self.check_stream_head(resp).await,
            Err(e) => Err(Failed::new(&self, e)),
        };
        let body = match checked {
            Ok(body) => body,
            Err(failed) => return self.fail_stream(head, &tx, failed).await,
        };
        let client_gone = head.send(&self.entry.cancel);
        let config = &self.shared.config;
        let gone = tokio::time::sleep(config.disconnect_grace);
        let keepalive = tokio::time::sleep(config.keepalive);
        tokio::pin!(gone, keepalive);
        let timers = Timers::new(config, gone.as_mut(), keepalive.as_mut(), client_gone);
        let mut relay = StreamRelay::new(&self, tx, body, capture, client_gone, timers, heartbeat);
        relay.run().await;
        let (outcome, ending) = self.finish_stream(&mut relay).await;
        // An idempotency key keeps the response served, for the key's later calls.
        if let Some(claim) = claim {
            let served = match (&ending, &outcome.response) {
                (Ending::Complete, Some(response)) if outcome.error.is_none() => {
                    Some(response.bytes().clone())
                }
                (Ending::Rewritten(v), _) => serde_json::to_vec(v).ok().map(Bytes::from),
                _ => None,
            };
            if let Some(served) = served {
                claim.served(crate::retry::Answer::Stream(served));
            }
        }
        self.room_to_record().await;
        self.record(outcome);
        relay.send_tail(ending).await;
    }

    /// Opens the upstream stream. Past `first_byte_timeout` without an answer, the
    /// harness gets its 200 head at once and then heartbeats (tunnels cut requests that
    /// get no response headers).
    async fn open_stream(
        &self,
        head: &mut Head,
        tx: &mpsc::Sender<Bytes>,
        heartbeat: &mut Heartbeat,
    ) -> Result<Response<UpstreamBody>, Error> {
        let cancel = &self.entry.cancel;
        let config = &self.shared.config;
        let early_at = tokio::time::Instant::now() + config.first_byte_timeout;
        let mut next_keepalive: Option<tokio::time::Instant> = None;
        let open = self.open();
        tokio::pin!(open);
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(self.cancellation()),
                r = &mut open => return r.map(|(resp, _)| resp),
                _ = sleep_until(early_at), if head.is_pending() => {
                    head.send(cancel);
                    debug!("slow first byte: stream answered early, keeping it alive");
                    next_keepalive = Some(tokio::time::Instant::now());
                }
                _ = sleep_until(next_keepalive.unwrap_or(early_at)), if next_keepalive.is_some() => {
                    if let Some(piece) = heartbeat_piece(config.stream_heartbeat, heartbeat) {
                        match send_or_cancel(tx, piece, cancel).await {
                            Sent::Queued => {}
                            Sent::Gone => *head = Head::Sent { client_gone: true },
                            Sent::Cancelled => return Err(self.cancellation()),
                        }
                    }
                    next_keepalive = Some(tokio::time::Instant::now() + config.keepalive);
                }
            }
        }
    }

    /// The upstream's answer to a streaming request, checked: the body of a 2xx event
    /// stream, or the failure.
    async fn check_stream_head(
        &self,
        resp: Response<UpstreamBody>,
    ) -> Result<UpstreamBody, Failed> {
        if !resp.status().is_success() {
            return Err(self.upstream_failure(resp).await);
        }
        let content_type = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("no content type")
            .to_ascii_lowercase();
        if !content_type.starts_with("text/event-stream") {
            let e = self.redactor().error(Error::UpstreamMalformed(format!(
                "the upstream answered a streaming request with `{content_type}` instead of an event stream"
            )));
            return Err(Failed::new(self, e));
        }
        Ok(resp.into_body())
    }

    /// Ends a stream that failed before relaying began: an HTTP error when the response
    /// head is not sent yet, else a dialect-shaped SSE error event.
    async fn fail_stream(&self, head: Head, tx: &mpsc::Sender<Bytes>, failed: Failed) {
        match head {
            Head::Pending(reply, _) => {
                let client_gone = reply.is_closed();
                let (mut outcome, response) = self.failure_answer(failed);
                outcome.client_disconnected = client_gone;
                self.room_to_record().await;
                self.record(outcome);
                let _ = reply.send(response, &self.entry.cancel);
            }
            Head::Sent { client_gone } => {
                let mut outcome = Outcome::failed(&failed.recorded);
                outcome.status = 200;
                outcome.client_disconnected = client_gone;
                self.room_to_record().await;
                self.record(outcome);
                let event = self.dialect.error_event(&failed.answered);
                send_or_cancel(tx, event, &self.entry.cancel).await;
            }
        }
    }

    /// The stream's end, for the record: the assembled response, passed through the
    /// response hook (when the session inspects responses), which may rewrite it or
    /// stop the rollout; or the failure, with what arrived of the response. Also how
    /// the stream ends for the harness.
    async fn finish_stream(&self, relay: &mut StreamRelay<'_, '_>) -> (Outcome, Ending) {
        let (assembled, partial) = relay.end();
        let mut ending = Ending::Complete;
        let assembled = match assembled {
            Ok(a) if relay.spool.is_some() => {
                match self.response_hook(&a.response.to_value()).await {
                    Ok(HookOutcome::Unchanged) => Ok(a),
                    Ok(HookOutcome::Rewritten(v)) => {
                        ending = Ending::Rewritten(v);
                        Ok(a)
                    }
                    Ok(HookOutcome::Stop(reason)) => {
                        ending = Ending::Stopped(reason);
                        Ok(a)
                    }
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        let mut outcome = match assembled {
            Ok(a) => Outcome {
                status: 200,
                response: Some(a.response),
                summary: a.summary,
                ttfb_ms: None,
                client_disconnected: false,
                error: None,
                tokens: None,
                truncated: false,
            },
            Err(e) => {
                let mut o = Outcome::failed(&e);
                o.status = 200;
                o.response = partial;
                o.truncated = relay.intake.truncated;
                ending = Ending::Failed(e);
                o
            }
        };
        outcome.ttfb_ms = relay.intake.ttfb;
        outcome.client_disconnected = relay.client_gone;
        outcome.tokens = relay.capture.take().map(TokenCollector::finish);
        (outcome, ending)
    }
}

/// What goes to the harness while the upstream is silent: the dialect's heartbeat event
/// where one is valid (`event`), else a keepalive comment line; nothing with `off`.
fn heartbeat_piece(mode: StreamHeartbeat, heartbeat: &mut Heartbeat) -> Option<Bytes> {
    match mode {
        StreamHeartbeat::Off => None,
        StreamHeartbeat::Comment => Some(Bytes::from_static(KEEPALIVE)),
        _ => Some(
            heartbeat
                .beat()
                .unwrap_or_else(|| Bytes::from_static(KEEPALIVE)),
        ),
    }
}

/// An event the harness gets, through the heartbeat's state (which may renumber it);
/// unchanged unless heartbeats are events.
#[inline]
fn heartbeat_relay(mode: StreamHeartbeat, heartbeat: &mut Heartbeat, ev: Bytes) -> Bytes {
    if mode == StreamHeartbeat::Event {
        heartbeat.relay(ev)
    } else {
        ev
    }
}

/// Whether the response head of a stream went out.
enum Head {
    /// Not yet: the harness's reply and the receiving end of the stream's body.
    Pending(Reply, mpsc::Receiver<Bytes>),
    Sent {
        client_gone: bool,
    },
}

impl Head {
    fn is_pending(&self) -> bool {
        matches!(self, Head::Pending(..))
    }

    /// Sends the event-stream head, if it is still pending; whether the harness is gone.
    /// `cancel` is what cancels the call.
    fn send(&mut self, cancel: &tokio_util::sync::CancellationToken) -> bool {
        let client_gone = match std::mem::replace(self, Head::Sent { client_gone: true }) {
            Head::Pending(reply, rx) => reply.send(sse_head(rx), cancel).is_err(),
            Head::Sent { client_gone } => client_gone,
        };
        *self = Head::Sent { client_gone };
        client_gone
    }
}

/// The head of a relayed event stream.
fn sse_head(rx: mpsc::Receiver<Bytes>) -> Response<ResponseBody> {
    event_stream(ResponseBody::channel(rx))
}

/// The relay's clocks: keepalive comments through upstream silence, and the grace the
/// upstream has once the harness is gone.
struct Timers<'t> {
    every: Duration,
    grace: Duration,
    /// When something last went to the harness. The keepalive timer is reset lazily:
    /// sending only notes the time, and the timer, when it fires, re-arms itself if
    /// something went out meanwhile.
    last_sent: tokio::time::Instant,
    keepalive: Pin<&'t mut Sleep>,
    /// Armed once the harness is gone: how long the upstream may still take.
    gone: Pin<&'t mut Sleep>,
}

impl<'t> Timers<'t> {
    fn new(
        config: &ServerConfig,
        gone: Pin<&'t mut Sleep>,
        keepalive: Pin<&'t mut Sleep>,
        client_gone: bool,
    ) -> Self {
        let mut timers = Timers {
            every: config.keepalive,
            grace: config.disconnect_grace,
            last_sent: tokio::time::Instant::now(),
            keepalive,
            gone,
        };
        if client_gone {
            timers.arm_gone();
        }
        timers
    }

    fn arm_gone(&mut self) {
        self.gone
            .as_mut()
            .reset(tokio::time::Instant::now() + self.grace);
    }
}

/// The relay of one event stream, from the upstream's body to the harness. Events are
/// split out of the body, redacted, stripped of captured tokens and sorted by the
/// dialect's assembler: forwarded in batches, withheld (the terminal event, until the
/// call is recorded) or dropped; with a response hook, every event waits in the spool.
/// Every send races the call's cancellation.
struct StreamRelay<'c, 't> {
    call: &'c Call,
    cancel: &'c CancellationToken,
    tx: mpsc::Sender<Bytes>,
    body: UpstreamBody,
    intake: Intake,
    /// Taken when the stream is assembled ([`StreamRelay::end`]).
    assembler: Option<Box<dyn StreamAssembler>>,
    redactor: Redactor,
    capture: Option<TokenCollector>,
    /// Forwarded events of one burst, sent to the harness as one piece.
    batch: BytesMut,
    /// The terminal event and what follows it, sent once the call is recorded.
    withheld: Vec<Bytes>,
    /// With a session that inspects responses, every event waits here until the
    /// response hook has run (until the stream's end is sent).
    spool: Option<Spool>,
    timers: Timers<'t>,
    /// What goes out while the upstream is silent, and the state it is made from (fed
    /// every event the harness gets, with `stream_heartbeat = event`).
    mode: StreamHeartbeat,
    heartbeat: Heartbeat,
    client_gone: bool,
    failure: Option<Error>,
}

/// What the relay takes in: the upstream's bytes, split into events, and counted.
struct Intake {
    splitter: SseSplitter,
    /// Events split out of the burst being relayed.
    events: Vec<Bytes>,
    /// Every byte of the stream counts against `max_response_bytes` (`limit`): the
    /// events and the assembled record grow with it, and so would an endless line.
    received: u64,
    limit: u64,
    truncated: bool,
    /// When the call started, for the time to first byte.
    started: std::time::SystemTime,
    ttfb: Option<f64>,
    /// The upstream's body ended.
    done: bool,
}

impl Intake {
    /// Takes one read of the body; whether the burst may take more. The stream's first
    /// bytes go out at once (time to first byte); past `max_response_bytes` the stream
    /// is cut off. A broken body or a cut-off stream is the relay's `failure`.
    #[inline]
    fn take(&mut self, read: Read, failure: &mut Option<Error>) -> bool {
        let data = match read {
            Read::Data(data) => data,
            Read::Other => return true,
            Read::End => {
                self.done = true;
                self.events.extend(self.splitter.finish());
                return false;
            }
            Read::Broken(e) => {
                *failure = Some(Error::UpstreamUnavailable(format!(
                    "the upstream stream broke: {e}"
                )));
                return false;
            }
        };
        let first = self.ttfb.is_none();
        if first {
            self.ttfb = Some(ms_since(self.started, Instant::now()));
        }
        self.received += data.len() as u64;
        if self.received > self.limit {
            self.truncated = true;
            *failure = Some(too_large(self.limit, self.received, None));
            return false;
        }
        self.splitter.push_bytes(data);
        while let Some(ev) = self.splitter.next_event() {
            self.events.push(ev);
        }
        !first
    }
}

impl<'c, 't> StreamRelay<'c, 't> {
    fn new(
        call: &'c Call,
        tx: mpsc::Sender<Bytes>,
        body: UpstreamBody,
        capture: Option<TokenCollector>,
        client_gone: bool,
        timers: Timers<'t>,
        heartbeat: Heartbeat,
    ) -> Self {
        let config = &call.shared.config;
        let inspect = call.entry.session.inspects_responses();
        StreamRelay {
            call,
            cancel: &call.entry.cancel,
            tx,
            body,
            intake: Intake {
                splitter: SseSplitter::new(),
                events: Vec::new(),
                received: 0,
                limit: config.max_response_bytes,
                truncated: false,
                started: call.started,
                ttfb: None,
                done: false,
            },
            assembler: Some(call.dialect.assembler(&call.prepared)),
            redactor: call.redactor(),
            capture,
            batch: BytesMut::new(),
            withheld: Vec::new(),
            spool: inspect.then(|| Spool::new(config.inspect_memory)),
            timers,
            mode: config.stream_heartbeat,
            heartbeat,
            client_gone,
            failure: None,
        }
    }

    /// Relays until the upstream ends or fails, or the call is cut short.
    async fn run(&mut self) {
        while let Some(read) = self.next_read().await {
            self.take_burst(read).await;
            self.forward_events().await;
            self.flush().await;
            if self.failure.is_some() || self.intake.done {
                break;
            }
        }
    }

    /// The upstream's next read; keepalive comments go out while it is silent. `None`:
    /// the relay stops (the call was cancelled, or the harness is gone and the upstream
    /// did not finish within the grace).
    async fn next_read(&mut self) -> Option<Read> {
        loop {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => {
                    self.failure = Some(self.call.cancellation());
                    return None;
                }
                _ = &mut self.timers.gone, if self.client_gone => {
                    self.failure = Some(Error::ClientDisconnected(format!(
                        "the harness disconnected and the upstream did not finish within {} s",
                        self.timers.grace.as_secs_f64()
                    )));
                    return None;
                }
                _ = &mut self.timers.keepalive, if !self.client_gone => {
                    if !self.keepalive().await {
                        return None;
                    }
                }
                read = self.body.read() => return Some(read),
            }
        }
    }

    /// The keepalive timer fired: a heartbeat goes out if nothing did for a keepalive
    /// period, else the timer waits until then. `false`: the call was cancelled.
    async fn keepalive(&mut self) -> bool {
        let due = self.timers.last_sent + self.timers.every;
        if tokio::time::Instant::now() < due {
            self.timers.keepalive.as_mut().reset(due);
            return true;
        }
        match heartbeat_piece(self.mode, &mut self.heartbeat) {
            Some(piece) => self.send(piece).await,
            None => self.timers.last_sent = tokio::time::Instant::now(),
        }
        let next = self.timers.last_sent + self.timers.every;
        self.timers.keepalive.as_mut().reset(next);
        self.failure.is_none()
    }

    /// Takes `read` and what else the upstream already delivered, so a burst of events
    /// goes to the harness in one write (bounded, so relaying stays incremental).
    async fn take_burst(&mut self, read: Read) {
        let (intake, failure) = (&mut self.intake, &mut self.failure);
        let take = |read| intake.take(read, failure);
        self.body.burst(read, READY_BATCH_LIMIT, take).await;
    }

    /// Sorts the burst's events, each redacted and stripped of captured tokens: into the
    /// batch (forwarded), the withheld events, the spool (held for the response hook),
    /// or dropped. An event without data becomes a keepalive line (some clients decode
    /// every event as JSON).
    async fn forward_events(&mut self) {
        let Some(assembler) = &mut self.assembler else {
            return;
        };
        for ev in self.intake.events.drain(..) {
            // The upstream's key never reaches the harness or the record.
            let ev = self.redactor.bytes(ev);
            // Token capture: read ids and logprobs, relay the event without them.
            let ev = match &mut self.capture {
                Some(c) => c.strip_event(&ev),
                None => ev,
            };
            let parsed = SseEvent::new(&ev);
            if parsed.is_dataless() {
                self.batch.extend_from_slice(KEEPALIVE);
                continue;
            }
            match (assembler.push(&parsed), &mut self.spool) {
                (Relay::Forward | Relay::Withhold, Some(spool)) => {
                    if let Err(e) = spool.push(ev).await {
                        self.failure =
                            Some(Error::Internal(format!("cannot buffer the stream: {e}")));
                    }
                }
                (Relay::Forward, None) => {
                    let ev = heartbeat_relay(self.mode, &mut self.heartbeat, ev);
                    self.batch.extend_from_slice(&ev);
                }
                (Relay::Withhold, None) => {
                    let ev = heartbeat_relay(self.mode, &mut self.heartbeat, ev);
                    self.withheld.push(ev);
                }
                (Relay::Drop, _) => {}
                // A decision this server does not know (`Relay` is non-exhaustive): the
                // event is not sent, as one to drop.
                (_, _) => {}
            }
        }
    }

    /// Sends the burst's batch. The stream's last piece waits for the record instead,
    /// to go out with the withheld terminal event in one write; a batch for a harness
    /// that is gone is dropped.
    async fn flush(&mut self) {
        let last = self.intake.done && self.failure.is_none() && self.spool.is_none();
        if self.batch.is_empty() || last {
            return;
        }
        let out = self.batch.split().freeze();
        if !self.client_gone {
            self.send(out).await;
        }
    }

    /// Sends a piece to the harness. A harness found gone arms the grace timer; a call
    /// cancelled while the harness does not read is the relay's failure.
    async fn send(&mut self, piece: Bytes) {
        match send_or_cancel(&self.tx, piece, self.cancel).await {
            Sent::Queued => {}
            Sent::Gone => {
                self.client_gone = true;
                self.timers.arm_gone();
            }
            Sent::Cancelled => self.failure = Some(self.call.cancellation()),
        }
        self.timers.last_sent = tokio::time::Instant::now();
    }

    /// The stream assembled, or the failure; and what arrived of a call cut short
    /// (cancelled, disconnected, broken, ended early; not one cut off at
    /// `max_response_bytes`), which is what was relayed, for the record.
    fn end(&mut self) -> (Result<Assembled, Error>, Option<RawJson>) {
        let Some(assembler) = self.assembler.take() else {
            let e = Error::Internal("the stream was assembled twice".into());
            return (Err(e), None);
        };
        let cut_short =
            (self.failure.is_some() || !assembler.saw_terminal()) && !self.intake.truncated;
        let partial = if cut_short { assembler.partial() } else { None };
        let assembled = match self.failure.take() {
            Some(e) => Err(e),
            None => assembler.finish(),
        };
        (assembled, partial)
    }

    /// Sends the stream's end, once the call is recorded: the withheld terminal event
    /// (with the stream's last piece, in one write), the spooled stream, a stream made
    /// from a rewritten response, or an error event (after what was relayed before the
    /// failure).
    async fn send_tail(&mut self, ending: Ending) {
        let (call, cancel) = (self.call, self.cancel);
        match ending {
            Ending::Stopped(reason) => {
                let e = stopped_by_hook(&*call.entry.session, reason);
                send_or_cancel(&self.tx, call.dialect.error_event(&e), cancel).await;
            }
            _ if self.client_gone => {}
            Ending::Rewritten(v) => {
                for ev in call.dialect.synthesize_stream(&v) {
                    if send_or_cancel(&self.tx, ev, cancel).await != Sent::Queued {
                        break;
                    }
                }
            }
            Ending::Complete => match self.spool.take() {
                Some(spool) => {
                    if let Err(e) = spool.replay(&self.tx, cancel).await {
                        warn!(error = ?e.to_string(), "could not replay a buffered stream");
                    }
                }
                None => {
                    for ev in self.withheld.drain(..) {
                        self.batch.extend_from_slice(&ev);
                    }
                    if !self.batch.is_empty() {
                        send_or_cancel(&self.tx, self.batch.split().freeze(), cancel).await;
                    }
                }
            },
            Ending::Failed(e) => {
                let shown = call.answer(&e);
                self.batch
                    .extend_from_slice(&call.dialect.error_event(&shown));
                send_or_cancel(&self.tx, self.batch.split().freeze(), cancel).await;
            }
        }
    }
}

/// How a recorded stream ends for the harness.
enum Ending {
    /// As the upstream sent it.
    Complete,
    /// The response hook rewrote the response: a stream made from the new one.
    Rewritten(serde_json::Value),
    /// The response hook stopped the rollout for this reason.
    Stopped(String),
    /// The call failed.
    Failed(Error),
}
