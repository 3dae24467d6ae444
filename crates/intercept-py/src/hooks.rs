//! Python hooks (`on_request`, `on_response`, the tool hook, the generate hook) run from
//! the server's tasks.
//!
//! A hook call takes the GIL only to schedule the hook on the event loop that acquired
//! the session (`asyncio.run_coroutine_threadsafe`, through `intercept._hooks.run_hook`)
//! and is then awaited without it; the hook's outcome comes back through a one-shot
//! channel fed by [`HookDone`]. If the call is dropped first (the rollout was released
//! or the server stopped), the scheduled hook is cancelled.
//!
//! A hook that raises `intercept.InvalidRequestError` answers the call 400 with its
//! message (`intercept.RolloutConcludedError`: 409); any other exception is a 502
//! `hook_failed` naming it. A generate hook ([`run_generate`], scheduled through
//! `intercept._hooks.run_generate`) also keeps an engine's status: an exception that
//! carries an integer `status_code` of 400..=599 is an [`Error::UpstreamStatus`] with it.

use bytes::Bytes;
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyBytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::oneshot;

use intercept_core::{CallInfo, Error, Generated, TokenPath, TurnTokens};

static RUN_HOOK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static RUN_GENERATE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The function of `intercept._hooks` that schedules a hook and reports its outcome.
#[derive(Debug, Clone, Copy)]
enum Runner {
    /// `run_hook`: request, response and tool hooks.
    Hook,
    /// `run_generate`: a generate hook (its answer is `{"response", "tokens"}`; an
    /// exception's `status_code` is reported).
    Generate,
}

impl Runner {
    fn cell(self) -> (&'static PyOnceLock<Py<PyAny>>, &'static str) {
        match self {
            Runner::Hook => (&RUN_HOOK, "run_hook"),
            Runner::Generate => (&RUN_GENERATE, "run_generate"),
        }
    }
}

/// A Python callable and how to call it.
pub(crate) struct Hook {
    /// The callable: `hook(body)` or `hook(body, call)`, sync or async.
    pub(crate) func: Py<PyAny>,
    /// Whether it takes the call info as a second argument.
    pub(crate) with_call: bool,
}

/// What a hook decided.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Nothing changed.
    Unchanged,
    /// The new document.
    Replace(serde_json::Value),
    /// Stop the rollout with this condition.
    Stop(String),
}

/// What `intercept._hooks.run_hook` reports: a tag and a text.
type Report = (u8, Option<String>);

const TAG_DONE: u8 = 0;
const TAG_STOP: u8 = 1;
const TAG_ERROR: u8 = 2;
const TAG_CANCELLED: u8 = 3;
/// The hook raised `intercept.InvalidRequestError`: a 400 with its message.
const TAG_INVALID: u8 = 4;
/// The hook raised `intercept.RolloutConcludedError`: a 409.
const TAG_CONCLUDED: u8 = 5;
/// A generate hook raised an exception carrying an HTTP status: the text is
/// `{"status": <int>, "message": <str>}`.
const TAG_STATUS: u8 = 6;

/// Called (with the GIL, on the event loop's thread) once the hook finished.
#[pyclass(frozen)]
pub(crate) struct HookDone {
    tx: Mutex<Option<oneshot::Sender<Report>>>,
}

#[pymethods]
impl HookDone {
    fn __call__(&self, tag: u8, text: Option<String>) {
        if let Some(tx) = self.tx.lock().take() {
            let _ = tx.send((tag, text));
        }
    }
}

/// Cancels the scheduled hook (a `concurrent.futures.Future`) unless disarmed.
struct CancelOnDrop(Option<Py<PyAny>>);

impl CancelOnDrop {
    fn disarm(mut self) {
        if let Some(fut) = self.0.take() {
            // Dropping a Python reference needs no GIL with pyo3 (it is deferred).
            drop(fut);
        }
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(fut) = self.0.take() {
            if crate::bridge::exiting() {
                // At interpreter exit there is nothing left to cancel (and no Python to call).
                std::mem::forget(fut);
                return;
            }
            let _ = crate::bridge::with_python(|py| {
                let _ = fut.bind(py).call_method0("cancel");
            });
        }
    }
}

/// Runs `hook` on `payload` (a JSON object's bytes) on `event_loop` and waits for it
/// without holding the GIL. `original` is the document as the server has it, so that a
/// hook that returned its (unchanged) argument changes nothing.
pub(crate) async fn run(
    hook: &Hook,
    name: &'static str,
    event_loop: Option<&Py<PyAny>>,
    payload: Bytes,
    original: &serde_json::Value,
    call: &CallInfo,
    session_id: &str,
) -> Result<Outcome, Error> {
    let failed = |m: String| Error::HookFailed(format!("{name}: {m}"));
    let info = Info {
        dialect: call.dialect.as_str(),
        stream: call.stream,
        seq: call.seq,
        session: session_id,
        headers: &call.headers,
    };
    match schedule(hook, name, event_loop, payload, info, Runner::Hook).await? {
        (TAG_DONE, Some(text)) => {
            let value = document(name, &text)?;
            if &value == original {
                Ok(Outcome::Unchanged)
            } else {
                Ok(Outcome::Replace(value))
            }
        }
        (TAG_DONE, None) => Ok(Outcome::Unchanged),
        (TAG_STOP, reason) => Ok(Outcome::Stop(reason.unwrap_or_else(|| name.to_owned()))),
        (tag, _) => Err(failed(format!("unknown hook report {tag}"))),
    }
}

/// Runs a tool hook (`hook(body)`, see `NativeSession.set_tool_hook`) on `payload` (the
/// `POST /tool` body, JSON) on `event_loop`: the dict it returns is the answer. A hook
/// cancelled on its loop (its owner released the rollout) answers 409.
pub(crate) async fn run_tool(
    hook: &Hook,
    event_loop: Option<&Py<PyAny>>,
    payload: Bytes,
    session_id: &str,
) -> Result<serde_json::Value, Error> {
    const NAME: &str = "tool hook";
    let info = Info {
        dialect: "",
        stream: false,
        seq: 0,
        session: session_id,
        headers: &[],
    };
    let report = match schedule(hook, NAME, event_loop, payload, info, Runner::Hook).await {
        Err(Error::Cancelled(_)) => return Err(Error::RolloutConcluded),
        other => other?,
    };
    match report {
        (TAG_DONE, Some(text)) => document(NAME, &text),
        (tag, _) => Err(Error::HookFailed(format!(
            "{NAME}: must return a dict (report {tag})"
        ))),
    }
}

/// What `intercept._hooks.run_generate` reports for a generate hook that returned.
#[derive(Deserialize)]
struct GenerateReport {
    /// The dialect's complete response (a JSON object, checked by `run_generate`).
    response: Box<RawValue>,
    #[serde(default)]
    tokens: Option<TokensReport>,
}

/// The token data of a generated answer, as the hook returned it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensReport {
    prompt_ids: Vec<u32>,
    completion_ids: Vec<u32>,
    #[serde(default)]
    logprobs: Vec<f64>,
    #[serde(default)]
    path: Option<TokenPath>,
    #[serde(default)]
    reason: Option<String>,
}

/// An engine's error as a generate hook raised it (`TAG_STATUS`).
#[derive(Deserialize)]
struct StatusReport {
    status: u16,
    message: String,
}

/// Runs a generate hook (`hook(body, call)`, see `NativeSession.set_generate_hook`) on
/// `payload` (the request body as it would have gone upstream) on `event_loop`, without
/// holding the GIL while it runs: its `{"response": dict, "tokens": dict | None}` is the
/// call's answer. Dropping the returned future cancels the hook on its loop.
pub(crate) async fn run_generate(
    hook: &Hook,
    event_loop: &Py<PyAny>,
    payload: Bytes,
    call: &CallInfo,
    session_id: &str,
) -> Result<Generated, Error> {
    const NAME: &str = "generate";
    let failed = |m: String| Error::HookFailed(format!("{NAME}: {m}"));
    let info = Info {
        dialect: call.dialect.as_str(),
        stream: call.stream,
        seq: call.seq,
        session: session_id,
        headers: &call.headers,
    };
    let report = schedule(
        hook,
        NAME,
        Some(event_loop),
        payload,
        info,
        Runner::Generate,
    )
    .await?;
    let text = match report {
        (TAG_DONE, Some(text)) => text,
        (tag, _) => return Err(failed(format!("unknown hook report {tag}"))),
    };
    let report: GenerateReport = serde_json::from_str(&text).map_err(|e| {
        failed(format!(
            "must return {{\"response\": dict, \"tokens\": {{\"prompt_ids\", \"completion_ids\", \
             \"logprobs\", \"path\", \"reason\"}} | None}}: {e}"
        ))
    })?;
    let response: Box<str> = report.response.into();
    Ok(Generated {
        response: Bytes::from(response.into_string()),
        tokens: report.tokens.map(|t| TurnTokens {
            prompt_ids: t.prompt_ids,
            completion_ids: t.completion_ids,
            logprobs: t.logprobs,
            path: t.path,
            reason: t.reason,
        }),
    })
}

/// The error a generate hook's `TAG_STATUS` report stands for: the engine's status as an
/// upstream error (never read as a context-length stop: the hook's owner decides what an
/// overlong prompt means), or a 502 when the status is not an HTTP error's.
fn status_error(name: &str, text: Option<String>) -> Error {
    let failed = |m: String| Error::HookFailed(format!("{name}: {m}"));
    let Some(report) = text.and_then(|t| serde_json::from_str::<StatusReport>(&t).ok()) else {
        return failed("raised an exception with an unreadable status".into());
    };
    if !(400..=599).contains(&report.status) {
        return failed(format!(
            "raised an exception with status {} (not an HTTP error status): {}",
            report.status, report.message
        ));
    }
    Error::UpstreamStatus {
        status: report.status,
        body: report.message,
        retry_after: None,
        context_length: false,
    }
}

/// A hook's returned document: a JSON object.
fn document(name: &str, text: &str) -> Result<serde_json::Value, Error> {
    let failed = |m: String| Error::HookFailed(format!("{name}: {m}"));
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| failed(format!("returned a value that is not JSON: {e}")))?;
    if !value.is_object() {
        return Err(failed(
            "must return a dict, None or intercept.Stop(reason)".into(),
        ));
    }
    Ok(value)
}

/// What a hook taking two arguments gets as its `CallInfo`.
struct Info<'a> {
    dialect: &'a str,
    stream: bool,
    seq: u64,
    session: &'a str,
    headers: &'a [(String, String)],
}

/// Schedules `hook` on `event_loop` and waits for its report without holding the GIL.
/// Every error outcome (a raise, a cancellation, a loop that dropped it) is `Err`; `Ok`
/// is a done or stop report.
async fn schedule(
    hook: &Hook,
    name: &str,
    event_loop: Option<&Py<PyAny>>,
    payload: Bytes,
    info: Info<'_>,
    runner: Runner,
) -> Result<Report, Error> {
    let failed = |m: String| Error::HookFailed(format!("{name}: {m}"));
    let Some(event_loop) = event_loop else {
        return Err(failed(
            "no event loop to run it on: acquire the session from async code (or through \
             intercept.sync)"
                .into(),
        ));
    };
    if crate::bridge::exiting() {
        return Err(failed("the Python interpreter is exiting".into()));
    }
    let (tx, rx) = oneshot::channel::<Report>();
    let scheduled = crate::bridge::with_python(|py| -> PyResult<Py<PyAny>> {
        let (cell, function) = runner.cell();
        let run_hook = cell.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            Ok(py.import("intercept._hooks")?.getattr(function)?.unbind())
        })?;
        let done = Py::new(
            py,
            HookDone {
                tx: Mutex::new(Some(tx)),
            },
        )?;
        let info = (
            info.dialect,
            info.stream,
            info.seq,
            info.session,
            info.headers.to_vec(),
        );
        let fut = run_hook.bind(py).call1((
            event_loop.bind(py),
            hook.func.bind(py),
            PyBytes::new(py, &payload),
            hook.with_call,
            info,
            done,
        ))?;
        Ok(fut.unbind())
    })
    .ok_or_else(|| failed("the Python interpreter is shutting down".into()))?
    .map_err(|e| failed(format!("could not be scheduled: {e}")))?;
    let cancel = CancelOnDrop(Some(scheduled));
    let report = rx.await;
    cancel.disarm();
    match report {
        Ok(report @ (TAG_DONE | TAG_STOP, _)) => Ok(report),
        Ok((TAG_CANCELLED, _)) => Err(Error::Cancelled(format!("{name} was cancelled"))),
        Ok((TAG_INVALID, message)) => Err(Error::invalid(message.unwrap_or_default())),
        Ok((TAG_CONCLUDED, _)) => Err(Error::RolloutConcluded),
        Ok((TAG_STATUS, text)) => Err(status_error(name, text)),
        Ok((TAG_ERROR, message)) => Err(failed(
            message.unwrap_or_else(|| "raised an exception".into()),
        )),
        Ok((tag, _)) => Err(failed(format!("unknown hook report {tag}"))),
        Err(_) => Err(failed(
            "its event loop dropped it (the loop was closed or stopped)".into(),
        )),
    }
}
