"""`Session(tokens=...)`: the token-in/token-out setting checked in Python, held by the
session (its log header records it) and refused on acquire when the server cannot load it.

The tests that load Qwen3's real tokenizer find it through `INTERCEPT_QWEN3_TOKENIZER` (a
folder): without it they fail under `CI` and are skipped with a notice otherwise.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pytest

import intercept


def qwen3_tokenizer() -> str:
    """Qwen3's tokenizer folder; fails under CI without it, else skips with a notice."""
    path = os.environ.get("INTERCEPT_QWEN3_TOKENIZER", "")
    if not path:
        if os.environ.get("CI"):
            pytest.fail("INTERCEPT_QWEN3_TOKENIZER must name Qwen3's tokenizer folder under CI")
        pytest.skip("notice: INTERCEPT_QWEN3_TOKENIZER is not set (Qwen3's tokenizer folder)")
    return path


def session(tokens: Any, upstream: str = "http://127.0.0.1:1/v1", id: str = "t") -> intercept.Session:
    return intercept.Session(id=id, model="policy", upstream=upstream, tokens=tokens)


def test_wrong_types_raise_type_error_and_bad_values_value_error_naming_the_key() -> None:
    type_errors: list[tuple[Any, str]] = [
        (["qwen3", "/m"], "tokens:"),
        ("qwen3", "tokens:"),
        ({"renderer": 5, "tokenizer": "/m"}, "tokens.renderer"),
        ({"renderer": "qwen3", "tokenizer": 5}, "tokens.tokenizer"),
        ({"renderer": "qwen3", "tokenizer": "/m", "engine": 1}, "tokens.engine"),
        ({"renderer": "qwen3", "tokenizer": "/m", "on_mismatch": True}, "tokens.on_mismatch"),
        ({"renderer": "qwen3", "tokenizer": "/m", "enable_thinking": "no"}, "tokens.enable_thinking"),
    ]
    for tokens, needle in type_errors:
        with pytest.raises(TypeError, match=needle.replace(".", r"\.")):
            session(tokens)
    value_errors: list[tuple[Any, str]] = [
        ({"renderer": "qwen3", "tokenizer": "/m", "engine": "tgi"}, "tokens.engine: 'tgi'"),
        ({"renderer": "qwen3", "tokenizer": "/m", "on_mismatch": "retry"}, "tokens.on_mismatch: 'retry'"),
        ({"renderer": "qwen3", "tokenizer": "/m", "thinking": True}, "unknown key 'thinking'"),
        ({"tokenizer": "/m"}, "'renderer' is required"),
        ({"renderer": "qwen3"}, "'tokenizer' is required"),
        ({"renderer": " ", "tokenizer": "/m"}, "tokens.renderer: must not be empty"),
        ({"renderer": "qwen3", "tokenizer": ""}, "tokens.tokenizer: must not be empty"),
    ]
    for tokens, needle in value_errors:
        with pytest.raises(intercept.InvalidRequestError) as info:
            session(tokens)
        assert isinstance(info.value, ValueError)
        assert needle in str(info.value), str(info.value)
    # The dataclass checks the same way when it is made.
    with pytest.raises(intercept.InvalidRequestError, match="tokens.engine"):
        intercept.Tokens("qwen3", "/m", engine="tgi")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tokens.enable_thinking"):
        intercept.Tokens("qwen3", "/m", enable_thinking=1)  # type: ignore[arg-type]


def test_a_dict_and_the_dataclass_give_the_same_setting() -> None:
    path = pathlib.Path("/models/qwen3")
    typed = intercept.Tokens("qwen3", path, engine="sglang", enable_thinking=False)
    assert typed.to_dict() == {
        "renderer": "qwen3",
        "tokenizer": "/models/qwen3",
        "engine": "sglang",
        "on_mismatch": "render",
        "enable_thinking": False,
    }
    from_dict = intercept.Tokens.from_mapping({"renderer": "qwen3", "tokenizer": "/models/qwen3", "engine": "sglang", "enable_thinking": False})
    assert from_dict.to_dict() == typed.to_dict()
    # Without tokens a session has none.
    assert session(None).tokens is None


async def test_the_setting_reaches_the_session_and_its_log_header(server, mock) -> None:
    tokenizer = qwen3_tokenizer()
    typed = session(intercept.Tokens("qwen3", tokenizer, on_mismatch="fail", enable_thinking=False), upstream=mock.base_url, id="typed")
    plain = session({"renderer": "qwen3", "tokenizer": tokenizer}, upstream=mock.base_url, id="plain")
    for s, expected in (
        (typed, {"renderer": "qwen3", "tokenizer": tokenizer, "engine": "vllm", "on_mismatch": "fail", "enable_thinking": False}),
        (plain, {"renderer": "qwen3", "tokenizer": tokenizer, "engine": "vllm", "on_mismatch": "render"}),
    ):
        async with server.acquire(s):
            assert s.tokens is not None and s.tokens.to_dict() == expected
            # The log's header records the session's settings, tokens among them.
            header = json.loads(s._native.log().header_json())
            assert header["settings"]["tokens"] == expected, header


async def test_a_bad_tokenizer_path_is_refused_on_acquire_naming_it(server, tmp_path) -> None:
    missing = str(tmp_path / "no-such-tokenizer")
    s = session(intercept.Tokens("qwen3", missing))
    with pytest.raises(intercept.InvalidRequestError) as info:
        await server.acquire(s)
    assert missing in info.value.message and "tokens.tokenizer" in info.value.message
    assert info.value.status == 400
    assert server.load == 0


async def test_an_unknown_renderer_is_refused_on_acquire_naming_it(server) -> None:
    s = session({"renderer": "llama9", "tokenizer": qwen3_tokenizer()})
    with pytest.raises(intercept.InvalidRequestError, match="llama9"):
        await server.acquire(s)
    assert server.load == 0
