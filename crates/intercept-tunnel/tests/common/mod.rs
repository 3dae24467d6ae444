//! Helpers shared by the integration tests: a tiny hyper server and a one-shot GET.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// A local HTTP server answering `<body> <path>` to every request.
pub struct HelloServer {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HelloServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn hello_server(body: &'static str) -> HelloServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            conns.spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| async move {
                    let text = format!("{body} {}", req.uri().path());
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text))))
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    HelloServer { port, task }
}

/// GETs `url` (plain http) with a 10 s bound; returns the status and body.
pub async fn get(url: &str) -> Result<(u16, String), String> {
    let fut = async {
        let uri: hyper::Uri = url.parse().map_err(|e| format!("{e}"))?;
        let host = uri
            .host()
            .ok_or("no host")?
            .trim_matches(['[', ']'])
            .to_string();
        let port = uri.port_u16().unwrap_or(80);
        let stream = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let driver = tokio::spawn(conn);
        let req = Request::get(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
            .header("host", format!("{host}:{port}"))
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("{e}"))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("send: {e}"))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        driver.abort();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .map_err(|_| "timed out".to_string())?
}

/// A helper executable next to this test (`target/<profile>/<sub>/<name>`). `cargo test
/// --workspace` builds it fresh; when it is missing or older than any of `sources`
/// (paths relative to the workspace root), it is built with `cargo build <build_args>`.
pub fn helper_binary(sub: &str, name: &str, build_args: &[&str], sources: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> -> target/<profile>
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let bin = profile_dir
        .join(sub)
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let fresh = modified(&bin).is_some_and(|built| {
        sources
            .iter()
            .all(|s| modified(&root.join(s)).is_none_or(|changed| changed <= built))
    });
    if !fresh {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
        let mut cmd = std::process::Command::new(cargo);
        cmd.arg("build").arg("-q").args(build_args);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cannot run cargo");
        assert!(status.success(), "building {name} failed");
    }
    assert!(bin.exists(), "{} not found", bin.display());
    bin
}
