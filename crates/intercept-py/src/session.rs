//! `intercept.Session`'s native half: a [`RolloutSession`] plus the Python hooks.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use pyo3::prelude::*;

use intercept_core::{
    CallInfo, CallRecord, Error, Generated, HookAction, JsonBody, RolloutSession, Sampling,
    Session, SessionConfig, Upstream,
};

use crate::errors::{invalid, to_py};
use crate::hooks::{self, Hook, Outcome};
use crate::record_hook::RecordHook;
use crate::state_hook::StateHook;

/// The session the server sees: a [`RolloutSession`] whose request and response hooks
/// are Python callables.
pub(crate) struct PySession {
    pub(crate) inner: RolloutSession,
    on_request: Option<Hook>,
    on_response: Option<Hook>,
    /// The event loop hooks run on (the one that acquired the session).
    event_loop: Mutex<Option<Py<PyAny>>>,
    /// Told of each finished call (`set_record_hook`).
    on_record: Mutex<Option<Arc<RecordHook>>>,
    /// Owns the `/state` document instead of the session (`set_state_hook`).
    state_hook: Mutex<Option<Arc<StateHook>>>,
    /// Answers `POST /tool` instead of the default protocol (`set_tool_hook`).
    tool_hook: Mutex<Option<Arc<Hook>>>,
    /// The whole `GET /task` answer instead of the default (`set_task_body`).
    task_body: Mutex<Option<serde_json::Value>>,
    /// The request headers the hooks see (`set_hook_headers`).
    hook_headers: OnceLock<Vec<String>>,
    /// Answers the model calls instead of the upstream (`set_generate_hook`).
    generate_hook: Mutex<Option<Arc<GenerateHook>>>,
    /// Whether a generate hook was set: the session generates its answers, also after
    /// release has let go of the hook (a call then gets 409).
    generating: AtomicBool,
}

/// A generate hook and the event loop it runs on.
struct GenerateHook {
    hook: Hook,
    event_loop: Py<PyAny>,
}

impl fmt::Debug for PySession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PySession")
            .field("inner", &self.inner)
            .field("on_request", &self.on_request.is_some())
            .field("on_response", &self.on_response.is_some())
            .field("generates", &self.generating.load(Ordering::Relaxed))
            .finish()
    }
}

impl PySession {
    fn event_loop(&self) -> Option<Py<PyAny>> {
        let guard = self.event_loop.lock();
        guard
            .as_ref()
            .and_then(|l| crate::bridge::with_python(|py| l.clone_ref(py)))
    }
}

#[async_trait]
impl Session for PySession {
    fn id(&self) -> &str {
        self.inner.id()
    }

    fn model(&self) -> &str {
        self.inner.model()
    }

    fn sampling(&self) -> Sampling {
        self.inner.sampling()
    }

    fn upstream(&self) -> &Upstream {
        self.inner.upstream()
    }

    fn capture_tokens(&self) -> bool {
        self.inner.capture_tokens()
    }

    fn tokens(&self) -> Option<&intercept_core::TokensConfig> {
        self.inner.tokens()
    }

    fn check(&self) -> Result<(), intercept_core::StopReason> {
        self.inner.check()
    }

    fn hook_headers(&self) -> &[String] {
        self.hook_headers.get().map_or(&[], Vec::as_slice)
    }

    async fn on_request(&self, call: &CallInfo, body: &mut JsonBody) -> Result<HookAction, Error> {
        let Some(hook) = &self.on_request else {
            return Ok(HookAction::Continue);
        };
        let original = body.to_value();
        let outcome = hooks::run(
            hook,
            "on_request",
            self.event_loop().as_ref(),
            body.to_bytes(),
            &original,
            call,
            self.id(),
        )
        .await?;
        match outcome {
            Outcome::Unchanged => Ok(HookAction::Continue),
            Outcome::Stop(reason) => Ok(HookAction::Stop(reason)),
            Outcome::Replace(value) => {
                let bytes = serde_json::to_vec(&value)
                    .map_err(|e| Error::HookFailed(format!("on_request: {e}")))?;
                *body = JsonBody::parse(Bytes::from(bytes))?;
                Ok(HookAction::Continue)
            }
        }
    }

    fn inspects_responses(&self) -> bool {
        self.on_response.is_some()
    }

    async fn on_response(
        &self,
        call: &CallInfo,
        response: &mut serde_json::Value,
    ) -> Result<HookAction, Error> {
        let Some(hook) = &self.on_response else {
            return Ok(HookAction::Continue);
        };
        let payload = serde_json::to_vec(response)
            .map_err(|e| Error::HookFailed(format!("on_response: {e}")))?;
        let outcome = hooks::run(
            hook,
            "on_response",
            self.event_loop().as_ref(),
            Bytes::from(payload),
            response,
            call,
            self.id(),
        )
        .await?;
        match outcome {
            Outcome::Unchanged => Ok(HookAction::Continue),
            Outcome::Stop(reason) => Ok(HookAction::Stop(reason)),
            Outcome::Replace(value) => {
                *response = value;
                Ok(HookAction::Continue)
            }
        }
    }

    fn generates(&self) -> bool {
        self.generating.load(Ordering::Acquire)
    }

    async fn generate(&self, call: &CallInfo, body: &JsonBody) -> Result<Generated, Error> {
        // Cloned out first: the lock is never held while waiting for the GIL.
        let hook = self.generate_hook.lock().clone();
        let Some(hook) = hook else {
            return Err(Error::RolloutConcluded);
        };
        hooks::run_generate(
            &hook.hook,
            &hook.event_loop,
            body.to_bytes(),
            call,
            self.id(),
        )
        .await
    }

    fn record(&self, record: CallRecord) {
        // Cloned out first: the lock is never held while waiting for the GIL.
        let on_record = self.on_record.lock().clone();
        if let Some(hook) = on_record {
            hook.deliver(&record);
        }
        self.inner.record(record);
    }

    fn room_to_record(&self) -> Option<intercept_core::RecordWait> {
        self.inner.room_to_record()
    }

    fn stop_reason(&self) -> Option<intercept_core::StopReason> {
        self.inner.stop_reason()
    }

    fn stop_with(&self, reason: intercept_core::StopReason) {
        self.inner.stop_with(reason);
    }

    fn state(&self) -> serde_json::Value {
        let hook = self.state_hook.lock().clone();
        match hook {
            Some(hook) => hook.state(),
            None => self.inner.state(),
        }
    }

    fn set_state(&self, state: serde_json::Value) -> Result<(), Error> {
        let hook = self.state_hook.lock().clone();
        match hook {
            Some(hook) => hook.set_state(&state),
            None => self.inner.set_state(state),
        }
    }

    fn task(&self) -> Option<serde_json::Value> {
        self.inner.task()
    }

    fn task_body(&self) -> Result<serde_json::Value, Error> {
        let body = self.task_body.lock().clone();
        match body {
            Some(body) => Ok(body),
            None => self.inner.task_body(),
        }
    }

    async fn tool(&self, body: &[u8]) -> Result<serde_json::Value, Error> {
        let hook = self.tool_hook.lock().clone();
        let Some(hook) = hook else {
            return intercept_core::tool_by_phase(self, body).await;
        };
        if let Err(e) = serde_json::from_slice::<serde_json::Value>(body) {
            return Err(Error::invalid(format!("the body is not JSON: {e}")));
        }
        hooks::run_tool(
            &hook,
            self.event_loop().as_ref(),
            Bytes::copy_from_slice(body),
            self.id(),
        )
        .await
    }

    fn on_replay(&self) {
        self.inner.on_replay();
    }

    fn on_release(&self) {
        self.inner.on_release();
        // Hooks never run after release: let go of the loop.
        let released = self.event_loop.lock().take();
        drop(released);
        let on_record = self.on_record.lock().take();
        drop(on_record);
        let state_hook = self.state_hook.lock().take();
        drop(state_hook);
        let tool_hook = self.tool_hook.lock().take();
        drop(tool_hook);
        let generate_hook = self.generate_hook.lock().take();
        drop(generate_hook);
    }
}

/// The native half of `intercept.Session` (see `python/intercept/_session.py`).
#[pyclass(frozen, module = "intercept._native")]
pub(crate) struct NativeSession {
    pub(crate) inner: Arc<PySession>,
}

#[pymethods]
impl NativeSession {
    /// `config_json` is a `SessionConfig` (id, model, sampling, upstream, limits, task,
    /// tokens).
    #[new]
    #[pyo3(signature = (config_json, capture_tokens, on_request, request_takes_call, on_response, response_takes_call))]
    fn new(
        config_json: &str,
        capture_tokens: bool,
        on_request: Option<Py<PyAny>>,
        request_takes_call: bool,
        on_response: Option<Py<PyAny>>,
        response_takes_call: bool,
    ) -> PyResult<Self> {
        let config: SessionConfig =
            serde_json::from_str(config_json).map_err(|e| invalid(format!("session: {e}")))?;
        if config.id.is_empty() {
            return Err(invalid("session: `id` must not be empty"));
        }
        if config.model.trim().is_empty() {
            return Err(invalid("session: `model` must not be empty"));
        }
        for url in config.upstream.engines() {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(invalid(format!(
                    "session: upstream {url:?} must be an http:// or https:// URL such as \
                     http://127.0.0.1:8000/v1"
                )));
            }
        }
        let inner = RolloutSession::new(config).with_capture_tokens(capture_tokens);
        Ok(NativeSession {
            inner: Arc::new(PySession {
                inner,
                on_request: on_request.map(|func| Hook {
                    func,
                    with_call: request_takes_call,
                }),
                on_response: on_response.map(|func| Hook {
                    func,
                    with_call: response_takes_call,
                }),
                event_loop: Mutex::new(None),
                on_record: Mutex::new(None),
                state_hook: Mutex::new(None),
                tool_hook: Mutex::new(None),
                task_body: Mutex::new(None),
                hook_headers: OnceLock::new(),
                generate_hook: Mutex::new(None),
                generating: AtomicBool::new(false),
            }),
        })
    }

    /// The rollout id.
    #[getter]
    fn id(&self) -> String {
        self.inner.id().to_owned()
    }

    /// Sets the event loop hooks run on.
    fn bind_loop(&self, event_loop: Py<PyAny>) {
        *self.inner.event_loop.lock() = Some(event_loop);
    }

    /// Has `hook(payload)` scheduled on `event_loop` for each finished call (see
    /// `record_hook.rs`); `None` removes it.
    #[pyo3(signature = (hook, event_loop))]
    fn set_record_hook(&self, hook: Option<Py<PyAny>>, event_loop: Py<PyAny>) {
        let new = hook.map(|func| Arc::new(RecordHook::new(func, event_loop)));
        let old = std::mem::replace(&mut *self.inner.on_record.lock(), new);
        drop(old);
    }

    /// Has `get()` and `put(body)` own the `/state` document (see `state_hook.rs`).
    fn set_state_hook(&self, get: Py<PyAny>, put: Py<PyAny>) {
        let new = Some(Arc::new(StateHook::new(get, put)));
        let old = std::mem::replace(&mut *self.inner.state_hook.lock(), new);
        drop(old);
    }

    /// Has `hook(body)` (sync or async, run on the session's event loop) answer
    /// `POST /tool`: it gets the request's JSON body and returns the answer, a dict; it
    /// raises `InvalidRequestError` for a 400, `RolloutConcludedError` for a 409. `None`
    /// restores intercept's `{phase, message}` protocol.
    #[pyo3(signature = (hook))]
    fn set_tool_hook(&self, hook: Option<Py<PyAny>>) {
        let new = hook.map(|func| {
            Arc::new(Hook {
                func,
                with_call: false,
            })
        });
        let old = std::mem::replace(&mut *self.inner.tool_hook.lock(), new);
        drop(old);
    }

    /// Has `hook(body, call)` (async, run on `event_loop`) answer the session's model calls
    /// instead of the upstream: it gets the request body as it would have gone upstream
    /// (after `on_request`) and the call's `CallInfo`, and returns `{"response": dict,
    /// "tokens": {"prompt_ids", "completion_ids", "logprobs", "path", "reason"} | None}`,
    /// the dialect's complete JSON response and the ids that went to and came from the
    /// engine (`path`: `"bridged"` or `"rendered"`). The server serves the response (a
    /// streamed call gets the dialect's stream made from it) and records the tokens.
    /// `InvalidRequestError` answers 400, an exception with an integer `status_code`
    /// that status, any other 502; dropping the call cancels the hook. Set before the
    /// session is acquired; `None` has the calls relayed to the upstream again.
    #[pyo3(signature = (hook, event_loop))]
    fn set_generate_hook(&self, hook: Option<Py<PyAny>>, event_loop: Py<PyAny>) {
        let new = hook.map(|func| {
            Arc::new(GenerateHook {
                hook: Hook {
                    func,
                    with_call: true,
                },
                event_loop,
            })
        });
        let generating = new.is_some();
        let old = std::mem::replace(&mut *self.inner.generate_hook.lock(), new);
        self.inner.generating.store(generating, Ordering::Release);
        drop(old);
    }

    /// Makes `body_json` (a JSON object) the whole `GET /task` answer.
    fn set_task_body(&self, body_json: &str) -> PyResult<()> {
        let body: serde_json::Value = serde_json::from_str(body_json)
            .map_err(|e| invalid(format!("task body: not JSON: {e}")))?;
        if !body.is_object() {
            return Err(invalid("task body: must be a JSON object"));
        }
        *self.inner.task_body.lock() = Some(body);
        Ok(())
    }

    /// Has the request headers `names` reach the hooks (`CallInfo.headers`) instead of
    /// the upstream. Set once, before the session is acquired; credentials
    /// (`authorization`, `x-api-key`, ...) are refused.
    fn set_hook_headers(&self, names: Vec<String>) -> PyResult<()> {
        let mut lower = Vec::with_capacity(names.len());
        for name in names {
            let name = name.to_ascii_lowercase();
            if intercept_core::SECRET_HEADERS.contains(&name.as_str()) {
                return Err(invalid(format!(
                    "hook headers: {name:?} carries a secret and never reaches a hook"
                )));
            }
            let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            if name.is_empty() || !name.bytes().all(token) {
                return Err(invalid(format!(
                    "hook headers: {name:?} is not a header name"
                )));
            }
            lower.push(name);
        }
        self.inner
            .hook_headers
            .set(lower)
            .map_err(|_| invalid("hook headers: already set for this session"))
    }

    /// The trace as JSON (`{"id", "stop_condition", "calls", "replays"}`).
    fn trace_json(&self, py: Python<'_>) -> PyResult<String> {
        let inner = self.inner.clone();
        py.detach(move || serde_json::to_string(&inner.inner.trace()))
            .map_err(|e| to_py(&Error::Internal(format!("trace not serialisable: {e}"))))
    }

    /// The trace log so far (see `docs/traces.md`), read: records are rebuilt from it
    /// one at a time when asked for.
    fn log(&self, py: Python<'_>) -> PyResult<crate::log::NativeLog> {
        let inner = self.inner.clone();
        py.detach(move || crate::log::NativeLog::new(&inner.inner.log()))
    }

    /// The episode (message graph) as JSON.
    fn episode_json(&self, py: Python<'_>) -> PyResult<String> {
        let inner = self.inner.clone();
        py.detach(move || serde_json::to_string(&inner.inner.episode()))
            .map_err(|e| to_py(&Error::Internal(format!("episode not serialisable: {e}"))))
    }

    /// SDK retries answered without an upstream call.
    fn replays(&self) -> u64 {
        self.inner.inner.replays()
    }

    /// Recorded calls.
    fn calls(&self) -> usize {
        self.inner.inner.calls()
    }

    /// `active`, `stopped` or `released`.
    fn status(&self) -> &'static str {
        self.inner.inner.status().as_str()
    }

    /// Why the rollout stopped, if it did.
    fn stop_condition(&self) -> Option<String> {
        self.inner.inner.stop_condition()
    }

    /// Stops the rollout (the first condition wins): later calls get 400.
    fn stop(&self, reason: &str) {
        self.inner.inner.stop(reason);
    }

    /// Turn and token totals as JSON.
    fn totals_json(&self) -> String {
        serde_json::to_string(&self.inner.inner.totals()).unwrap_or_else(|_| "{}".into())
    }

    /// The `/state` document as JSON.
    fn state_json(&self) -> String {
        self.inner.inner.state().to_string()
    }

    /// The session's token-in/token-out setting as JSON (`null` when off).
    fn tokens_json(&self) -> String {
        serde_json::to_string(&Session::tokens(&*self.inner)).unwrap_or_else(|_| "null".into())
    }
}
