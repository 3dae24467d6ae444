//! A real `redis-server` on a loopback port, for the tests of the fleet-wide rate
//! limiter. The binary comes from the system (`apt-get install redis-server`; `.ci/run`
//! installs it); nothing is persisted and the process is killed on drop.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

/// A `redis-server` child process listening on `127.0.0.1:<port>`.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts `redis-server` on a free loopback port and waits until it answers `PING`.
    ///
    /// Fails with a message naming the package when the binary is not installed.
    pub fn start() -> io::Result<Self> {
        let mut last = None;
        // A free port is found by binding and releasing it; another process may take it in
        // between, so a start that does not come up is tried again on a new port.
        for _ in 0..3 {
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
                .local_addr()?
                .port();
            match RedisServer::start_on(port) {
                Ok(server) => return Ok(server),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("redis-server did not start")))
    }

    /// Starts `redis-server` on `port` (for example the port of a server that was killed,
    /// to bring "the same" Redis back).
    pub fn start_on(port: u16) -> io::Result<Self> {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
            ])
            .arg("--dir")
            .arg(std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => io::Error::new(
                    io::ErrorKind::NotFound,
                    "redis-server is not installed; install it with `apt-get install \
                     redis-server` (bash .ci/run does)",
                ),
                _ => e,
            })?;
        let mut server = RedisServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if server.ping().is_ok() {
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "redis-server exited at start ({status}); port {port} may be taken"
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "redis-server on port {port} did not answer PING within 10 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Sends one command (inline protocol) and returns the raw reply, for assertions.
    pub fn command(&self, words: &[&str]) -> io::Result<String> {
        let mut tcp = TcpStream::connect_timeout(&self.addr(), Duration::from_secs(2))?;
        tcp.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut request = format!("*{}\r\n", words.len());
        for w in words {
            request.push_str(&format!("${}\r\n{w}\r\n", w.len()));
        }
        tcp.write_all(request.as_bytes())?;
        let mut buf = [0u8; 4096];
        let n = tcp.read(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    fn ping(&self) -> io::Result<()> {
        let reply = self.command(&["PING"])?;
        if reply.starts_with("+PONG") {
            Ok(())
        } else {
            Err(io::Error::other(format!("PING answered {reply:?}")))
        }
    }

    /// Kills the server (SIGKILL: no shutdown, like a crashed or partitioned Redis) and
    /// waits for it to exit.
    pub fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
