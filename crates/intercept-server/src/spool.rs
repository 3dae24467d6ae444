//! A buffer for a whole stream: memory up to a bound, then a temporary file.

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Events of a stream held back until a response hook has run.
#[derive(Debug)]
pub(crate) struct Spool {
    memory: Vec<Bytes>,
    in_memory: usize,
    limit: usize,
    file: Option<tokio::fs::File>,
}

impl Spool {
    pub(crate) fn new(limit: usize) -> Self {
        Spool {
            memory: Vec::new(),
            in_memory: 0,
            limit,
            file: None,
        }
    }

    /// Whether the spool moved to a temporary file.
    #[cfg(test)]
    pub(crate) fn spilled(&self) -> bool {
        self.file.is_some()
    }

    pub(crate) async fn push(&mut self, event: Bytes) -> std::io::Result<()> {
        if self.file.is_none() && self.in_memory + event.len() <= self.limit {
            self.in_memory += event.len();
            self.memory.push(event);
            return Ok(());
        }
        if self.file.is_none() {
            let std_file = tokio::task::spawn_blocking(tempfile::tempfile)
                .await
                .map_err(std::io::Error::other)??;
            let mut file = tokio::fs::File::from_std(std_file);
            for chunk in self.memory.drain(..) {
                file.write_all(&chunk).await?;
            }
            self.in_memory = 0;
            self.file = Some(file);
        }
        if let Some(file) = &mut self.file {
            file.write_all(&event).await?;
        }
        Ok(())
    }

    /// Sends everything, in 64 KiB pieces from the file; stops early if the receiver is
    /// gone or `cancel` fires while the receiver does not take a piece.
    pub(crate) async fn replay(
        self,
        tx: &mpsc::Sender<Bytes>,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> std::io::Result<()> {
        use crate::relay::{send_or_cancel, Sent};
        for chunk in self.memory {
            if send_or_cancel(tx, chunk, cancel).await != Sent::Queued {
                return Ok(());
            }
        }
        if let Some(mut file) = self.file {
            file.flush().await?;
            file.seek(std::io::SeekFrom::Start(0)).await?;
            loop {
                let mut buf = vec![0u8; 64 * 1024];
                let n = file.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                buf.truncate(n);
                if send_or_cancel(tx, Bytes::from(buf), cancel).await != Sent::Queued {
                    break;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn spills_to_a_file_and_replays_everything_in_order() {
        let mut spool = Spool::new(10);
        let events: Vec<Bytes> = (0..20)
            .map(|i| Bytes::from(format!("data: {i}\n\n")))
            .collect();
        for e in &events {
            spool.push(e.clone()).await.expect("push");
        }
        assert!(spool.spilled());
        let (tx, mut rx) = mpsc::channel(64);
        spool
            .replay(&tx, &tokio_util::sync::CancellationToken::new())
            .await
            .expect("replay");
        drop(tx);
        let mut out = Vec::new();
        while let Some(b) = rx.recv().await {
            out.extend_from_slice(&b);
        }
        assert_eq!(out, events.concat());
    }
}
