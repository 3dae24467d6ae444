//! The hand-written client against hyper's, on generated responses.

use http::header::{self, HeaderMap};
use http::Version;

use super::*;

/// One response of the differential test, and how its bytes reach the client.
#[derive(Debug, Clone)]
struct Wire {
    interim: Vec<u16>,
    http10: bool,
    status: u16,
    headers: Vec<(String, String)>,
    connection: Option<&'static str>,
    framing: Framing,
    body: Vec<u8>,
    /// Sizes of the pieces the upstream writes (cycled).
    pieces: Vec<usize>,
    /// Bytes the pipe holds each way.
    capacity: usize,
}

#[derive(Debug, Clone)]
enum Framing {
    Length,
    /// Chunk sizes (cycled over the body), extensions, upper-case hex, trailers.
    Chunked {
        sizes: Vec<usize>,
        extension: Option<String>,
        upper: bool,
        trailers: Vec<(String, String)>,
    },
    UntilClose,
}

impl Wire {
    /// Whether the upstream keeps the connection open after this response.
    fn keeps_open(&self) -> bool {
        let persistent = match (self.http10, self.connection) {
            (_, Some("close")) => false,
            (true, Some("keep-alive")) => true,
            (http10, _) => !http10,
        };
        let no_body = matches!(self.status, 204 | 304);
        persistent && (no_body || !matches!(self.framing, Framing::UntilClose))
    }

    fn bytes(&self) -> Vec<u8> {
        let mut w = Vec::new();
        for code in &self.interim {
            w.extend_from_slice(
                format!("HTTP/1.1 {code} Interim\r\nx-interim: 1\r\n\r\n").as_bytes(),
            );
        }
        let version = if self.http10 { "1.0" } else { "1.1" };
        w.extend_from_slice(format!("HTTP/{version} {} Whatever\r\n", self.status).as_bytes());
        for (name, value) in &self.headers {
            w.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        if let Some(c) = self.connection {
            w.extend_from_slice(format!("Connection: {c}\r\n").as_bytes());
        }
        let no_body = matches!(self.status, 204 | 304);
        match &self.framing {
            Framing::Length => {
                w.extend_from_slice(
                    format!("Content-Length: {}\r\n\r\n", self.body.len()).as_bytes(),
                );
                if !no_body {
                    w.extend_from_slice(&self.body);
                }
            }
            Framing::Chunked {
                sizes,
                extension,
                upper,
                trailers,
            } => {
                w.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                if no_body {
                    return w;
                }
                let mut rest = &self.body[..];
                let mut size = sizes.iter().cycle();
                while !rest.is_empty() {
                    let n = (*size.next().unwrap_or(&1)).clamp(1, rest.len());
                    let hex = if *upper {
                        format!("{n:X}")
                    } else {
                        format!("{n:x}")
                    };
                    w.extend_from_slice(hex.as_bytes());
                    if let Some(ext) = extension {
                        w.extend_from_slice(format!(";{ext}").as_bytes());
                    }
                    w.extend_from_slice(b"\r\n");
                    w.extend_from_slice(&rest[..n]);
                    w.extend_from_slice(b"\r\n");
                    rest = &rest[n..];
                }
                w.extend_from_slice(b"0\r\n");
                for (name, value) in trailers {
                    w.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
                }
                w.extend_from_slice(b"\r\n");
            }
            Framing::UntilClose => {
                w.extend_from_slice(b"\r\n");
                if !no_body {
                    w.extend_from_slice(&self.body);
                }
            }
        }
        w
    }

    /// Plays the upstream on one end of a pipe: reads the request, writes the
    /// response in pieces, then closes or holds the connection as it said.
    async fn serve(self, mut end: tokio::io::DuplexStream) {
        if read_request(&mut end).await.is_none() {
            return;
        }
        let wire = self.bytes();
        let mut rest = &wire[..];
        let mut piece = self.pieces.iter().cycle();
        while !rest.is_empty() {
            let n = (*piece.next().unwrap_or(&1)).clamp(1, rest.len());
            if end.write_all(&rest[..n]).await.is_err() {
                return;
            }
            rest = &rest[n..];
        }
        if self.keeps_open() {
            // Held until the client lets go.
            let mut buf = [0u8; 64];
            while matches!(end.read(&mut buf).await, Ok(n) if n > 0) {}
        }
    }
}

/// What a client made of a response: status, version, headers, body, and whether
/// the connection may carry another request.
type Seen = (u16, Version, HeaderMap, Vec<u8>, bool);

async fn through_h1pool(wire: Wire) -> Seen {
    let (pool, mut ends) = piped(wire.capacity, Timeouts::default());
    let upstream = tokio::spawn(async move {
        let end = ends.recv().await.expect("a connection");
        wire.serve(end).await;
    });
    let resp = pool
        .send(chat("http://upstream:8000/v1/chat/completions", false))
        .await
        .expect("h1pool: a response");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("h1pool: the body").to_bytes();
    let reusable = idle_count(&pool) == 1;
    drop(pool);
    let _ = upstream.await;
    (
        parts.status.as_u16(),
        parts.version,
        parts.headers,
        body.to_vec(),
        reusable,
    )
}

async fn through_hyper(wire: Wire) -> Seen {
    let (ours, theirs) = tokio::io::duplex(wire.capacity);
    let upstream = tokio::spawn(wire.serve(theirs));
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(ours))
            .await
            .expect("hyper: handshake");
    let driver = tokio::spawn(conn);
    let req = Request::post("/v1/chat/completions")
        .header(header::HOST, "upstream:8000")
        .body(http_body_util::Full::new(Bytes::from_static(
            b"{\"model\":\"m\"}",
        )))
        .expect("request");
    let resp = sender.send_request(req).await.expect("hyper: a response");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("hyper: the body").to_bytes();
    let reusable = sender.ready().await.is_ok();
    drop(sender);
    let _ = driver.await;
    let _ = upstream.await;
    (
        parts.status.as_u16(),
        parts.version,
        parts.headers,
        body.to_vec(),
        reusable,
    )
}

fn token() -> impl proptest::strategy::Strategy<Value = String> {
    proptest::string::string_regex("[a-z][a-z0-9-]{0,8}").expect("regex")
}

fn wires() -> impl proptest::strategy::Strategy<Value = Wire> {
    use proptest::prelude::*;
    let chunked = (
        proptest::collection::vec(1usize..300, 1..6),
        proptest::option::of(("[a-z]{1,6}", "[a-z0-9]{0,6}").prop_map(|(k, v)| {
            if v.is_empty() {
                k
            } else {
                format!("{k}={v}")
            }
        })),
        any::<bool>(),
        proptest::collection::vec(
            (token().prop_map(|t| format!("x-t-{t}")), "[a-z0-9 ]{0,12}"),
            0..3,
        ),
    )
        .prop_map(|(sizes, extension, upper, trailers)| Framing::Chunked {
            sizes,
            extension,
            upper,
            trailers,
        });
    (
        proptest::collection::vec(prop_oneof![Just(100u16), Just(102), Just(103)], 0..3),
        prop_oneof![4 => Just(false), 1 => Just(true)],
        prop_oneof![
            Just(200u16),
            Just(201),
            Just(204),
            Just(304),
            Just(400),
            Just(404),
            Just(429),
            Just(500),
            Just(503)
        ],
        proptest::collection::vec(
            (token().prop_map(|t| format!("x-{t}")), "[ -~]{0,20}"),
            0..5,
        ),
        prop_oneof![
            Just(None),
            Just(Some("close")),
            Just(Some("keep-alive")),
            Just(Some("Keep-Alive, x-hop"))
        ],
        prop_oneof![Just(Framing::Length), chunked, Just(Framing::UntilClose)],
        proptest::collection::vec(any::<u8>(), 0..1500),
        proptest::collection::vec(1usize..200, 1..8),
        1usize..64,
    )
        .prop_map(
            |(
                interim,
                http10,
                status,
                headers,
                connection,
                mut framing,
                body,
                pieces,
                capacity,
            )| {
                // HTTP/1.0 has no transfer codings.
                if http10 && matches!(framing, Framing::Chunked { .. }) {
                    framing = Framing::Length;
                }
                let connection = match connection {
                    Some("Keep-Alive, x-hop") => Some("keep-alive"),
                    c => c,
                };
                Wire {
                    interim,
                    http10,
                    status,
                    headers: headers
                        .into_iter()
                        .map(|(n, v)| (n, v.trim().to_owned()))
                        .collect(),
                    connection,
                    framing,
                    body,
                    pieces,
                    capacity,
                }
            },
        )
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 192,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// The hand-written client reads every framing as hyper's HTTP/1 client does:
    /// the same status, version, headers and body bytes, and the same verdict on
    /// whether the connection can carry another request, however the bytes are
    /// split and however small the pipe.
    #[test]
    fn h1pool_reads_responses_as_hyper_does(wire in wires()) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (ours, theirs) = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(20),
                async { (through_h1pool(wire.clone()).await, through_hyper(wire.clone()).await) },
            )
            .await
            .expect("both clients finished")
        });
        proptest::prop_assert_eq!(&ours, &theirs);
        proptest::prop_assert_eq!(ours.4, wire.keeps_open());
        if !matches!(wire.status, 204 | 304) {
            proptest::prop_assert_eq!(&ours.3, &wire.body);
        }
    }
}
