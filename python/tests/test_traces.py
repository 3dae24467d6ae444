"""The record from Python: a session's episode and lazily rebuilt trace in-process, trace
logs written by `intercept serve`/`intercept demo` read back with `read_trace`, and their
Parquet export read by pyarrow and Hugging Face `datasets`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

import intercept


async def test_episode_and_lazy_trace_in_process(server, mock) -> None:
    session = intercept.Session(id="ep", model="m", upstream=mock.base_url)
    async with server.acquire(session) as slot:
        client = openai.AsyncOpenAI(base_url=slot.env["OPENAI_BASE_URL"], api_key=slot.model_secret, max_retries=0)
        async with client:
            messages: list[dict[str, str]] = [{"role": "system", "content": "be brief"}]
            for turn in range(3):
                messages.append({"role": "user", "content": f"turn {turn} " + "x" * 100})
                if turn == 1:
                    text = ""
                    stream = await client.chat.completions.create(model="m", messages=messages, stream=True)  # type: ignore[arg-type]
                    async for chunk in stream:
                        if chunk.choices and chunk.choices[0].delta.content:
                            text += chunk.choices[0].delta.content
                else:
                    r = await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
                    text = r.choices[0].message.content or ""
                messages.append({"role": "assistant", "content": text})
        episode = session.episode()
    assert isinstance(episode, intercept.Episode)
    # system, then (user, answer) three times: each message once, one branch.
    assert len(episode.nodes) == 7
    assert [n.role for n in episode.nodes] == ["system"] + ["user", "assistant"] * 3
    assert [n.sampled for n in episode.nodes] == [False] + [False, True] * 3
    assert len(episode.branches) == 1
    branch = episode.branches[0]
    assert branch.path == list(range(7)) and branch.turns == 3
    assert branch.token_ids is None  # no capture asked
    assert [m["role"] for m in episode.messages(branch)][-1] == "assistant"
    assert episode.summary.calls == 3 and episode.summary.sampled == 3
    # The trace: records rebuilt from the log when read, equal to the JSON trace.
    trace = session.trace()
    assert len(trace.calls) == 3
    assert trace.calls[2].request["messages"] == messages[:-1]
    assert trace.calls[1].stream is True
    assert trace.to_dict() == session.trace_dict()
    assert trace.episode() == episode


def _demo(tmp_path: Path) -> list[Path]:
    out = subprocess.run(
        [sys.executable, "-m", "intercept", "demo", "--rollouts", "3", "--turns", "3", "--trace-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) == 3, files
    return files


def test_logs_written_by_the_sidecar_read_back(tmp_path: Path) -> None:
    for path in _demo(tmp_path):
        log = intercept.read_trace(path)
        assert not log.incomplete and log.skipped == []
        assert log.header is not None and log.header["schema"] == "intercept.trace/3"
        assert log.end is not None and log.end["calls"] == len(log.calls)
        episode = log.episode()
        assert episode.session == log.session == path.stem
        assert episode.branches and all(n.id == i for i, n in enumerate(episode.nodes))
        # `intercept trace cat` prints the same records.
        cat = subprocess.run([sys.executable, "-m", "intercept", "trace", "cat", str(path)], capture_output=True, text=True, timeout=60, cwd=path.parent)
        assert cat.returncode == 0, cat.stderr
        lines = [json.loads(line) for line in cat.stdout.splitlines()]
        assert lines == [c.to_dict() for c in log.calls]
        # A crash mid-line: every whole line stays readable, the log says incomplete.
        text = path.read_bytes()
        torn = path.with_suffix(".torn")
        torn.write_bytes(text[: len(text) - 10])
        cut = intercept.read_trace(torn)
        assert cut.incomplete and cut.end is None
        assert len(cut.calls) == len(log.calls)
        assert [c.to_dict() for c in cut.calls] == [c.to_dict() for c in log.calls]


def test_a_file_that_is_not_a_log_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "full.jsonl"
    path.write_text('{"session": "s", "seq": 0}\n')
    with pytest.raises(intercept.InvalidRequestError) as info:
        intercept.read_trace(path)
    assert "not a trace log" in info.value.message
    with pytest.raises(intercept.InvalidRequestError):
        intercept.read_trace(tmp_path / "missing.jsonl")


MESSAGE_FIELDS = {"role", "content", "reasoning", "tool_calls", "tool_call_id", "state"}


def _as_episode_message(row: dict[str, Any]) -> dict[str, Any]:
    """An exported message as the episode writes it: null and empty fields left out, a
    part's `data` and a call's `arguments` parsed back from their JSON text."""
    out: dict[str, Any] = {"role": row["role"]}
    parts = []
    for part in row["content"]:
        kind = part["type"]
        if kind == "data":
            parts.append({"type": "data", "value": json.loads(part["data"])})
        elif kind == "image":
            parts.append({"type": "image", "url": part["url"]})
        else:
            parts.append({"type": kind, "text": part["text"]})
    if parts:
        out["content"] = parts
    calls = [{"id": c["id"], "name": c["name"], "arguments": json.loads(c["arguments"])} for c in row["tool_calls"]]
    if calls:
        out["tool_calls"] = calls
    for key in ("reasoning", "tool_call_id", "state"):
        if row[key] is not None:
            out[key] = row[key]
    return out


def test_parquet_export_reads_in_pyarrow_and_datasets(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    datasets = pytest.importorskip("datasets")
    files = _demo(tmp_path)
    out = tmp_path / "branches.parquet"
    run = subprocess.run(
        [sys.executable, "-m", "intercept", "trace", "export", "--format", "parquet", "--out", str(out), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    table = pq.read_table(out)
    episodes = [intercept.read_trace(f).episode() for f in files]
    branches = sum(len(e.branches) for e in episodes)
    assert table.num_rows == branches
    assert set(table.column_names) >= {"session", "leaf", "token_ids", "mask", "logprobs", "prompt_len", "completion_tokens", "turns", "messages"}
    # `messages` is nested data: a list of structs, not text.
    kind = table.schema.field("messages").type
    assert pa.types.is_list(kind) and pa.types.is_struct(kind.value_type)
    assert {kind.value_type.field(i).name for i in range(kind.value_type.num_fields)} == MESSAGE_FIELDS
    rows = table.to_pylist()
    assert {r["session"] for r in rows} == {f.stem for f in files}
    # Each row's messages are its branch's path, message for message.
    by_session = {e.session: e for e in episodes}
    for r in rows:
        episode = by_session[r["session"]]
        assert [_as_episode_message(m) for m in r["messages"]] == [episode.nodes[n].message for n in r["path"]]
        assert r["messages"][-1]["role"] == "assistant"

    # Hugging Face datasets: a `messages` feature of dicts with the message's fields.
    ds = datasets.load_dataset("parquet", data_files=str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert len(ds) == branches and ds[0]["session"] in {f.stem for f in files}
    feature = ds.features["messages"]
    item = getattr(feature, "feature", None)
    if item is None and isinstance(feature, list):
        item = feature[0]
    assert isinstance(item, dict) and set(item) == MESSAGE_FIELDS, feature
    assert isinstance(item["role"], datasets.Value) and item["role"].dtype == "string"
    for i in range(len(ds)):
        messages = ds[i]["messages"]
        assert isinstance(messages, list) and all(isinstance(m, dict) and set(m) == MESSAGE_FIELDS for m in messages)
        assert messages == rows[i]["messages"]
    first = ds[0]["messages"][0]
    assert isinstance(first["content"], list) and isinstance(first["content"][0], dict)
    assert first["content"][0]["type"] == "text" and isinstance(first["content"][0]["text"], str)
