"""Shared by the verifiers differential test and `bench/verifiers_bench.py`: a scripted
model server (a real HTTP server speaking Chat Completions, Responses and Anthropic
Messages, JSON and SSE), the harness program (the official `openai` and `anthropic` SDKs in
a child process), and a runner for verifiers 0.4's own `Rollout`.

The scripted model answers from the conversation alone, so two runs of one rollout get the
same answers: with tools offered and no assistant turn yet, a call to `add`; otherwise
`reply <n>: <last text>` where n counts the assistant turns so far. A prompt containing
`flaky` makes the second turn's first attempt a 500 (the SDK retries it); one containing
`broken` makes the second turn a 400 (the harness dies of it), `overloaded` a 529 on
every attempt (the SDK retries, then dies of it). `trailing` ends each reply with two
spaces, which the harness trims when it re-sends the reply. `slow` spaces a stream's
events by `SLOW_CHUNK` seconds. A harness that dies prints the error its SDK raised
(class, status, the body's error type).

The harness program asks the rollout's tool gate (`POST /tool`, verifiers' `{tool_call_id,
name, arguments}`) before running a tool when it is handed one (`GatedHarness`), and a
prompt containing `acp` makes it send `X-ACP-Model-Request-ID: turn-<i>` (`bad acp`: a
malformed id on the second turn).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from aiohttp import web

SLOW_CHUNK = 0.2
DENIED = "denied: tools are not allowed here"
TOOLS = [{"type": "function", "function": {"name": "add", "description": "adds", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict):
                out.append(str(part.get("text") or part.get("content") or part.get("output") or ""))
        return "".join(out)
    return ""


def _read(dialect: str, body: dict[str, Any]) -> tuple[int, str, bool]:
    """(assistant turns so far, last text, tools offered)."""
    if dialect == "responses":
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        n = 0
        last = ""
        for it in items or []:
            if it.get("role") == "assistant" or it.get("type") == "function_call":
                n += 1 if it.get("type") != "function_call" or True else 0
            if it.get("type") == "function_call_output":
                last = str(it.get("output"))
            elif it.get("role") in ("user", "system", "developer"):
                last = _text_of(it.get("content"))
        return n, last, bool(body.get("tools"))
    msgs = body.get("messages") or []
    n = sum(1 for m in msgs if m.get("role") == "assistant")
    last = ""
    for m in msgs:
        if m.get("role") == "tool":
            last = _text_of(m.get("content"))
        elif m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list) and content and content[0].get("type") == "tool_result":
                last = _text_of(content[0].get("content"))
            else:
                last = _text_of(content)
    return n, last, bool(body.get("tools"))


def _sse(event: dict[str, Any], name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return (head + "data: " + json.dumps(event) + "\n\n").encode()


class ScriptedModel:
    """`await ScriptedModel.start()`; `base_url` is `http://127.0.0.1:<port>/v1`."""

    def __init__(self) -> None:
        self.failed: set[tuple[str, int]] = set()
        self.requests = 0
        # Requests that carried an ACP header upstream (verifiers consumes it).
        self.acp_upstream = 0
        self.runner: web.AppRunner | None = None
        self.base_url = ""

    @classmethod
    async def start(cls) -> ScriptedModel:
        self = cls()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/messages", self._messages)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self

    async def shutdown(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def _script(self, dialect: str, request: web.Request, body: dict[str, Any]) -> tuple[web.Response | None, int, str, bool, bool]:
        self.requests += 1
        if "X-ACP-Model-Request-ID" in request.headers:
            self.acp_upstream += 1
        n, last, tools = _read(dialect, body)
        prompt = json.dumps(body)
        session = request.headers.get("X-Session-ID", "")
        if "broken" in prompt and n == 1:
            return web.json_response({"error": {"message": "scripted bad request", "type": "invalid_request_error"}}, status=400), 0, "", False, False
        if "overloaded" in prompt and n == 1:
            return web.json_response({"type": "error", "error": {"type": "overloaded_error", "message": "scripted overload"}}, status=529), 0, "", False, False
        if "flaky" in prompt and n == 1 and (session, n) not in self.failed:
            self.failed.add((session, n))
            return web.json_response({"error": {"message": "scripted outage", "type": "server_error"}}, status=500), 0, "", False, False
        call_tool = tools and n == 0
        text = f"reply {n}: {last}"
        if "trailing" in prompt:
            text += "  "
        return None, n, text, call_tool, "slow" in prompt

    async def _write(self, request: web.Request, events: list[bytes], slow: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for ev in events:
            if slow:
                await asyncio.sleep(SLOW_CHUNK)
            await resp.write(ev)
        await resp.write_eof()
        return resp

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        early, n, text, call_tool, slow = self._script("chat", request, body)
        if early is not None:
            return early
        model = body.get("model")
        usage = {"prompt_tokens": 10 + 5 * n, "completion_tokens": 3, "total_tokens": 13 + 5 * n}
        rid = f"chatcmpl-{n}"
        if call_tool:
            calls = [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": text}
            finish = "stop"
        if not body.get("stream"):
            return web.json_response({"id": rid, "object": "chat.completion", "created": 1, "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage})
        base = {"id": rid, "object": "chat.completion.chunk", "created": 1, "model": model}
        events = [_sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})]
        if call_tool:
            events.append(_sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, **calls[0]}]}, "finish_reason": None}]}))
        else:
            third = max(1, len(text) // 3)
            for piece in (text[:third], text[third : 2 * third], text[2 * third :]):
                events.append(_sse({**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}))
        events.append(_sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(_sse({**base, "choices": [], "usage": usage}))
        events.append(b"data: [DONE]\n\n")
        return await self._write(request, events, slow)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        early, n, text, call_tool, slow = self._script("responses", request, body)
        if early is not None:
            return early
        if call_tool:
            item: dict[str, Any] = {"type": "function_call", "id": f"fc_{n}", "call_id": "call_1", "name": "add", "arguments": '{"a": 2, "b": 3}', "status": "completed"}
        else:
            item = {"type": "message", "id": f"msg_{n}", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]}
        usage = {"input_tokens": 10 + 5 * n, "output_tokens": 3, "total_tokens": 13 + 5 * n, "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
        full = {
            "id": f"resp_{n}", "object": "response", "created_at": 1, "status": "completed", "model": body.get("model"),
            "output": [item], "usage": usage, "error": None, "incomplete_details": None, "instructions": None,
            "metadata": {}, "parallel_tool_calls": True, "temperature": None, "top_p": None, "tool_choice": "auto", "tools": [],
        }
        if not body.get("stream"):
            return web.json_response(full)
        seq = iter(range(1000))
        started = {**full, "status": "in_progress", "output": [], "usage": None}
        events = [_sse({"type": "response.created", "sequence_number": next(seq), "response": started}, "response.created")]
        if call_tool:
            events.append(_sse({"type": "response.output_item.added", "sequence_number": next(seq), "output_index": 0, "item": {**item, "arguments": "", "status": "in_progress"}}, "response.output_item.added"))
            events.append(_sse({"type": "response.function_call_arguments.delta", "sequence_number": next(seq), "output_index": 0, "item_id": item["id"], "delta": item["arguments"]}, "response.function_call_arguments.delta"))
            events.append(_sse({"type": "response.function_call_arguments.done", "sequence_number": next(seq), "output_index": 0, "item_id": item["id"], "arguments": item["arguments"]}, "response.function_call_arguments.done"))
        else:
            events.append(_sse({"type": "response.output_item.added", "sequence_number": next(seq), "output_index": 0, "item": {**item, "status": "in_progress", "content": []}}, "response.output_item.added"))
            events.append(_sse({"type": "response.content_part.added", "sequence_number": next(seq), "output_index": 0, "content_index": 0, "item_id": item["id"], "part": {"type": "output_text", "text": "", "annotations": []}}, "response.content_part.added"))
            third = max(1, len(text) // 3)
            for piece in (text[:third], text[third : 2 * third], text[2 * third :]):
                events.append(_sse({"type": "response.output_text.delta", "sequence_number": next(seq), "output_index": 0, "content_index": 0, "item_id": item["id"], "delta": piece}, "response.output_text.delta"))
            events.append(_sse({"type": "response.output_text.done", "sequence_number": next(seq), "output_index": 0, "content_index": 0, "item_id": item["id"], "text": text}, "response.output_text.done"))
            events.append(_sse({"type": "response.content_part.done", "sequence_number": next(seq), "output_index": 0, "content_index": 0, "item_id": item["id"], "part": item["content"][0]}, "response.content_part.done"))
        events.append(_sse({"type": "response.output_item.done", "sequence_number": next(seq), "output_index": 0, "item": item}, "response.output_item.done"))
        events.append(_sse({"type": "response.completed", "sequence_number": next(seq), "response": full}, "response.completed"))
        return await self._write(request, events, slow)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        early, n, text, call_tool, slow = self._script("messages", request, body)
        if early is not None:
            error = {"type": "error", "error": {"type": "api_error" if early.status >= 500 else "invalid_request_error", "message": "scripted"}}
            return web.json_response(error, status=early.status)
        if call_tool:
            block: dict[str, Any] = {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": text}
            stop = "end_turn"
        usage = {"input_tokens": 10 + 5 * n, "output_tokens": 3}
        full = {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": body.get("model"), "content": [block], "stop_reason": stop, "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            return web.json_response(full)
        events = [_sse({"type": "message_start", "message": {**full, "content": [], "stop_reason": None, "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 1}}}, "message_start")]
        if call_tool:
            events.append(_sse({"type": "content_block_start", "index": 0, "content_block": {**block, "input": {}}}, "content_block_start"))
            events.append(_sse({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}}, "content_block_delta"))
        else:
            events.append(_sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, "content_block_start"))
            third = max(1, len(text) // 3)
            for piece in (text[:third], text[third : 2 * third], text[2 * third :]):
                events.append(_sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}, "content_block_delta"))
        events.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        events.append(_sse({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 3}}, "message_delta"))
        events.append(_sse({"type": "message_stop"}, "message_stop"))
        return await self._write(request, events, slow)


# The harness program: `python -c PROGRAM <mode> <prompt> <turns>`, with OPENAI_BASE_URL
# (`{base_url}/v1`) and OPENAI_API_KEY (the model secret) in its environment, and
# TOOL_GATE_URL when the rollout hands it a tool gate.
PROGRAM = r'''
import json, os, sys, time
mode, prompt, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
gate = os.environ.get("TOOL_GATE_URL", "")
stream = mode.endswith("-stream")
kind = mode.removesuffix("-stream")
TOOLS = %(tools)s
marks = []
gates = []
def died(kind, e, tb):
    """The error the harness died of, as its SDK showed it: class, status, body type."""
    body = getattr(e, "body", None)
    error_type = None
    if isinstance(body, dict):
        error_type = body.get("type") if "message" in body else (body.get("error") or {}).get("type")
    print(json.dumps({"ttft": marks, "gates": gates, "error": [kind.__name__, getattr(e, "status_code", None), error_type]}))
    sys.__excepthook__(kind, e, tb)
sys.excepthook = died
def add(a, b):
    return str(a + b)
def run_tool(tc):
    """The tool's result, or the gate's verdict in its place (as verifiers' chat loop)."""
    args = json.loads(tc["function"]["arguments"])
    if gate:
        import httpx
        r = httpx.post(gate, headers={"Authorization": f"Bearer {key}"}, json={"tool_call_id": tc["id"], "name": tc["function"]["name"], "arguments": args}, timeout=60)
        r.raise_for_status()
        decision = r.json()
        gates.append(decision)
        if decision["action"] == "stop":
            raise SystemExit("tool gate: " + decision["reason"])
        if decision["action"] == "deny":
            return decision["message"]["content"]
    return add(**args)
def acp_headers(i):
    if "acp" not in prompt:
        return {}
    rid = "not a valid id!" if "bad acp" in prompt and i == 1 else f"turn-{i}"
    return {"extra_headers": {"X-ACP-Model-Request-ID": rid}}
if kind in ("chat", "tools"):
    import openai
    c = openai.OpenAI(base_url=base, api_key=key, max_retries=2)
    history = [{"role": "user", "content": prompt}]
    for i in range(turns):
        kw = {"tools": TOOLS} if kind == "tools" else {}
        kw.update(acp_headers(i))
        t0 = time.perf_counter()
        if stream:
            text, calls, first = "", {}, None
            for chunk in c.chat.completions.create(model="harness-model", messages=history, stream=True, stream_options={"include_usage": True}, **kw):
                if first is None:
                    first = time.perf_counter() - t0
                for ch in chunk.choices:
                    text += ch.delta.content or ""
                    for tc in ch.delta.tool_calls or []:
                        calls.setdefault(tc.index, {"id": tc.id, "type": "function", "function": {"name": tc.function.name, "arguments": ""}})
                        calls[tc.index]["function"]["arguments"] += tc.function.arguments or ""
            tool_calls = list(calls.values())
            marks.append(first)
        else:
            r = c.chat.completions.create(model="harness-model", messages=history, **kw)
            text = r.choices[0].message.content or ""
            tool_calls = [tc.model_dump() for tc in r.choices[0].message.tool_calls or []]
        if tool_calls:
            history.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
            for tc in tool_calls:
                history.append({"role": "tool", "tool_call_id": tc["id"], "content": run_tool(tc)})
            continue
        # `trailing`: the harness re-sends its replies trimmed (a cosmetic rewrite its
        # `replay_view` undoes).
        history.append({"role": "assistant", "content": text.strip() if "trailing" in prompt else text})
        history.append({"role": "user", "content": f"continue {i}"})
elif kind == "responses":
    import openai
    c = openai.OpenAI(base_url=base, api_key=key, max_retries=2)
    history = [{"role": "user", "content": prompt}]
    for i in range(turns):
        t0 = time.perf_counter()
        if stream:
            text, first = "", None
            for ev in c.responses.create(model="harness-model", input=history, stream=True):
                if first is None:
                    first = time.perf_counter() - t0
                if ev.type == "response.output_text.delta":
                    text += ev.delta
            marks.append(first)
        else:
            text = c.responses.create(model="harness-model", input=history).output_text
        history.append({"role": "assistant", "content": text})
        history.append({"role": "user", "content": f"continue {i}"})
elif kind == "anthropic":
    import anthropic
    c = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=key, max_retries=2)
    history = [{"role": "user", "content": prompt}]
    for i in range(turns):
        t0 = time.perf_counter()
        if stream:
            text, first = "", None
            with c.messages.stream(model="harness-model", max_tokens=64, messages=history) as s:
                for piece in s.text_stream:
                    if first is None:
                        first = time.perf_counter() - t0
                    text += piece
            marks.append(first)
        else:
            r = c.messages.create(model="harness-model", max_tokens=64, messages=history)
            text = "".join(b.text for b in r.content if b.type == "text")
        history.append({"role": "assistant", "content": text})
        history.append({"role": "user", "content": f"continue {i}"})
print(json.dumps({"ttft": marks, "gates": gates}))
''' % {"tools": repr(TOOLS)}


def sampling_config() -> Any:
    """verifiers' `SamplingConfig` (in `verifiers.v1.types` in 0.4.0, in
    `verifiers.v1.configs.sampling` after it)."""
    try:
        from verifiers.v1.configs.sampling import SamplingConfig
    except ImportError:
        from verifiers.v1.types import SamplingConfig  # type: ignore[no-redef]
    return SamplingConfig


def verifiers_parts() -> dict[str, Any]:
    """The verifiers 0.4 classes a rollout is built from (imported on demand)."""
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.configs.harness import HarnessConfig
    from verifiers.v1.harness import Harness
    from verifiers.v1.rollout import Rollout, RolloutTimeouts
    from verifiers.v1.runtimes import SubprocessConfig
    from verifiers.v1.session import RolloutLimits
    from verifiers.v1.task import Task, TaskData
    from verifiers.v1.trace import Trace
    from verifiers.v1.types import AssistantMessage, Request, Response, ToolMessage
    from verifiers.v1.utils.decorators import intercept, stop

    class ProgramHarness(Harness[HarnessConfig]):
        """Runs PROGRAM in the rollout's runtime against the endpoint verifiers hands it."""

        NEEDS_CONTAINER = False
        EXECUTES_CODE = False

        async def launch(
            self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str, mcp_urls: Any, data: Any, tool_interception_url: str | None = None, **kw: Any
        ) -> Any:
            mode, prompt, turns = data.prompt.split("|")
            env = {"OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": secret}
            if tool_interception_url:
                env["TOOL_GATE_URL"] = tool_interception_url
            # `run_program` in verifiers 0.4.0; `run` after it.
            run = getattr(runtime, "run_program", None) or runtime.run
            result = await run([sys.executable, "-c", PROGRAM, mode, prompt, turns], env)
            trace.info["program"] = result.stdout.strip()
            return result

    class TrimmingHarness(ProgramHarness):
        """The program re-sends its Chat Completions replies trimmed (the `trailing`
        prompt): its replay view trims them too, over that dialect only, so the re-sent
        turn matches the node it came from (verifiers after 0.4.0 passes the dialect)."""

        def replay_view(self, message: Any, dialect: Any) -> Any:
            content = getattr(message, "content", None)
            if dialect == "chat_completions" and getattr(message, "role", None) == "assistant" and isinstance(content, str):
                return message.model_copy(update={"content": content.strip()})
            return message

    class GatedHarness(ProgramHarness):
        """The same program, handed the rollout's tool gate: it asks `/tool` before it
        runs a tool call."""

        SUPPORTS_TOOL_INTERCEPTION = True

    class ScriptTask(Task[TaskData, Any, Any]):
        pass

    class GatedTask(Task[TaskData, Any, Any]):
        """A request interceptor that replaces every new tool result: with a gating
        harness, verifiers denies the call at the gate and the model sees the policy's
        result in its place."""

        @intercept
        def deny_tools(self, request: Request) -> Request | None:
            last = request.messages[-1]
            if not isinstance(last, ToolMessage) or last.content == DENIED:
                return None
            return request.model_copy(update={"messages": [*request.messages[:-1], last.model_copy(update={"content": DENIED})]})

    class StoppingTask(Task[TaskData, Any, Any]):
        @stop
        def two_turns(self, trace: Trace) -> bool:
            return trace.num_turns >= 2

    class RewritingTask(Task[TaskData, Any, Any]):
        """A response interceptor (upper-cases every reply) and a response `@stop` (on
        the third reply): intercept holds responses for these."""

        @intercept
        def shout(self, response: Response) -> Response | None:
            text = response.message.content or ""
            return response.model_copy(update={"message": AssistantMessage(content=text.upper())})

        @stop
        def third_reply(self, response: Response) -> bool:
            return "REPLY 2" in (response.message.content or "")

    # Resolved here: verifiers reads the hooks' annotations to pick their boundary.
    StoppingTask.two_turns.__annotations__ = {"trace": Trace, "return": bool}
    RewritingTask.shout.__annotations__ = {"response": Response, "return": Response | None}
    RewritingTask.third_reply.__annotations__ = {"response": Response, "return": bool}
    GatedTask.deny_tools.__annotations__ = {"request": Request, "return": Request | None}

    return {
        "ModelContext": ModelContext,
        "AgentConfig": AgentConfig,
        "EvalClientConfig": EvalClientConfig,
        "HarnessConfig": HarnessConfig,
        "ProgramHarness": ProgramHarness,
        "GatedHarness": GatedHarness,
        "TrimmingHarness": TrimmingHarness,
        "GatedTask": GatedTask,
        "Rollout": Rollout,
        "RolloutTimeouts": RolloutTimeouts,
        "SubprocessConfig": SubprocessConfig,
        "RolloutLimits": RolloutLimits,
        "ScriptTask": ScriptTask,
        "StoppingTask": StoppingTask,
        "RewritingTask": RewritingTask,
        "TaskData": TaskData,
        "SamplingConfig": sampling_config(),
    }


async def run_rollout(
    interception: Any,
    upstream: str,
    mode: str,
    prompt: str,
    *,
    turns: int = 3,
    task: str = "ScriptTask",
    harness: str = "ProgramHarness",
    max_turns: int | None = None,
    temperature: float = 0.5,
) -> Any:
    """One rollout of verifiers' own `Rollout`, driven as `Agent._run_once` drives it."""
    vf = verifiers_parts()
    ctx = vf["ModelContext"](
        model="policy",
        client=vf["EvalClientConfig"](base_url=upstream, api_key_var="SCRIPTED_MODEL_KEY"),
        sampling=vf["SamplingConfig"](temperature=temperature),
    )
    run = vf["Rollout"](
        task=vf[task](vf["TaskData"](prompt=f"{mode}|{prompt}|{turns}")),
        agent_config=vf["AgentConfig"](runtime=vf["SubprocessConfig"]()),
        harness=vf[harness](vf["HarnessConfig"]()),
        ctx=ctx,
        runtime_config=vf["SubprocessConfig"](),
        timeouts=vf["RolloutTimeouts"](),
        limits=vf["RolloutLimits"](max_turns=max_turns),
        interception=interception,
    )
    try:
        if await run.open():
            await run.step()
            if run.ok:
                run.trace.stop("agent_completed")
        return await run.close()
    except BaseException:
        await run.abort()
        raise


def make_session(upstream: str, i: int, state: Any = None) -> Any:
    """A verifiers `RolloutSession` built directly (as a `Rollout` builds it), for driving
    an interception from in-process clients."""
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.runtimes import SubprocessConfig
    from verifiers.v1.session import RolloutSession
    from verifiers.v1.task import TaskData
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask

    SamplingConfig = sampling_config()

    ctx = ModelContext(model="policy", client=EvalClientConfig(base_url=upstream, api_key_var="SCRIPTED_MODEL_KEY"), sampling=SamplingConfig(temperature=0.5))
    data = TaskData(prompt=f"task {i}")
    extra = {} if state is None else {"state": state}
    trace = Trace(task=TraceTask(type="Bench", data=data, key=str(i), hash=str(i)), agent=AgentInfo(config=AgentConfig(runtime=SubprocessConfig())), **extra)
    return RolloutSession(ctx=ctx, trace=trace)


def normal(trace: Any) -> dict[str, Any]:
    """What must agree between two runs of a rollout: not ids, not timings."""

    def msg(m: Any) -> Any:
        return m.model_dump(mode="json", exclude_none=True)

    return {
        "nodes": [
            {"parent": n.parent, "message": msg(n.message), "sampled": n.sampled, "tools": [t.model_dump(mode="json") for t in n.tools]}
            for n in trace.nodes
        ],
        "calls": [
            {
                "node": c.node,
                "model": c.model,
                "sampling": c.sampling.model_dump(mode="json", exclude_none=True) if c.sampling is not None else None,
                "endpoint": c.endpoint,
                "finish_reason": c.finish_reason,
                "usage": c.usage.model_dump(mode="json") if c.usage is not None else None,
                "error": (c.error.type, c.error.status_code) if c.error is not None else None,
                "policy": c.policy.model_dump(mode="json") if c.policy is not None else None,
                "acp": c.acp.model_dump(mode="json") if c.acp is not None else None,
            }
            for c in trace.calls
        ],
        "branches": [[msg(m) for m in b.messages] for b in trace.branches],
        "messages": [msg(m) for m in trace.messages],
        "tools": [t.model_dump(mode="json") for t in trace.tools],
        "num_turns": trace.num_turns,
        "last_reply": trace.last_reply,
        "stop_condition": trace.stop_condition,
        "is_truncated": trace.is_truncated,
        "is_completed": trace.is_completed,
        "errors": [e.type for e in trace.errors],
        "request_rewrites": [r.handler for r in trace.request_rewrites],
        "response_rewrites": [r.handler for r in trace.response_rewrites],
        "num_input_tokens": trace.num_input_tokens,
        "num_output_tokens": trace.num_output_tokens,
    }


def now() -> float:
    return time.perf_counter()
