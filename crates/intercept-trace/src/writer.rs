//! Trace files and their writer thread.
//!
//! A [`JsonlSink`] is one session's trace file. In the default [`TraceFormat::Log`] it
//! appends the session's log lines ([`intercept_core::log`]: what each call adds); in
//! [`TraceFormat::Full`], the format of earlier versions, one whole [`CallRecord`] per
//! line. It appends with one `write` per batch of whole lines, on the caller's thread.
//!
//! The sidecar instead hands lines to a [`TraceWriter`]: the session's lines are queued
//! as the call records; one writer thread per process appends the queued lines, many
//! per system call (`writev` of each file's lines, whole lines only). The queue is
//! bounded in bytes ([`WriterConfig::max_queued_bytes`], counting lines until they are
//! written): while it is full, a call waits for room before it records
//! ([`QueuedSink`]'s [`RecordSink::room`], awaited by the server), so a slow or stuck disk
//! slows the calls down rather than growing memory, and the wait holds no thread: the
//! event loop that serves the call serves its other connections meanwhile. Lines handed
//! in without that wait (by a caller that does not await it) are queued at once on a
//! runtime thread, and wait for room as they always did on any other thread; the queue so
//! passes its bound by at most what the calls recording at the moment it filled add
//! (one call's lines per event loop). The waits are counted
//! ([`TraceWriter::room_waits`]). The writer waits at most
//! [`WriterConfig::flush_interval`] after a line arrives before writing it (less when the
//! queue is half full or a flush is asked for), so a crash loses the lines still queued:
//! those of calls recorded in the last flush interval (plus the time of the write
//! before), never more than the byte bound. Lines that cannot be written (a full disk)
//! are counted ([`TraceWriter::lost_lines`]) and logged with their file, never dropped
//! silently; a line torn by a failed write is ended before the next line goes to that
//! file. A failure that goes on (every file of a full disk) does not flood the log: the
//! first loss is logged at once, then at most one line every 10 s sums up the lines lost
//! since (with the last file and error), and one line says when appends work again.
//!
//! Either way a crash can tear at most the last line of a file; readers
//! ([`crate::read_log_file`], [`crate::read_trace_file`]) skip such a torn line and
//! report it, and a log without its end line reads as incomplete. Re-opening a file
//! whose last line is torn first ends that line, so lines appended later stay whole.

// The writer is a thread of its own, outside any runtime: it keeps the process's clock.
#![allow(clippy::disallowed_types)]

use std::fs::{File, OpenOptions};
use std::io::{IoSlice, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use intercept_core::{CallRecord, RecordSink, RecordWait, RolloutSession};
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

/// What a trace file holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TraceFormat {
    /// The session's log (`docs/traces.md`): each message, value and token once.
    #[default]
    Log,
    /// The format of earlier versions, for readers that cannot change yet: one whole
    /// record per line (each repeating the conversation so far), and the episode in
    /// `<id>.episode.json` at release.
    Full,
}

impl TraceFormat {
    /// The setting's name (`log`, `full`).
    pub fn as_str(self) -> &'static str {
        match self {
            TraceFormat::Log => "log",
            TraceFormat::Full => "full",
        }
    }
}

/// Writes `<dir>/<id>.episode.json` (the session's episode, JSON) and returns its
/// path: the episode file of [`TraceFormat::Full`].
pub fn write_episode(dir: &Path, session: &RolloutSession) -> std::io::Result<PathBuf> {
    let id = &session.config().id;
    let path = dir.join(format!("{id}.episode.json"));
    let tmp = dir.join(format!(".{id}.episode.json.tmp"));
    let json = serde_json::to_vec(&session.episode()).map_err(std::io::Error::other)?;
    {
        let mut file = File::create(&tmp)?;
        file.write_all(&json)?;
        file.write_all(b"\n")?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Writes the episode file of a released session when there is a trace folder and its
/// format is [`TraceFormat::Full`], and logs a failure (the session is released either
/// way). A log needs none: its nodes are the episode.
pub fn save_episode(dir: Option<&Path>, format: TraceFormat, session: &RolloutSession) {
    if format != TraceFormat::Full {
        return;
    }
    if let Some(dir) = dir {
        if let Err(e) = write_episode(dir, session) {
            warn!(session = %session.config().id, dir = %dir.display(), error = %e, "could not write the episode file");
        }
    }
}

/// A [`RecordSink`] that appends each record to a JSONL file as the call ends.
#[derive(Debug)]
pub struct JsonlSink {
    path: PathBuf,
    format: TraceFormat,
    file: Mutex<File>,
    /// A failed write may have left part of a line: end it before the next one.
    torn: AtomicBool,
    /// Bytes appended since the kernel was last told the file's pages may leave the
    /// page cache (see [`PAGE_CACHE_HINT_EVERY`]). Only written with `file` locked.
    unadvised: AtomicU64,
}

impl JsonlSink {
    /// Opens (creating it if needed) `path` for appending.
    pub fn open(path: impl Into<PathBuf>) -> std::io::Result<Self> {
        let path = path.into();
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)?;
        let len = file.metadata()?.len();
        if len > 0 {
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(len - 1))?;
            file.read_exact(&mut last)?;
            if last[0] != b'\n' {
                // A torn line from an earlier crash: end it so it stays on its own.
                file.write_all(b"\n")?;
            }
        }
        Ok(JsonlSink::of(path, file))
    }

    /// Creates `path` for appending; fails with [`std::io::ErrorKind::AlreadyExists`] if
    /// it exists (atomically: of two creators of one path, exactly one succeeds), so a
    /// session never appends to the trace file of an earlier rollout.
    pub fn create_new(path: impl Into<PathBuf>) -> std::io::Result<Self> {
        let path = path.into();
        let file = OpenOptions::new()
            .create_new(true)
            .read(true)
            .append(true)
            .open(&path)?;
        Ok(JsonlSink::of(path, file))
    }

    /// A sink appending to `file`, open at `path`, in the default format.
    fn of(path: PathBuf, file: File) -> Self {
        JsonlSink {
            path,
            format: TraceFormat::Log,
            file: Mutex::new(file),
            torn: AtomicBool::new(false),
            unadvised: AtomicU64::new(0),
        }
    }

    /// With this format ([`TraceFormat::Log`] unless set).
    pub fn with_format(mut self, format: TraceFormat) -> Self {
        self.format = format;
        self
    }

    /// The format the file is written in.
    pub fn format(&self) -> TraceFormat {
        self.format
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Forces what was written to stable storage.
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.lock().sync_data()
    }

    /// Appends whole lines (each ending in a newline) with as few `writev` calls as the
    /// system allows. After a failure part of a line may be on disk: the next append
    /// first ends it with a newline, so later lines stay whole.
    fn append(&self, lines: &[&[u8]]) -> std::io::Result<()> {
        let mut file = self.file.lock();
        if self.torn.load(Ordering::Relaxed) {
            file.write_all(b"\n")?;
            self.torn.store(false, Ordering::Relaxed);
        }
        let result = write_all_vectored(&mut file, lines);
        if result.is_err() {
            self.torn.store(true, Ordering::Relaxed);
        } else {
            let n = lines.iter().map(|l| l.len() as u64).sum::<u64>();
            let unadvised = self.unadvised.load(Ordering::Relaxed) + n;
            if unadvised >= PAGE_CACHE_HINT_EVERY {
                release_page_cache(&file);
                self.unadvised.store(0, Ordering::Relaxed);
            } else {
                self.unadvised.store(unadvised, Ordering::Relaxed);
            }
        }
        result
    }
}

/// How many bytes a trace file grows by between two hints to the kernel that its pages
/// may leave the page cache.
///
/// Trace files are written once and read back rarely (a released trace, a trainer
/// reading the directory). Left in the page cache, they take ~3.3 KB of fresh memory per
/// recorded call, gigabytes an hour; on a VM whose host backs memory lazily, fresh
/// pages are dear (docs/benchmarks.md, "Fresh memory on a VM"). The hint
/// (`POSIX_FADV_DONTNEED` over the file) starts the writeback of the dirty pages and lets
/// the clean ones go, so the writer reuses pages instead of taking new ones. It loses
/// nothing: dirty pages stay until they are written.
pub const PAGE_CACHE_HINT_EVERY: u64 = 1 << 20;

/// Tells the kernel that `file`'s pages need not stay in the page cache (a hint: an
/// error is ignored; a no-op where there is no such hint). The trace files take it every
/// [`PAGE_CACHE_HINT_EVERY`] bytes appended.
pub fn release_page_cache(file: &File) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed);
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = file;
}

/// The most buffers one `writev` takes (Linux's `IOV_MAX`).
const MAX_IOV: usize = 1024;

/// Writes every byte of `lines`, in order, by `writev`.
fn write_all_vectored(file: &mut File, lines: &[&[u8]]) -> std::io::Result<()> {
    let (mut i, mut offset) = (0, 0);
    let mut slices = Vec::with_capacity(lines.len().min(MAX_IOV));
    while i < lines.len() {
        slices.clear();
        slices.push(IoSlice::new(&lines[i][offset..]));
        slices.extend(
            lines[i + 1..]
                .iter()
                .take(MAX_IOV - 1)
                .map(|l| IoSlice::new(l)),
        );
        let mut n = match file.write_vectored(&slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while n > 0 && i < lines.len() {
            let rest = lines[i].len() - offset;
            if n >= rest {
                n -= rest;
                i += 1;
                offset = 0;
            } else {
                offset += n;
                n = 0;
            }
        }
    }
    Ok(())
}

impl JsonlSink {
    fn append_logged(&self, lines: &[u8]) {
        match self.append(&[lines]) {
            Ok(()) => LOSSES.written(),
            Err(e) => LOSSES.failed(&self.path, count_lines(lines), &e),
        }
    }
}

/// Lines in a batch of whole lines.
fn count_lines(lines: &[u8]) -> usize {
    memchr::memchr_iter(b'\n', lines).count().max(1)
}

impl RecordSink for JsonlSink {
    fn on_record(&self, record: &CallRecord) {
        if self.format == TraceFormat::Full {
            self.append_logged(&line_of(record));
        }
    }

    fn on_log(&self, lines: &[u8]) {
        if self.format == TraceFormat::Log {
            self.append_logged(lines);
        }
    }
}

/// How often, at most, the log says more about trace lines being lost.
const LOSS_LOG_EVERY: Duration = Duration::from_secs(10);

/// The log of trace lines that could not be appended, for the whole process.
static LOSSES: LossLog = LossLog::new(LOSS_LOG_EVERY);

/// Logs lost trace lines without flooding the log when every append fails (a full disk,
/// thousands of files): the first loss is logged at once; while losses go on, at most
/// one line per `every` sums up the lines lost since, naming the last file and error;
/// the first append that works after losses says so (also at most once per `every`).
struct LossLog {
    every: Duration,
    /// Whether lines were lost since appends last worked (read without the lock on
    /// every append that works).
    losing: AtomicBool,
    state: Mutex<LossState>,
}

struct LossState {
    /// When the log last said something.
    logged_at: Option<Instant>,
    /// Lines lost and not logged yet.
    unlogged: u64,
    /// The last file and error of those.
    last: Option<(PathBuf, String)>,
}

impl LossLog {
    const fn new(every: Duration) -> Self {
        LossLog {
            every,
            losing: AtomicBool::new(false),
            state: Mutex::new(LossState {
                logged_at: None,
                unlogged: 0,
                last: None,
            }),
        }
    }

    /// `lines` lines for `path` could not be appended.
    fn failed(&self, path: &Path, lines: usize, error: &std::io::Error) {
        self.losing.store(true, Ordering::Relaxed);
        let mut s = self.state.lock();
        s.unlogged += lines as u64;
        let now = Instant::now();
        if s.logged_at
            .is_some_and(|at| now.duration_since(at) < self.every)
        {
            s.last = Some((path.to_owned(), error.to_string()));
            return;
        }
        warn!(
            path = %path.display(),
            lines = s.unlogged,
            error = %error,
            "could not append call records to the trace file; they are lost (while appends \
             keep failing, one line every {} s sums up the losses)",
            self.every.as_secs_f64()
        );
        s.unlogged = 0;
        s.last = None;
        s.logged_at = Some(now);
    }

    /// An append worked.
    fn written(&self) {
        if !self.losing.load(Ordering::Relaxed) {
            return;
        }
        let mut s = self.state.lock();
        let now = Instant::now();
        if s.logged_at
            .is_some_and(|at| now.duration_since(at) < self.every)
        {
            return;
        }
        self.report(&mut s);
        self.losing.store(false, Ordering::Relaxed);
        info!("call records are appended to the trace files again");
        s.logged_at = Some(now);
    }

    /// Logs the losses not logged yet, if any.
    fn report(&self, s: &mut LossState) {
        if s.unlogged == 0 {
            return;
        }
        let (path, error) = s.last.take().unwrap_or_default();
        warn!(
            lines = s.unlogged,
            last_path = %path.display(),
            last_error = %error,
            "more call records could not be appended to their trace files; they are lost"
        );
        s.unlogged = 0;
    }

    /// Logs the losses not logged yet (the writer is ending).
    fn flush(&self) {
        let mut s = self.state.lock();
        self.report(&mut s);
    }
}

/// A record's trace line, its newline included, in one buffer sized for it.
fn line_of(record: &CallRecord) -> Vec<u8> {
    let mut line = Vec::with_capacity(record.json_size_hint() + 1);
    record.write_json(&mut line);
    line.push(b'\n');
    line
}

/// Settings of a [`TraceWriter`].
#[derive(Debug, Clone, Copy)]
pub struct WriterConfig {
    /// Most bytes of lines handed in and not yet written; a call whose line does not fit
    /// waits (a line longer than the bound is taken when nothing else is pending).
    pub max_queued_bytes: usize,
    /// Longest time a line waits in the queue before the writer writes it (when the
    /// writer is not busy writing earlier lines).
    pub flush_interval: Duration,
}

impl Default for WriterConfig {
    /// 64 MiB and 10 ms.
    fn default() -> Self {
        WriterConfig {
            max_queued_bytes: 64 << 20,
            flush_interval: Duration::from_millis(10),
        }
    }
}

/// One line waiting for the writer.
struct Pending {
    file: Arc<JsonlSink>,
    line: Vec<u8>,
}

#[derive(Default)]
struct Queue {
    lines: Vec<Pending>,
    /// Bytes of lines handed in and not yet written (queued or being written).
    bytes: usize,
    /// Lines handed in, ever.
    handed: u64,
    /// Lines written (or failed), ever.
    done: u64,
    /// A flush waits: write without waiting for the flush interval.
    urgent: bool,
    /// The writer is ending (or ended): lines are written by their caller.
    closing: bool,
    /// The writer thread has ended (closed, or it panicked): nothing waits for it.
    ended: bool,
}

struct Shared {
    config: WriterConfig,
    queue: Mutex<Queue>,
    /// The writer waits on it for lines.
    wake: Condvar,
    /// Threads wait on it for room and flushes.
    progress: Condvar,
    /// Tasks wait on it for room (woken after each batch written).
    space: tokio::sync::Notify,
    /// `Queue::bytes`, and whether the writer is ending, readable without the lock (a
    /// record asks whether there is room before every call's lines).
    queued: AtomicUsize,
    ending: AtomicBool,
    /// Waits for room: how many, and their time in nanoseconds.
    waits: AtomicU64,
    waited_ns: AtomicU64,
    lost: AtomicU64,
}

/// The trace files' writer: one thread that appends the lines every [`QueuedSink`] of it
/// hands in (see the module docs).
pub struct TraceWriter {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for TraceWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceWriter")
            .field("config", &self.shared.config)
            .field("lost", &self.lost_lines())
            .finish_non_exhaustive()
    }
}

impl TraceWriter {
    /// Starts the writer thread.
    pub fn start(config: WriterConfig) -> std::io::Result<Arc<Self>> {
        let shared = Arc::new(Shared {
            config,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            progress: Condvar::new(),
            space: tokio::sync::Notify::new(),
            queued: AtomicUsize::new(0),
            ending: AtomicBool::new(false),
            waits: AtomicU64::new(0),
            waited_ns: AtomicU64::new(0),
            lost: AtomicU64::new(0),
        });
        let thread = std::thread::Builder::new()
            .name("trace-writer".into())
            .spawn({
                let shared = shared.clone();
                move || shared.run()
            })?;
        Ok(Arc::new(TraceWriter {
            shared,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// A sink whose records this writer appends to `file`.
    pub fn sink(self: &Arc<Self>, file: JsonlSink) -> QueuedSink {
        QueuedSink {
            file: Arc::new(file),
            shared: self.shared.clone(),
        }
    }

    /// Waits until every line handed in before this call is written (or failed). Blocks
    /// the thread: from async code, call it on a blocking thread.
    pub fn flush(&self) {
        let mut q = self.shared.queue.lock();
        let target = q.handed;
        if q.done >= target {
            return;
        }
        q.urgent = true;
        self.shared.wake.notify_one();
        while q.done < target && !q.ended {
            self.shared.progress.wait(&mut q);
        }
    }

    /// Writes what is queued and ends the writer thread; lines handed in later are
    /// written by the caller, one `write` each. Blocks like [`TraceWriter::flush`].
    pub fn close(&self) {
        self.shared.queue.lock().closing = true;
        self.shared.ending.store(true, Ordering::SeqCst);
        self.shared.space.notify_waiters();
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }

    /// Lines that could not be written, ever (each also logged).
    pub fn lost_lines(&self) -> u64 {
        self.shared.lost.load(Ordering::Relaxed)
    }

    /// Bytes handed in and not yet written.
    pub fn queued_bytes(&self) -> usize {
        self.shared.queue.lock().bytes
    }

    /// Waits for room in the queue so far: how many calls waited before they recorded,
    /// and for how long in all (a slow or stalled disk shows here, and as the calls'
    /// latency).
    pub fn room_waits(&self) -> (u64, Duration) {
        (
            self.shared.waits.load(Ordering::Relaxed),
            Duration::from_nanos(self.shared.waited_ns.load(Ordering::Relaxed)),
        )
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        self.close();
    }
}

impl Shared {
    /// Whether a record may add its lines now: the queue is under its bound, or the
    /// writer is ending (lines are then written by their caller).
    fn has_room(&self) -> bool {
        self.queued.load(Ordering::SeqCst) < self.config.max_queued_bytes
            || self.ending.load(Ordering::SeqCst)
    }

    /// `None` when there is room; else a wait until the writer made some (see
    /// [`QueuedSink`]'s [`RecordSink::room`]).
    fn room(self: &Arc<Self>) -> Option<RecordWait> {
        if self.has_room() {
            return None;
        }
        let shared = self.clone();
        Some(Box::pin(async move { shared.wait_for_room().await }))
    }

    async fn wait_for_room(&self) {
        let started = Instant::now();
        loop {
            let notified = self.space.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.has_room() {
                break;
            }
            notified.await;
        }
        self.waits.fetch_add(1, Ordering::Relaxed);
        let waited = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.waited_ns.fetch_add(waited, Ordering::Relaxed);
    }

    /// Queues one line (see the module docs). On a thread of a tokio runtime it never
    /// waits: the caller waited for room before recording ([`Shared::room`]). On any
    /// other thread, a line that does not fit waits until the writer made room.
    fn hand(&self, file: &Arc<JsonlSink>, line: Vec<u8>) {
        let len = line.len();
        let mut q = self.queue.lock();
        let full = |q: &Queue| q.bytes > 0 && q.bytes + len > self.config.max_queued_bytes;
        if full(&q) && tokio::runtime::Handle::try_current().is_err() {
            while full(&q) && !q.closing {
                self.progress.wait(&mut q);
            }
        }
        if q.closing || q.ended {
            // Nothing waits for the writer any more: write it here.
            drop(q);
            self.write(vec![Pending {
                file: file.clone(),
                line,
            }]);
            return;
        }
        let was_empty = q.lines.is_empty();
        q.lines.push(Pending {
            file: file.clone(),
            line,
        });
        q.bytes += len;
        self.queued.store(q.bytes, Ordering::SeqCst);
        q.handed += 1;
        if was_empty || q.bytes >= self.config.max_queued_bytes / 2 {
            self.wake.notify_one();
        }
    }

    /// The writer thread.
    fn run(&self) {
        /// However the thread ends, callers stop waiting for it and what it left queued
        /// is written by the thread ending.
        struct Ended<'a>(&'a Shared);
        impl Drop for Ended<'_> {
            fn drop(&mut self) {
                let left = {
                    let mut q = self.0.queue.lock();
                    q.ended = true;
                    q.closing = true;
                    std::mem::take(&mut q.lines)
                };
                self.0.ending.store(true, Ordering::SeqCst);
                self.0.progress.notify_all();
                self.0.space.notify_waiters();
                self.0.write(left);
                LOSSES.flush();
                // Nothing is queued any more, also after a panic mid-batch (the gauge
                // reads it).
                let mut q = self.0.queue.lock();
                q.bytes = 0;
                self.0.queued.store(0, Ordering::SeqCst);
                q.done = q.handed;
            }
        }
        let _ended = Ended(self);
        loop {
            let batch = {
                let mut q = self.queue.lock();
                while q.lines.is_empty() {
                    if q.closing {
                        return;
                    }
                    self.wake.wait(&mut q);
                }
                let deadline = Instant::now() + self.config.flush_interval;
                while !(q.urgent || q.closing || q.bytes >= self.config.max_queued_bytes / 2) {
                    if self.wake.wait_until(&mut q, deadline).timed_out() {
                        break;
                    }
                }
                q.urgent = false;
                std::mem::take(&mut q.lines)
            };
            let (count, bytes) = (
                batch.len() as u64,
                batch.iter().map(|p| p.line.len()).sum::<usize>(),
            );
            self.write(batch);
            let mut q = self.queue.lock();
            q.done += count;
            q.bytes -= bytes;
            self.queued.store(q.bytes, Ordering::SeqCst);
            self.progress.notify_all();
            drop(q);
            self.space.notify_waiters();
        }
    }

    /// Appends a batch: each file's lines in the order they were handed in, one `writev`
    /// per file (or more beyond [`MAX_IOV`] lines).
    fn write(&self, mut batch: Vec<Pending>) {
        // Stable: each file's lines keep their order.
        batch.sort_by_key(|p| Arc::as_ptr(&p.file) as usize);
        for run in batch.chunk_by(|a, b| Arc::ptr_eq(&a.file, &b.file)) {
            let file = &run[0].file;
            let lines: Vec<&[u8]> = run.iter().map(|p| p.line.as_slice()).collect();
            match file.append(&lines) {
                Ok(()) => LOSSES.written(),
                Err(e) => {
                    let lines: usize = run.iter().map(|p| count_lines(&p.line)).sum();
                    self.lost.fetch_add(lines as u64, Ordering::Relaxed);
                    LOSSES.failed(&file.path, lines, &e);
                }
            }
        }
    }
}

/// A [`RecordSink`] that serialises each record on the caller's thread and queues the
/// line for its [`TraceWriter`].
pub struct QueuedSink {
    file: Arc<JsonlSink>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for QueuedSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuedSink")
            .field("path", &self.file.path)
            .finish_non_exhaustive()
    }
}

impl QueuedSink {
    /// The file's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Forces what was written to stable storage (flush the writer first for what is
    /// queued).
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.sync()
    }
}

impl RecordSink for QueuedSink {
    /// While the writer's queue is full: a wait until it has room (see the module docs).
    fn room(&self) -> Option<RecordWait> {
        self.shared.room()
    }

    fn on_record(&self, record: &CallRecord) {
        if self.file.format == TraceFormat::Full {
            self.shared.hand(&self.file, line_of(record));
        }
    }

    fn on_log(&self, lines: &[u8]) {
        if self.file.format == TraceFormat::Log {
            self.shared.hand(&self.file, lines.to_vec());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_trace_file;

    fn parse_trace_full(text: &[u8]) -> crate::TraceFile {
        crate::parse_trace(text).unwrap()
    }

    fn record(seq: u64) -> CallRecord {
        serde_json::from_value(serde_json::json!({
            "session": "s", "seq": seq, "dialect": "chat_completions", "endpoint": "/chat/completions",
            "model": "m", "stream": false, "sampling": {}, "request": {"model": "m"},
            "response": null, "finish_reason": null, "usage": {"prompt_tokens": 1,
            "completion_tokens": 2, "cached_input_tokens": 0, "reasoning_tokens": 0},
            "status": 200, "started_at": 1.0, "ended_at": 2.0, "ttfb_ms": null, "error": null
        }))
        .unwrap()
    }

    /// A file written well past the page-cache hint's interval keeps every line, whole
    /// and in order, whether lines come one by one or in batches through the writer.
    #[test]
    fn lines_past_the_page_cache_hints_are_all_kept_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let line_len = record(0).to_json_line().len() as u64 + 1;
        let n = 3 * PAGE_CACHE_HINT_EVERY / line_len + 10;
        // One by one.
        let path = dir.path().join("direct.jsonl");
        let sink = JsonlSink::open(&path)
            .unwrap()
            .with_format(TraceFormat::Full);
        for seq in 0..n {
            sink.on_record(&record(seq));
        }
        // The hint was given (the count since the last one is below the interval).
        assert!(sink.unadvised.load(Ordering::Relaxed) < PAGE_CACHE_HINT_EVERY);
        drop(sink);
        let t = read_trace_file(&path).unwrap();
        assert!(t.skipped.is_empty());
        assert!(t.records.iter().map(|r| r.seq).eq(0..n));
        // In batches, through the writer.
        let w = writer(64 << 10, Duration::from_millis(1));
        let path = dir.path().join("queued.jsonl");
        let sink = w.sink(
            JsonlSink::open(&path)
                .unwrap()
                .with_format(TraceFormat::Full),
        );
        for seq in 0..n {
            sink.on_record(&record(seq));
        }
        w.flush();
        let t = read_trace_file(&path).unwrap();
        assert!(t.skipped.is_empty());
        assert!(t.records.iter().map(|r| r.seq).eq(0..n));
        assert_eq!(w.lost_lines(), 0);
    }

    #[test]
    fn appends_and_repairs_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let sink = JsonlSink::open(&path)
            .unwrap()
            .with_format(TraceFormat::Full);
        sink.on_record(&record(0));
        sink.on_record(&record(1));
        sink.sync().unwrap();
        drop(sink);
        let t = read_trace_file(&path).unwrap();
        assert_eq!(t.records.iter().map(|r| r.seq).collect::<Vec<_>>(), [0, 1]);
        assert!(t.skipped.is_empty());

        // A crash mid-write leaves half a line.
        let mut torn = std::fs::read(&path).unwrap();
        let half = record(2).to_json_line();
        torn.extend_from_slice(&half.as_bytes()[..half.len() / 2]);
        std::fs::write(&path, &torn).unwrap();
        let t = read_trace_file(&path).unwrap();
        assert_eq!(t.records.len(), 2);
        assert_eq!(t.skipped, [3]);

        // Re-opened, the torn line is ended and later records stay whole.
        let sink = JsonlSink::open(&path)
            .unwrap()
            .with_format(TraceFormat::Full);
        sink.on_record(&record(3));
        let t = read_trace_file(&path).unwrap();
        assert_eq!(
            t.records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            [0, 1, 3]
        );
        assert_eq!(t.skipped, [3]);
    }

    fn writer(max_queued_bytes: usize, flush_interval: Duration) -> Arc<TraceWriter> {
        TraceWriter::start(WriterConfig {
            max_queued_bytes,
            flush_interval,
        })
        .unwrap()
    }

    #[test]
    fn the_writer_keeps_each_files_order_and_a_flush_does_not_wait_for_the_interval() {
        let dir = tempfile::tempdir().unwrap();
        // An interval no test waits for: only the flush writes.
        let w = writer(1 << 20, Duration::from_secs(3600));
        let sinks: Vec<Arc<QueuedSink>> = (0..3)
            .map(|i| {
                let file = JsonlSink::create_new(dir.path().join(format!("{i}.jsonl")))
                    .unwrap()
                    .with_format(TraceFormat::Full);
                Arc::new(w.sink(file))
            })
            .collect();
        std::thread::scope(|scope| {
            for thread in 0..2u64 {
                let sinks = &sinks;
                scope.spawn(move || {
                    for seq in 0..50 {
                        for sink in sinks {
                            sink.on_record(&record(thread * 1000 + seq));
                        }
                    }
                });
            }
        });
        assert!(
            w.queued_bytes() > 0,
            "nothing may be written before the interval"
        );
        let started = Instant::now();
        w.flush();
        assert!(started.elapsed() < Duration::from_secs(60));
        assert_eq!(w.queued_bytes(), 0);
        for i in 0..3 {
            let t = read_trace_file(&dir.path().join(format!("{i}.jsonl"))).unwrap();
            assert!(t.skipped.is_empty());
            // Each thread's records, in the order it handed them.
            for thread in 0..2u64 {
                let seqs: Vec<u64> = t
                    .records
                    .iter()
                    .map(|r| r.seq)
                    .filter(|s| s / 1000 == thread)
                    .collect();
                assert_eq!(seqs, (0..50).map(|s| thread * 1000 + s).collect::<Vec<_>>());
            }
        }
        w.close();
        // After close, lines are written by the caller, at once.
        sinks[0].on_record(&record(99));
        let t = read_trace_file(&dir.path().join("0.jsonl")).unwrap();
        assert_eq!(t.records.last().map(|r| r.seq), Some(99));
    }

    #[test]
    fn the_interval_writes_without_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let w = writer(1 << 20, Duration::from_millis(5));
        let sink = w.sink(
            JsonlSink::create_new(&path)
                .unwrap()
                .with_format(TraceFormat::Full),
        );
        sink.on_record(&record(0));
        let started = Instant::now();
        while read_trace_file(&path).unwrap().records.is_empty() {
            assert!(started.elapsed() < Duration::from_secs(60), "never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(w.lost_lines(), 0);
    }

    /// A disk that stays full gives a few log lines, not one per lost line: the first
    /// loss at once, then one sum per period, then one line when appends work again.
    #[test]
    fn losses_that_go_on_are_summed_up_not_logged_one_by_one() {
        #[derive(Clone, Default)]
        struct Captured(Arc<Mutex<Vec<u8>>>);
        impl Write for Captured {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        let every = Duration::from_millis(200);
        let log = LossLog::new(every);
        tracing::subscriber::with_default(subscriber, || {
            let full = std::io::Error::from_raw_os_error(28);
            for i in 0..1000 {
                log.failed(Path::new(&format!("/t/{}.jsonl", i % 50)), 2, &full);
            }
            // Within the period, an append that works says nothing yet.
            log.written();
            std::thread::sleep(every + every / 4);
            log.failed(Path::new("/t/last.jsonl"), 1, &full);
            std::thread::sleep(every + every / 4);
            log.written();
            log.written();
        });
        let text = String::from_utf8(captured.0.lock().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].contains("WARN"), "{text}");
        assert!(
            lines[0].contains("path=/t/0.jsonl") && lines[0].contains("lines=2"),
            "{text}"
        );
        // The other 999 failures (1,998 lines) and the last one, summed up.
        assert!(
            lines[1].contains("path=/t/last.jsonl") && lines[1].contains("lines=1999"),
            "{text}"
        );
        assert!(
            lines[2].contains("INFO") && lines[2].contains("again"),
            "{text}"
        );
    }

    #[test]
    fn a_full_disk_counts_the_lost_lines_and_blocks_nobody() {
        let w = writer(1024, Duration::from_millis(1));
        let sink = w.sink(
            JsonlSink::open("/dev/full")
                .unwrap()
                .with_format(TraceFormat::Full),
        );
        for seq in 0..20 {
            sink.on_record(&record(seq));
        }
        w.flush();
        assert_eq!(w.lost_lines(), 20);
        assert_eq!(w.queued_bytes(), 0);
    }

    /// A named pipe in a fresh folder (kept while the folder lives): a file whose
    /// writes block once nobody reads, as on a disk that stopped.
    fn fifo() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("slow");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        (dir, fifo)
    }

    #[test]
    fn a_stuck_disk_holds_callers_at_the_byte_bound() {
        let (_dir, fifo) = fifo();
        // Read and write: opening does not wait for a reader, and writes block once the
        // pipe is full, as on a disk that stopped.
        let target = JsonlSink::open(&fifo)
            .unwrap()
            .with_format(TraceFormat::Full);
        let bound = 8 * 1024;
        let w = writer(bound, Duration::from_millis(1));
        let shared = w.shared.clone();
        let file = Arc::new(target);
        let lines = 1000;
        let handed = Arc::new(AtomicU64::new(0));
        let producer = std::thread::spawn({
            let (shared, file, handed) = (shared.clone(), file.clone(), handed.clone());
            move || {
                for i in 0..lines {
                    let mut line = format!("{i:07}").into_bytes();
                    line.resize(999, b'x');
                    line.push(b'\n');
                    shared.hand(&file, line);
                    handed.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        // The pipe holds 64 KiB, the queue 8: the caller waits well before its end.
        std::thread::sleep(Duration::from_millis(300));
        let stuck = handed.load(Ordering::SeqCst);
        assert!(stuck < lines, "the caller was never held");
        assert!(w.queued_bytes() <= bound, "{} queued", w.queued_bytes());
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            handed.load(Ordering::SeqCst),
            stuck,
            "held callers moved on"
        );
        // The disk comes back: everything arrives, whole and in order.
        let mut reader = File::open(&fifo).unwrap();
        let mut got = vec![0u8; lines as usize * 1000];
        reader.read_exact(&mut got).unwrap();
        producer.join().unwrap();
        for (i, line) in got.chunks(1000).enumerate() {
            assert_eq!(&line[..7], format!("{i:07}").as_bytes());
            assert_eq!(line[999], b'\n');
        }
        w.flush();
        assert_eq!(w.lost_lines(), 0);
    }

    /// On a runtime, a full queue never blocks the thread: a record asks for room first
    /// and waits for it as a task, while the other tasks of the same single-threaded
    /// runtime go on; handed lines never wait. Once the disk moves, the wait ends, every
    /// line arrives in order and the wait is counted.
    #[test]
    fn a_stuck_disk_holds_a_recording_task_not_its_thread() {
        let (_dir, fifo) = fifo();
        let bound = 8 * 1024;
        let w = writer(bound, Duration::from_millis(1));
        let sink = Arc::new(w.sink(JsonlSink::open(&fifo).unwrap()));
        let line = |i: usize| {
            let mut line = format!("{i:07}").into_bytes();
            line.resize(999, b'x');
            line.push(b'\n');
            line
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let lines = 200;
        let handed = rt.block_on(async {
            // Records as the server does: room first, then the lines.
            let recorder = tokio::spawn({
                let sink = sink.clone();
                async move {
                    for i in 0..lines {
                        if let Some(wait) = sink.room() {
                            wait.await;
                        }
                        sink.on_log(&line(i));
                    }
                }
            });
            // The pipe takes 64 KiB, the queue 8: the recorder ends up waiting for room.
            let mut ticks = 0u32;
            while sink.room().is_none() {
                tokio::time::sleep(Duration::from_millis(5)).await;
                ticks += 1;
                assert!(ticks < 2000, "the queue never filled");
            }
            // The thread is free: another task of this runtime runs, many times over.
            for _ in 0..20 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(!recorder.is_finished(), "the recorder must be held");
            assert!(
                w.queued_bytes() <= bound + 1000,
                "{} queued",
                w.queued_bytes()
            );
            // The disk comes back.
            let reader = std::thread::spawn({
                let fifo = fifo.clone();
                move || {
                    let mut got = vec![0u8; lines * 1000];
                    File::open(&fifo).unwrap().read_exact(&mut got).unwrap();
                    got
                }
            });
            tokio::time::timeout(Duration::from_secs(60), recorder)
                .await
                .expect("the recorder ends once the disk moves")
                .unwrap();
            reader
        });
        w.flush();
        let got = handed.join().unwrap();
        for (i, line) in got.chunks(1000).enumerate() {
            assert_eq!(&line[..7], format!("{i:07}").as_bytes());
        }
        let (waits, waited) = w.room_waits();
        assert!(waits >= 1, "the waits are counted");
        assert!(waited > Duration::ZERO);
        assert_eq!(w.lost_lines(), 0);
    }

    #[test]
    fn parse_edge_cases() {
        assert_eq!(parse_trace_full(b"").records.len(), 0);
        assert!(parse_trace_full(b"").skipped.is_empty());
        assert_eq!(parse_trace_full(b"{\"se").skipped, [1]);
        let line = record(5).to_json_line();
        let t = parse_trace_full(format!("{line}\nnot json\n\n{line}\n").as_bytes());
        assert_eq!(t.records.len(), 2);
        assert_eq!(t.skipped, [2]);
    }
}
