//! Fakes shared by intercept's tests, benchmarks and demo, starting with a scriptable mock
//! model server ([`MockUpstream`]) that speaks OpenAI Chat Completions
//! (`/v1/chat/completions`), OpenAI Responses (`/v1/responses`) and Anthropic Messages
//! (`/v1/messages`, `/v1/messages/count_tokens`), the dialect chosen by the route. A
//! scripted [`Reply`] is rendered in the dialect of the route that takes it.
//!
//! ```
//! use intercept_test::{MockUpstream, Reply};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let upstream = MockUpstream::start().await?;
//! upstream.push(Reply::text("Hello!").with_finish_reason("length"));
//!
//! // Any HTTP client pointed at `upstream.base_url()` works; a raw request keeps this short.
//! let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
//! let mut tcp = tokio::net::TcpStream::connect(upstream.addr()).await?;
//! tcp.write_all(format!(
//!     "POST /v1/chat/completions HTTP/1.1\r\nhost: mock\r\nconnection: close\r\n\
//!      content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
//!     body.len(),
//! ).as_bytes()).await?;
//! let mut response = String::new();
//! tcp.read_to_string(&mut response).await?;
//! assert!(response.contains(r#""content":"Hello!""#));
//! assert!(response.contains(r#""finish_reason":"length""#));
//!
//! // Without a scripted reply the mock echoes; every request is logged.
//! assert_eq!(upstream.requests()[0].json().unwrap()["model"], "m");
//! upstream.shutdown().await;
//! # Ok(())
//! # }
//! ```

pub mod prime;
pub mod redis;
pub mod upstream;

pub use upstream::*;
