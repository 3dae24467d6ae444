//! A fake `frpc` for tests of the `prime` tunnel backend (see `intercept_test::prime`).
//!
//! `fake-frpc -c <config.toml>` reads the generated config (`serverAddr`, `serverPort`,
//! `user`, `auth.token`, `metadatas.binding_secret`, `localIP`, `localPort`), opens a
//! loopback port that forwards every connection to `localIP:localPort`, "logs in" with
//! `POST /_fake/frpc/login` to `serverAddr:serverPort` (the mock Prime API, which plays
//! frps) and acts out the mode it answers: frp-style log lines on stdout/stderr
//! (some wrapped in ANSI colours, as frpc prints them), then forwarding (success), staying
//! up silently (gone, rejected, proxy-refused, hang) or exiting with code 1 (exit).
//! `fake-frpc --version` prints `0.66.0`. It exits on its own after 10 minutes at most.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use tokio::time::Instant;

const MAX_LIFETIME: Duration = Duration::from_secs(600);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--version" || a == "-v") {
        println!("0.66.0");
        return ExitCode::SUCCESS;
    }
    let Some(path) = args
        .iter()
        .position(|a| a == "-c")
        .and_then(|i| args.get(i + 1))
    else {
        eprintln!("usage: fake-frpc -c <config.toml>");
        return ExitCode::from(2);
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            log(
                'E',
                "client/service.go:94",
                &format!("read config {path}: {e}"),
            );
            return ExitCode::from(1);
        }
    };
    let cfg = parse(&text);
    let get = |k: &str| cfg.get(k).cloned().unwrap_or_default();
    let id = get("user");
    let local = format!("{}:{}", get("localIP"), get("localPort"));
    let server = format!("{}:{}", get("serverAddr"), get("serverPort"));

    let data = match TcpListener::bind("127.0.0.1:0") {
        Ok(l) => l,
        Err(e) => {
            log('E', "client/service.go:120", &format!("bind: {e}"));
            return ExitCode::from(1);
        }
    };
    let data_port = data.local_addr().map(|a| a.port()).unwrap_or(0);
    log(
        'I',
        "client/service.go:295",
        &format!("[{id}] try to connect to server..."),
    );
    let body = format!(
        "{{\"tunnel_id\":{},\"token\":{},\"binding_secret\":{},\"port\":{data_port},\"pid\":{}}}",
        json_str(&id),
        json_str(&get("auth.token")),
        json_str(&get("metadatas.binding_secret")),
        std::process::id()
    );
    let mode = match post(&server, "/_fake/frpc/login", &body, Duration::from_secs(10)) {
        Ok(v) => v
            .get("mode")
            .and_then(|m| m.as_str())
            .unwrap_or("hang")
            .to_string(),
        Err(e) => {
            log(
                'W',
                "client/service.go:301",
                &format!("connect to server error: dial tcp {server}: {e}"),
            );
            return ExitCode::from(1);
        }
    };
    match mode.as_str() {
        "success" => {
            log(
                'I',
                "client/service.go:317",
                &format!("[{id}] login to server success, get run id [{id}]"),
            );
            log(
                'I',
                "proxy/proxy_manager.go:173",
                &format!("[{id}] proxy added: [{id}]"),
            );
            log(
                'I',
                "client/control.go:168",
                &format!("[{id}] [{id}] start proxy success"),
            );
            // Like frpc when the service drops the tunnel: report it, keep running.
            let wait_body = format!("{{\"tunnel_id\":{}}}", json_str(&id));
            let wait_server = server.clone();
            let wait_id = id.clone();
            std::thread::spawn(move || {
                if let Ok(v) = post(&wait_server, "/_fake/frpc/wait", &wait_body, MAX_LIFETIME) {
                    if v.get("event").and_then(|e| e.as_str()) == Some("gone") {
                        log(
                            'W',
                            "client/service.go:301",
                            &format!("[{wait_id}] connect to server error: tunnel not registered"),
                        );
                    }
                }
            });
            forward(data, &local);
            ExitCode::SUCCESS
        }
        "gone" => {
            log(
                'W',
                "client/control.go:172",
                &format!("[{id}] [{id}] start error: tunnel is inactive"),
            );
            idle()
        }
        "rejected" => {
            log(
                'W',
                "client/service.go:301",
                "connect to server error: invalid authentication token",
            );
            idle()
        }
        "proxy-refused" => {
            log(
                'W',
                "client/control.go:172",
                &format!("[{id}] [{id}] start error: proxy [{id}] already exists"),
            );
            idle()
        }
        "exit" => {
            eprintln!("fake frpc: giving up");
            log(
                'E',
                "client/service.go:140",
                &format!("[{id}] fatal: scripted exit"),
            );
            ExitCode::from(1)
        }
        _ => {
            log('I', "client/service.go:295", &format!("[{id}] waiting..."));
            idle()
        }
    }
}

/// Prints a frp-style log line; warnings and errors in ANSI colours, on stderr.
fn log(level: char, caller: &str, msg: &str) {
    let line = format!("2026-01-01 12:00:00.000 [{level}] [{caller}] {msg}");
    match level {
        'E' => eprintln!("\u{1b}[1;31m{line}\u{1b}[0m"),
        'W' => println!("\u{1b}[1;33m{line}\u{1b}[0m"),
        _ => println!("{line}"),
    }
    let _ = std::io::stdout().flush();
}

fn idle() -> ExitCode {
    std::thread::sleep(MAX_LIFETIME);
    ExitCode::SUCCESS
}

/// Forwards each accepted connection to `local` until the lifetime runs out.
fn forward(listener: TcpListener, local: &str) {
    let started = Instant::now();
    let _ = listener.set_nonblocking(false);
    for inbound in listener.incoming() {
        if started.elapsed() > MAX_LIFETIME {
            break;
        }
        let Ok(inbound) = inbound else { continue };
        let Ok(outbound) = TcpStream::connect(local) else {
            continue;
        };
        pipe(inbound, outbound);
    }
}

fn pipe(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    std::thread::spawn(move || copy(a, b2));
    std::thread::spawn(move || copy(b, a2));
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

/// POSTs JSON over a fresh connection; returns the JSON answer.
fn post(
    server: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    let mut s = TcpStream::connect(server).map_err(|e| e.to_string())?;
    let _ = s.set_read_timeout(Some(timeout));
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {server}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).map_err(|e| e.to_string())?;
    let json = resp.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(json).map_err(|e| format!("{e}: {resp}"))
}

fn json_str(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// A tiny TOML subset: `key = value` lines (dotted keys kept as written), basic strings
/// unescaped, section headers ignored.
fn parse(text: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('[') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim();
        let value = if let Some(inner) = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
            unescape(inner)
        } else {
            v.to_string()
        };
        out.insert(k.trim().to_string(), value);
    }
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('"') => out.push('"'),
            Some('\\') => out.push('\\'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                if let Some(c) = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                    out.push(c);
                }
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_generated_shape() {
        let cfg = parse(
            "serverAddr = \"127.0.0.1\"\nserverPort = 7000\nauth.token = \"a\\\"b\\\\c\\n\\u0001\"\n\n[[proxies]]\nlocalPort = 8080\n",
        );
        assert_eq!(cfg["serverAddr"], "127.0.0.1");
        assert_eq!(cfg["serverPort"], "7000");
        assert_eq!(cfg["auth.token"], "a\"b\\c\n\u{1}");
        assert_eq!(cfg["localPort"], "8080");
        assert_eq!(json_str("x\"y"), "\"x\\\"y\"");
    }
}
