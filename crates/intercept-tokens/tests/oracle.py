"""The Python reference the Rust renderers are compared with: PyPI renderers==0.1.12.

Reads one JSON request per line on stdin and writes one JSON answer per line on stdout:

  {"op": "info"}                                   -> versions
  {"op": "encode", "text": ...}                    -> {"ids": [...]}
  {"op": "decode", "ids": [...]}                   -> {"text": ...}
  {"op": "render", "messages", "tools", "add_generation_prompt", ...config}
  {"op": "bridge", "previous_prompt_ids", "previous_completion_ids", "new_messages",
   "tools", ...config}                             -> rendered, or {"none": true}
  {"op": "parse", "completion_ids", "prompt_ids", ...config}

config: "enable_thinking" (bool), "thinking_retention" (null, "tool_cycle", "all"),
"via_verifiers" (bool: messages and tools go through verifiers' Chat dialect first, as
its train client sends them). A rendered answer is {"token_ids", "message_indices",
"sampled_mask"}; an exception is {"error": "..."}.

Usage: python oracle.py TOKENIZER_FOLDER
"""

import json
import sys
import traceback


def main() -> None:
    folder = sys.argv[1]
    import renderers
    from renderers.base import load_tokenizer
    from renderers.configs import Qwen3RendererConfig
    from renderers.qwen3 import Qwen3Renderer

    tok = load_tokenizer(folder)
    cache: dict = {}

    def renderer(req):
        key = (req.get("enable_thinking", True), req.get("thinking_retention"))
        if key not in cache:
            kwargs = {"enable_thinking": key[0]}
            if key[1] is not None:
                kwargs["thinking_retention"] = key[1]
            cache[key] = Qwen3Renderer(tok, Qwen3RendererConfig(**kwargs))
        return cache[key]

    def via_verifiers(req, messages, tools):
        if not req.get("via_verifiers"):
            return messages, tools
        from verifiers.v1.clients.train import tool_to_wire
        from verifiers.v1.dialects.chat import message_to_wire, parse_message, parse_tools

        messages = [message_to_wire(parse_message(m)) for m in messages]
        parsed = parse_tools(tools) if tools else None
        tools = [tool_to_wire(t) for t in parsed] if parsed else None
        return messages, tools

    def fix(s):
        # Lone surrogates (from JSON escapes) cannot be written as UTF-8: U+FFFD, as the
        # Rust side reads them.
        if isinstance(s, str):
            return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return s

    def rendered(r):
        return {
            "token_ids": list(r.token_ids),
            "message_indices": list(r.message_indices),
            "sampled_mask": list(r.sampled_mask),
        }

    def tool_call(tc):
        # verifiers' train client: a string as it is, else json.dumps(arguments or {}).
        parsed = tc.status.value in ("ok", "missing_name")
        if not parsed:
            arguments = None
        elif isinstance(tc.arguments, str):
            arguments = fix(tc.arguments)
        else:
            arguments = json.dumps(tc.arguments or {})
        return {
            "raw": tc.raw,
            "name": fix(tc.name) if isinstance(tc.name, str) else None,
            "arguments": arguments,
            "status": tc.status.value,
            "token_span": list(tc.token_span) if tc.token_span else None,
        }

    def handle(req):
        op = req["op"]
        if op == "info":
            import tokenizers
            import transformers

            return {
                "renderers": renderers.__version__
                if hasattr(renderers, "__version__")
                else __import__("importlib.metadata").metadata.version("renderers"),
                "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__,
                "python": sys.version.split()[0],
            }
        if op == "encode":
            return {"ids": tok.encode(req["text"], add_special_tokens=False)}
        if op == "decode":
            return {"text": tok.decode(req["ids"], skip_special_tokens=False)}
        r = renderer(req)
        if op == "render":
            messages, tools = via_verifiers(req, req["messages"], req.get("tools"))
            return rendered(
                r.render(
                    messages,
                    tools=tools,
                    add_generation_prompt=req["add_generation_prompt"],
                )
            )
        if op == "bridge":
            messages, tools = via_verifiers(req, req["new_messages"], req.get("tools"))
            out = r.bridge_to_next_turn(
                req["previous_prompt_ids"],
                req["previous_completion_ids"],
                messages,
                tools=tools,
            )
            return {"none": True} if out is None else rendered(out)
        if op == "parse":
            p = r.parse_response(req["completion_ids"], prompt_ids=req.get("prompt_ids"))
            return {
                "content": p.content,
                "reasoning_content": p.reasoning_content,
                "tool_calls": [tool_call(tc) for tc in p.tool_calls],
                "reasoning_complete": p.reasoning_complete,
            }
        raise ValueError(f"unknown op {op!r}")

    out = sys.stdout
    print(json.dumps({"ready": True}), file=out, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = handle(json.loads(line))
        except Exception as e:  # the Rust side compares errors too
            answer = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        out.write(json.dumps(answer, ensure_ascii=False) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
