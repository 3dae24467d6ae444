//! Pieces of an answer sent towards the harness: each send races the call's
//! cancellation, so a harness that stops reading never holds the call.

use bytes::Bytes;
use tokio::sync::mpsc;

/// What became of a piece sent towards the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Queued for the harness's connection.
    Queued,
    /// Nobody reads the stream any more (the harness is gone).
    Gone,
    /// The call was cancelled while the harness did not take the piece.
    Cancelled,
}

/// Queues `piece` for the harness unless the call is cancelled first. A piece that
/// finds room is queued as by `try_send` (no wait, no allocation); only a harness that
/// does not read makes it wait, and then cancellation wins.
pub(crate) async fn send_or_cancel(
    tx: &mpsc::Sender<Bytes>,
    piece: Bytes,
    cancel: &tokio_util::sync::CancellationToken,
) -> Sent {
    match tx.try_send(piece) {
        Ok(()) => Sent::Queued,
        Err(mpsc::error::TrySendError::Closed(_)) => Sent::Gone,
        Err(mpsc::error::TrySendError::Full(piece)) => tokio::select! {
            biased;
            _ = cancel.cancelled() => Sent::Cancelled,
            r = tx.send(piece) => if r.is_ok() { Sent::Queued } else { Sent::Gone },
        },
    }
}
