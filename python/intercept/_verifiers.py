"""The bridge under `intercept.verifiers`: verifiers' own per-turn logic, carried by intercept.

For each model call of a rollout, verifiers 0.4's objects decide what its interception
server would decide (`RolloutSession.refused`, `rewrite_request`, network-policy
mediation, `graph.prepare_turn` then `commit` or `abandon`, `rewrite_response`,
`gate_tool_calls`, `InterceptionServer.record_call`, `Trace.preview`/`notify`), while
intercept does the HTTP, the routing, the relay and the upstream.

Three hooks of one `intercept.Session` carry a rollout:

- `on_request` (awaited before the call goes upstream): everything verifiers does
  between reading the request and calling the model. The prepared turn waits under the
  call's sequence number.
- the record hook (`NativeSession.set_record_hook`, scheduled on the loop when intercept
  records the call, before the harness can see its answer; never awaited, so a stream
  is relayed live): the commit (or abandon) of the turn and the call's `ModelCall`.
- `on_response` (awaited on the complete response; intercept then holds a stream back
  until it ran): only for rollouts whose task has response interceptors or stops, or
  request interceptors or stops (which police tool calls after the commit), since those
  may rewrite or refuse the answer.

A rollout whose context has verifiers' *train* client (`TrainClientConfig`) uses a
fourth: the generate hook (`NativeSession.set_generate_hook`, awaited in place of the
upstream call). It hands the turn `on_request` prepared to verifiers' own `TrainClient`
(`get_response(dialect, body, sampling, session_id, turn)`: render or bridge with
`renderers`, `POST /inference/v1/generate`, parse), keeps the `Response` it returns (with
its `TurnTokens`) for the commit, and gives intercept the chat completion to serve and the
ids to record. The train client is the one verifiers' server would use (one per distinct
config, owned by the interception object), so the tokens are verifiers' own.

`GET`/`PUT /state` reach `trace.state` through the session's `state_adapter`
(`NativeSession.set_state_hook`); `GET /task` answers verifiers' task channel
(`{"cls", "task"}`, `NativeSession.set_task_body`); `POST /tool` is verifiers' tool gate,
`RolloutSession.decide_tool` run on the loop (`NativeSession.set_tool_hook`). The ACP
request header (`X-ACP-Model-Request-ID`) reaches `on_request` in `CallInfo.headers`
(`Session(hook_headers=...)`; it is not forwarded upstream, as in verifiers) and is
recorded on the call's `ModelCall.acp`.

verifiers is imported lazily and reached through `Any`: the package type-checks without it.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import time
from dataclasses import dataclass, field
from typing import Any

from ._errors import InvalidRequestError, RolloutConcludedError
from ._hooks import CallInfo, Stop

SUPPORTED = ">=0.4,<0.5"
"""The verifiers releases `intercept.verifiers` carries."""

_LOW, _HIGH = (0, 4), (0, 5)


class VerifiersVersionError(ImportError):
    """The installed verifiers is not one `intercept.verifiers` supports."""


def _version_tuple(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def check_version() -> str:
    """The installed verifiers version, or `VerifiersVersionError` when it is missing or
    outside `SUPPORTED`."""
    from importlib import metadata

    try:
        version = metadata.version("verifiers")
    except metadata.PackageNotFoundError:
        raise VerifiersVersionError(
            f"intercept.verifiers needs the verifiers package ({SUPPORTED}); it is not installed: "
            "`pip install 'verifiers>=0.4,<0.5'`, or use intercept.Session directly"
        ) from None
    if not (_LOW <= _version_tuple(version)[:2] < _HIGH):
        raise VerifiersVersionError(
            f"intercept.verifiers supports verifiers {SUPPORTED}; verifiers {version} is installed. "
            "Install verifiers 0.4.x (`pip install 'verifiers>=0.4,<0.5'`), or use intercept.Session directly"
        )
    return version


class _VF:
    """verifiers' modules, imported once."""

    def __init__(self) -> None:
        check_version()
        self.graph: Any = importlib.import_module("verifiers.v1.graph")
        dialects: Any = importlib.import_module("verifiers.v1.dialects")
        self.errors: Any = importlib.import_module("verifiers.v1.errors")
        server: Any = importlib.import_module("verifiers.v1.interception.server")
        self.server_cls: Any = server.InterceptionServer
        client_cfg: Any = importlib.import_module("verifiers.v1.configs.client")
        self.client_cfg = client_cfg
        pydantic: Any = importlib.import_module("pydantic")
        self.validation_error: Any = pydantic.ValidationError
        self.session_cls: Any = importlib.import_module("verifiers.v1.session").RolloutSession
        self.chat_dialect_cls: Any = dialects.ChatDialect
        # After 0.4.0, the graph matches a prompt under the harness's replay view of the
        # request's dialect: `prepare_turn(..., dialect)`, `rewrite_request(..., dialect=)`.
        self.turn_takes_dialect = "dialect" in inspect.signature(self.graph.prepare_turn).parameters
        self.rewrite_takes_dialect = "dialect" in inspect.signature(self.session_cls.rewrite_request).parameters
        self.semantic: Any = importlib.import_module("verifiers.v1.semantic")
        # intercept's dialect kinds -> verifiers' dialects.
        self.dialects: dict[str, Any] = {
            "chat_completions": dialects.ChatDialect(),
            "responses": dialects.ResponsesDialect(),
            "messages": dialects.AnthropicDialect(),
        }


    def prepare_turn(self, trace: Any, request: Any, dialect: Any) -> Any:
        """`graph.prepare_turn` as this verifiers' server calls it."""
        if self.turn_takes_dialect:
            return self.graph.prepare_turn(trace, request.messages, request.tools, getattr(dialect, "name", None))
        return self.graph.prepare_turn(trace, request.messages, request.tools)

    def dialect_kw(self, dialect: Any) -> dict[str, Any]:
        """The keywords of `RolloutSession.rewrite_request` that name the dialect, where it
        takes them."""
        return {"dialect": getattr(dialect, "name", None)} if self.rewrite_takes_dialect else {}


_vf: _VF | None = None


def vf() -> _VF:
    global _vf
    if _vf is None:
        _vf = _VF()
    return _vf


class _Refused(Exception):
    """A request verifiers does not serve at all (a route it lacks): the call fails (502
    `hook_failed`, naming this message) and is not recorded."""


@dataclass
class _Pending:
    """One call between its request hook and its record."""

    dialect: Any
    body: dict[str, Any]
    turn: Any
    policy_paths: list[str]
    started: float
    acp: Any = None
    # Set by `on_response` (rollouts with response-side hooks).
    decided: bool = False
    node: int | None = None
    response: Any = None
    error: BaseException | None = None
    # Set by `on_generate` (train-client rollouts): `response` is the train client's.
    generated: bool = False


_DIALECT_NAMES = {
    "responses": "an OpenAI Responses call (POST /v1/responses)",
    "messages": "an Anthropic Messages call (POST /v1/messages)",
}


def _train_refusal(dialect: str) -> str:
    what = _DIALECT_NAMES.get(dialect, f"a {dialect} call")
    return (
        f"this rollout trains through verifiers' train client (TrainClientConfig), which renders "
        f"Chat Completions only, and the harness sent {what}. Point the harness at Chat "
        f"Completions (POST /v1/chat/completions) to train on its tokens, give the rollout an "
        f"eval client (EvalClientConfig(base_url=...)) to relay this dialect without token ids, "
        f"or run it on an intercept.Session with intercept's own token path (tokens={{...}}), "
        f"which renders this dialect too"
    )


def _plain(values: Any) -> list[Any]:
    """A token stream as a list of Python numbers: verifiers 0.4.0 keeps lists, later
    releases numpy arrays."""
    if values is None:
        return []
    tolist = getattr(values, "tolist", None)
    out: list[Any] = tolist() if callable(tolist) else list(values)
    return out


def _bridgeable_tail(messages: list[Any]) -> bool:
    """The train client's test for a tail its renderer may bridge: tool results, then at
    most one user message."""
    roles = [getattr(m, "role", None) for m in messages]
    if not roles:
        return False
    if roles[-1] == "user":
        roles = roles[:-1]
    return all(role == "tool" for role in roles)


@dataclass
class Bridge:
    """One verifiers `RolloutSession`, carried by the intercept session it makes.
    `client` is the rollout's train client (verifiers' `TrainClient`) when its context
    has a `TrainClientConfig`: its model calls are then generated by it (`on_generate`)."""

    vf_session: Any
    client: Any = None
    pending: dict[int, _Pending] = field(default_factory=dict)

    @property
    def inspects_responses(self) -> bool:
        s = self.vf_session
        return bool(s.response_interceptors or s.response_stops or s.request_interceptors or s.request_stops)

    # --- before the upstream call ---------------------------------------------------

    async def on_request(self, body: dict[str, Any], call: CallInfo) -> dict[str, Any] | Stop:
        v = vf()
        s = self.vf_session
        dialect = v.dialects.get(call.dialect)
        if dialect is None:
            raise _Refused(f"verifiers 0.4 serves no {call.dialect} route")
        body = dialect.apply_overrides(body, s.ctx.model, s.ctx.sampling)
        # Requests verifiers answers 400 without touching the rollout (a malformed ACP
        # header, a body its dialect cannot read) are 400s here too, with its message.
        try:
            acp, _ = v.semantic.extract_acp_info(call.headers)
        except ValueError as e:
            raise InvalidRequestError(str(e)) from None
        try:
            model_request = dialect.parse_request(body)
        except ValueError as e:
            raise InvalidRequestError(str(e)) from None
        if s.stopped:
            return Stop(str(s.trace.stop_condition))
        try:
            refused = await s.refused()
            if refused is not None:
                return Stop(refused)
            original = model_request
            model_request, rewrites, stopped = await s.rewrite_request(model_request, **v.dialect_kw(dialect))
            s.trace.request_rewrites.extend(rewrites)
            if stopped is None and model_request != original:
                dialect.rewrite_request(body, original, model_request)
        except v.errors.RolloutError as e:
            s.error = e
            raise
        except Exception as e:  # noqa: BLE001 - a task hook failed: verifiers' TaskError
            error = v.errors.TaskError(f"model boundary hook failed: {type(e).__name__}: {e}")
            s.error = error
            raise error from e
        if stopped is not None:
            turn = v.prepare_turn(s.trace, model_request, dialect)
            turn.commit_prompt()
            s.trace.stop(stopped)
            return Stop(stopped)
        try:
            body, policy_paths = v.server_cls.mediate_capabilities(None, s, dialect, body)
            if rewrites or s.network_policy.network_restricted:
                model_request = dialect.parse_request(body)
            turn = v.prepare_turn(s.trace, model_request, dialect)
        except v.errors.RolloutError as e:
            s.error = e
            raise
        except ValueError as e:
            raise InvalidRequestError(str(e)) from None
        s.trace.preview(turn, turn.tail)
        if s.on_turn_input is not None:
            on_input, s.on_turn_input = s.on_turn_input, None
            on_input()
        s.error = None
        self.pending[call.seq] = _Pending(dialect, body, turn, policy_paths, time.time(), acp)
        return body

    # --- the model call itself (train-client rollouts) --------------------------------

    async def on_generate(self, body: dict[str, Any], call: CallInfo) -> dict[str, Any]:
        """The generate hook: the turn `on_request` prepared, generated by verifiers'
        `TrainClient` as its server would call it. Returns the chat completion to serve
        and the ids sent and received; the `Response` (with its `TurnTokens`) waits for
        the commit. Errors are recorded as verifiers records them and keep their status
        (`ProviderError.status_code`); a dialect the train client refuses is a 400."""
        v = vf()
        s = self.vf_session
        p = self.pending.get(call.seq)
        if p is None or s.released:
            raise RolloutConcludedError("rollout concluded")
        s.adopt(asyncio.current_task())  # release cancels the generation, as verifiers' handler
        try:
            response = await self.client.get_response(p.dialect, p.body, s.ctx.sampling, session_id=str(s.trace.id), turn=p.turn)
        except v.errors.RolloutError as e:
            p.error = e
            s.error = e
            raise
        except NotImplementedError as e:
            p.error = e
            if not isinstance(p.dialect, v.chat_dialect_cls):
                raise InvalidRequestError(_train_refusal(call.dialect)) from e
            raise
        except BaseException as e:  # recorded as the call's error, as verifiers does
            p.error = e
            raise
        p.response = response
        p.generated = True
        tokens = response.tokens
        out: dict[str, Any] = {"response": response.raw, "tokens": None}
        if tokens is not None:
            out["tokens"] = {
                "prompt_ids": _plain(tokens.prompt_ids),
                "completion_ids": _plain(tokens.completion_ids),
                "logprobs": _plain(tokens.completion_logprobs),
                "path": "bridged" if tokens.bridged else "rendered",
                "reason": None if tokens.bridged else self._unbridged(p.turn),
            }
        return out

    @staticmethod
    def _unbridged(turn: Any) -> str:
        """Why the train client rendered the whole conversation."""
        if not turn.prefix_node_ids:
            return "first_turn"
        if not _bridgeable_tail(turn.tail):
            return "tail_not_bridgeable"
        return "bridge_declined"

    # --- the complete response (rollouts with response-side hooks) -------------------

    async def on_response(self, raw: dict[str, Any], call: CallInfo) -> dict[str, Any] | Stop | None:
        v = vf()
        s = self.vf_session
        p = self.pending.get(call.seq)
        if p is None:
            return None
        p.decided = True
        dialect = p.dialect
        try:
            # A generated answer commits the train client's own `Response` (its tokens).
            response = p.response if p.generated else self._parse(dialect, raw)
            p.response = response
            rewrites: list[Any] = []
            stopped = None
            served: dict[str, Any] | None = None
            if s.response_interceptors or s.response_stops:
                response, rewrites, stopped = await s.rewrite_response(response)
                if rewrites:
                    dialect.rewrite_response(response.raw, response.message.content or "")
                    served = response.raw
                    response = self._parse(dialect, served)
                p.response = response
            if s.stopped:
                return Stop(str(s.trace.stop_condition))
            p.node = p.turn.commit(response)
            s.consume_prepared(p.turn.tail)
            s.trace.response_rewrites.extend(rewrites)
            if stopped is None:
                stopped = await s.gate_tool_calls(p.node)
            if stopped is not None:
                s.trace.stop(stopped)
                return Stop(stopped)
            return served
        except v.errors.RolloutError as e:
            p.error = e
            s.error = e
            raise
        except Exception as e:  # noqa: BLE001 - recorded as the call's error, as verifiers does
            p.error = e
            raise
        except BaseException as e:
            p.error = e
            raise

    # --- the record (every call that went upstream) ----------------------------------

    def on_record(self, payload: bytes) -> None:
        rec = json.loads(payload)
        p = self.pending.pop(int(rec["seq"]), None)
        if p is None:
            return
        v = vf()
        s = self.vf_session
        if s.released:  # the trace is sealed: a straggler is not recorded
            p.turn.abandon()
            return
        response = p.response
        node = p.node
        error = p.error
        try:
            if not p.decided and p.generated and rec.get("error") is None:
                if not s.stopped:
                    node = p.turn.commit(response)
                    s.consume_prepared(p.turn.tail)
            elif not p.decided:
                raw = rec.get("response")
                if p.error is not None:
                    # The generate hook failed: verifiers' own exception (`s.error` is
                    # already set where verifiers sets it).
                    error = p.error
                elif rec.get("error") is None and isinstance(raw, dict):
                    try:
                        response = self._parse(p.dialect, raw)
                    except (ValueError, v.validation_error) as e:
                        error = v.errors.model_error(f"malformed upstream response: {type(e).__name__}: {e}", status_code=502)
                        s.error = error
                    else:
                        if not s.stopped:
                            node = p.turn.commit(response)
                            s.consume_prepared(p.turn.tail)
                else:
                    error = self._error(rec.get("error"))
                    if isinstance(error, v.errors.RolloutError):
                        s.error = error
        finally:
            if node is None:
                p.turn.abandon()
            v.server_cls.record_call(
                None,
                s,
                p.dialect,
                p.body,
                p.started,
                node=node,
                finish_reason=response.finish_reason if response is not None else None,
                usage=response.usage if response is not None else None,
                error=error,
                policy_paths=p.policy_paths,
                acp=p.acp,
            )

    # --- `/state` (GET and PUT, served on the server's thread) ------------------------

    def get_state(self) -> bytes:
        s = self.vf_session
        out: bytes = s.state_adapter.dump_json(s.trace.state)
        return out

    def put_state(self, body: bytes) -> str | None:
        s = self.vf_session
        try:
            new_state = s.state_adapter.validate_json(body)
        except vf().validation_error as e:
            return f"invalid state PUT for {type(s.trace.state).__name__}: {e}"
        if s.released:  # the trace is sealed: a straggler write must not land
            return "rollout concluded"
        s.trace.state = new_state
        return None

    # --- `GET /task` and `POST /tool` ------------------------------------------------

    def task_body(self) -> str:
        """verifiers' `/task` answer: the task's class reference and its JSON (the row is
        immutable, so it is computed once, at acquire)."""
        task = self.vf_session.trace.task.data
        return json.dumps({"cls": f"{type(task).__module__}:{type(task).__qualname__}", "task": task.model_dump_json()})

    async def on_tool(self, body: Any) -> dict[str, Any]:
        """verifiers' tool gate: `{tool_call_id, name, arguments}` in, the verdict of
        `RolloutSession.decide_tool` out; a rollout error is a 400 (and the rollout's
        error), a released rollout a 409."""
        v = vf()
        s = self.vf_session
        if s.released:
            raise RolloutConcludedError("rollout concluded")
        s.adopt(asyncio.current_task())  # release cancels it, as verifiers' handler
        if not isinstance(body, dict):
            raise InvalidRequestError("expected a JSON object {tool_call_id, name, arguments}")
        try:
            verdict: dict[str, Any] = await s.decide_tool(str(body.get("tool_call_id", "")), body.get("name"), body.get("arguments"))
        except v.errors.RolloutError as e:
            s.error = e
            raise InvalidRequestError(str(e)) from None
        return verdict

    def release(self) -> None:
        """The rollout concluded: seal verifiers' session first (stragglers then leave no
        record, as with verifiers' `unregister`)."""
        self.vf_session.release()

    def drain(self) -> None:
        """After release: turns whose call never recorded leave no preview behind."""
        for p in self.pending.values():
            p.turn.abandon()
        self.pending.clear()

    # --- helpers ----------------------------------------------------------------------

    @staticmethod
    def _parse(dialect: Any, raw: dict[str, Any]) -> Any:
        response = dialect.parse_response(dialect.validate_response(raw))
        response.raw = raw
        return response

    @staticmethod
    def _error(err: Any) -> BaseException:
        """intercept's record error -> the exception verifiers' server would have recorded."""
        v = vf()
        if not isinstance(err, dict):
            failed: BaseException = v.errors.model_error("the call failed", status_code=502)
            return failed
        kind = str(err.get("kind", ""))
        message = str(err.get("message", ""))
        status = int(err.get("status") or 502)
        if kind in ("cancelled", "client_disconnected"):
            return asyncio.CancelledError(message)
        error: BaseException = v.errors.model_error(message or kind, status_code=status)
        return error


def upstream_of(vf_session: Any, override: Any = None) -> Any:
    """The intercept upstream for a verifiers session: its client's endpoint (an eval
    client's calls are relayed there; a train client generates on it itself, and intercept
    uses it only for `GET /v1/models`)."""
    if override is not None:
        return override
    v = vf()
    config = vf_session.ctx.client
    headers = dict(v.client_cfg.resolve_headers(config))
    return {"base_url": str(config.base_url), "api_key": v.client_cfg.resolve_api_key(config), "headers": headers}


def is_train_config(config: Any) -> bool:
    """Whether a verifiers client config is its train client's (`TrainClientConfig`)."""
    return isinstance(config, vf().client_cfg.TrainClientConfig)


class TrainClients:
    """verifiers' train clients of one interception object, one per distinct config (as
    verifiers' server owns them: they share the engine connection pool), closed at stop."""

    def __init__(self) -> None:
        self._clients: dict[str, Any] = {}

    def get(self, config: Any) -> Any:
        key = config.model_dump_json()
        client = self._clients.get(key)
        if client is None:
            resolve: Any = importlib.import_module("verifiers.v1.clients").resolve_client
            client = self._clients[key] = resolve(config)
        return client

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()


def is_verifiers_session(obj: Any) -> bool:
    try:
        return isinstance(obj, vf().session_cls)
    except ImportError:
        return False
