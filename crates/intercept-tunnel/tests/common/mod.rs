//! Helpers shared by the integration tests: a tiny hyper server and a one-shot GET.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::convert::Infallible;
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
