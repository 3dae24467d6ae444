//! The control API of an in-process sidecar, as the tests call it: [`Api`] (requests with
//! the sidecar's token, calls through a session's `env`) and [`error_of`].

use http::{Method, StatusCode};
use intercept_cli::sidecar::Sidecar;
use intercept_mock::harness::{HttpClient, HttpResponse};
use serde_json::Value;

/// A client of one sidecar's control API.
#[derive(Clone)]
pub struct Api {
    pub client: HttpClient,
    pub url: String,
    pub token: String,
}

impl Api {
    pub fn new(sidecar: &Sidecar) -> Self {
        Api {
            client: HttpClient::new(),
            url: sidecar.control_url(),
            token: sidecar.token().expose().to_owned(),
        }
    }

    /// `method path` with the token, and `body` as JSON.
    pub async fn req(&self, method: Method, path: &str, body: Option<Value>) -> HttpResponse {
        self.client
            .send(
                method,
                &format!("{}{path}", self.url),
                Some(&self.token),
                body.as_ref(),
            )
            .await
            .unwrap()
    }

    /// `method path` answered 200, its JSON.
    pub async fn json(&self, method: Method, path: &str) -> Value {
        let resp = self.req(method, path, None).await;
        assert_eq!(resp.status, StatusCode::OK, "{path}");
        resp.json().unwrap()
    }

    /// A session created (201) from `body`: its JSON.
    pub async fn create(&self, body: Option<Value>) -> Value {
        let resp = self.req(Method::POST, "/v1/sessions", body).await;
        assert_eq!(
            resp.status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&resp.body)
        );
        resp.json().unwrap()
    }

    /// A chat call through a session's `env`.
    pub async fn chat(&self, env: &Value, text: &str) -> HttpResponse {
        self.try_chat(env, text).await.unwrap()
    }

    /// A chat call through a session's `env`; an error when its URL cannot be reached.
    pub async fn try_chat(&self, env: &Value, text: &str) -> anyhow::Result<HttpResponse> {
        super::try_chat(&self.client, env, text).await
    }

    /// `GET /metrics`, as text.
    pub async fn metrics(&self) -> String {
        let resp = self.req(Method::GET, "/metrics", None).await;
        assert_eq!(resp.status, StatusCode::OK);
        String::from_utf8(resp.body.to_vec()).unwrap()
    }

    /// The value of the metric `name` (a line `name value`).
    pub async fn metric(&self, name: &str) -> u64 {
        let text = self.metrics().await;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// A session's `endpoint_lost` field.
    pub async fn endpoint_lost(&self, id: &str) -> Value {
        let status = self.json(Method::GET, &format!("/v1/sessions/{id}")).await;
        status["endpoint_lost"].clone()
    }
}

/// Asserts the error shape (`status`, `error.type` = `kind`) and returns the message.
pub fn error_of(resp: &HttpResponse, status: StatusCode, kind: &str) -> String {
    assert_eq!(
        resp.status,
        status,
        "{}",
        String::from_utf8_lossy(&resp.body)
    );
    let body = resp.json().unwrap();
    assert_eq!(body["error"]["type"], kind, "{body}");
    body["error"]["message"].as_str().unwrap().to_owned()
}
