"""The Python records follow the call's field table of the Rust core (`CALL_FIELDS`):
the same fields, and the same ones left out of a line at their defaults."""

from __future__ import annotations

import dataclasses
import json

from intercept import _native
from intercept._records import CallRecord


def _line() -> dict[str, object]:
    return {
        "session": "s", "seq": 0, "dialect": "chat_completions", "endpoint": "/chat/completions",
        "model": "m", "stream": False, "sampling": {}, "request": {"model": "m"}, "response": None,
        "finish_reason": None, "usage": {"prompt_tokens": 1, "completion_tokens": 2,
        "cached_input_tokens": 0, "reasoning_tokens": 0}, "status": 200, "started_at": 1.0,
        "ended_at": 2.0, "ttfb_ms": None, "client_disconnected": False, "error": None, "epoch": 0,
    }


def test_the_record_has_every_field_of_the_table_and_no_other() -> None:
    table = [name for name, _, _ in _native.CALL_FIELDS]
    assert len(table) == len(set(table))
    fields = {f.name for f in dataclasses.fields(CallRecord)} - {"extra"}
    assert fields == set(table)


def test_a_line_at_its_defaults_leaves_out_what_the_table_says() -> None:
    kept = [name for name, omit, _ in _native.CALL_FIELDS if omit != "when_default"]
    line = _line()
    assert list(line) == kept
    record = CallRecord.from_dict(line)
    assert set(record.to_dict()) == set(kept)
    # Each field the table leaves out reads back as its default.
    for name, omit, default in _native.CALL_FIELDS:
        if omit == "when_default":
            assert getattr(record, name) == json.loads(default), name
