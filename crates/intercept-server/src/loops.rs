//! The server's event loops: threads that each run a single-threaded tokio runtime, and
//! the listening sockets they accept on.
//!
//! A server runs one loop per core it may use (`ServerConfig::workers`). Each loop has a
//! listener of its own on the server's port (`SO_REUSEPORT`: the kernel spreads new
//! connections over them), so a connection is accepted, served and closed on one loop,
//! and a call in flight never changes thread: no work stealing, no wake of another core,
//! no lock on anything a loop owns alone (its upstream connections, its caches).
//!
//! The loops are shared by the servers of a process that ask for as many ([`group`]):
//! a pool of servers runs on one set of threads, each thread serving every server's
//! listener. A group lives while a server uses it (a running server holds it, and so do
//! its calls); its threads end when the last user lets go.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

/// The loops a server may run on when it does not say (`workers = 0`): one per core the
/// process may use (its affinity mask honoured), at least one.
pub(crate) fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A set of event loops: threads, each running a single-threaded tokio runtime until the
/// set is dropped.
pub(crate) struct Loops {
    handles: Vec<Handle>,
    /// Cancelled when the set is dropped: each thread's runtime then ends, dropping the
    /// tasks left on it.
    stop: CancellationToken,
}

impl std::fmt::Debug for Loops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loops")
            .field("loops", &self.handles.len())
            .finish()
    }
}

impl Loops {
    /// Starts `n` loops (threads `intercept-w<i>`).
    fn start(n: usize) -> io::Result<Self> {
        let stop = CancellationToken::new();
        let mut handles = Vec::with_capacity(n);
        for i in 0..n {
            let started = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .and_then(|rt| {
                    let handle = rt.handle().clone();
                    let stop = stop.clone();
                    std::thread::Builder::new()
                        .name(format!("intercept-w{i}"))
                        .spawn(move || rt.block_on(stop.cancelled()))
                        .map(|_| handle)
                });
            match started {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    // The loops already started end.
                    stop.cancel();
                    return Err(e);
                }
            }
        }
        Ok(Loops { handles, stop })
    }

    /// The loops' runtimes, in order.
    pub(crate) fn handles(&self) -> &[Handle] {
        &self.handles
    }
}

impl Drop for Loops {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The process's set of `n` loops: the one servers already run on, or a new one.
pub(crate) fn group(n: usize) -> io::Result<Arc<Loops>> {
    static GROUPS: OnceLock<Mutex<HashMap<usize, Weak<Loops>>>> = OnceLock::new();
    let mut groups = GROUPS.get_or_init(Default::default).lock();
    if let Some(loops) = groups.get(&n).and_then(Weak::upgrade) {
        return Ok(loops);
    }
    groups.retain(|_, l| l.strong_count() > 0);
    let loops = Arc::new(Loops::start(n)?);
    groups.insert(n, Arc::downgrade(&loops));
    Ok(loops)
}

/// The listening sockets of `n` loops on `addr`: `n` sockets of one `SO_REUSEPORT` group
/// where the platform has it (the kernel spreads connections over them), else one socket
/// shared by every loop. One socket when `n` is 1.
///
/// An address whose port is taken (by another process too, even one that set
/// `SO_REUSEPORT`) fails as a plain bind would: the port is first bound without it.
pub(crate) fn listen(addr: SocketAddr, n: usize) -> io::Result<Vec<std::net::TcpListener>> {
    #[cfg(all(
        unix,
        not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))
    ))]
    if n > 1 {
        return reuseport_group(addr, n);
    }
    let one = socket(addr, false)?;
    share(one, n)
}

/// `listener` for `n` loops: itself, and `n - 1` handles of the same socket (each loop
/// registers its own; a new connection wakes them and one accepts it).
pub(crate) fn share(
    listener: std::net::TcpListener,
    n: usize,
) -> io::Result<Vec<std::net::TcpListener>> {
    listener.set_nonblocking(true)?;
    let mut all = Vec::with_capacity(n.max(1));
    for _ in 1..n {
        all.push(listener.try_clone()?);
    }
    all.push(listener);
    Ok(all)
}

#[cfg(all(
    unix,
    not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))
))]
fn reuseport_group(addr: SocketAddr, n: usize) -> io::Result<Vec<std::net::TcpListener>> {
    // A port named by the caller is checked free first: a socket with SO_REUSEPORT would
    // join another process's group on it instead of failing.
    if addr.port() != 0 {
        drop(socket(addr, false)?);
    }
    let first = socket(addr, true)?;
    let addr = first.local_addr()?;
    let mut all = Vec::with_capacity(n);
    all.push(first);
    for _ in 1..n {
        match socket(addr, true) {
            Ok(s) => all.push(s),
            // The group could not grow: every loop shares the first socket instead.
            Err(e) => {
                tracing::debug!(error = %e, "no SO_REUSEPORT socket per loop; the loops share one");
                let first = all.swap_remove(0);
                return share(first, n);
            }
        }
    }
    Ok(all)
}

/// A listening TCP socket on `addr` (`SO_REUSEADDR` as tokio sets it, `SO_REUSEPORT`
/// with `reuse_port`), non-blocking, with tokio's backlog.
fn socket(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    #[cfg(unix)]
    socket.set_reuse_address(true)?;
    #[cfg(all(
        unix,
        not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))
    ))]
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    #[cfg(not(all(
        unix,
        not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))
    )))]
    let _ = reuse_port;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_listen_on_one_port_and_a_taken_port_is_refused() {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let two = listen(any, 2).expect("two listeners");
        assert_eq!(two.len(), 2);
        let port = two[0].local_addr().expect("addr").port();
        assert!(two
            .iter()
            .all(|l| l.local_addr().expect("addr").port() == port));
        // Another server asking for that port fails, whether or not it asks for
        // SO_REUSEPORT itself, as a plain bind would.
        let taken = SocketAddr::from(([127, 0, 0, 1], port));
        for n in [1, 2] {
            let err = listen(taken, n).expect_err("the port is taken");
            assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");
        }
        // Every socket accepts: a connection to the port lands on one of them.
        let client = std::net::TcpStream::connect(taken).expect("connect");
        let accepted = (0..2000).find_map(|_| {
            let got = two.iter().find_map(|l| l.accept().ok());
            if got.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            got
        });
        let (stream, peer) = accepted.expect("one of the loops' sockets accepts");
        assert_eq!(peer, client.local_addr().expect("addr"));
        drop(stream);
    }

    #[test]
    fn a_shared_listener_is_handed_to_every_loop() {
        let one = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = one.local_addr().expect("addr");
        let all = share(one, 3).expect("shared");
        assert_eq!(all.len(), 3);
        assert!(all.iter().all(|l| l.local_addr().expect("addr") == addr));
    }

    #[test]
    fn servers_asking_for_as_many_loops_share_them_while_they_live() {
        let a = group(3).expect("loops");
        let b = group(3).expect("loops");
        assert!(Arc::ptr_eq(&a, &b), "one set of three loops per process");
        assert_eq!(a.handles().len(), 3);
        let other = group(5).expect("loops");
        assert_eq!(other.handles().len(), 5);
        // Each loop runs tasks on a thread of its own.
        let names: Vec<String> = a
            .handles()
            .iter()
            .map(|h| {
                let (tx, rx) = std::sync::mpsc::channel();
                h.spawn(async move {
                    let _ = tx.send(std::thread::current().name().map(str::to_owned));
                });
                rx.recv()
                    .expect("the loop runs the task")
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(names, ["intercept-w0", "intercept-w1", "intercept-w2"]);
        let weak = Arc::downgrade(&a);
        drop((a, b));
        assert!(
            weak.upgrade().is_none(),
            "the loops end with their last user"
        );
    }
}
