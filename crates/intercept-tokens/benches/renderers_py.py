"""Times renderers 0.1.12's Qwen3Renderer on the tool loop the Rust bench wrote.

Usage: python renderers_py.py TOOL_LOOP_JSON TOKENIZER_FOLDER

Per measured turn t: the bridge that makes turn t's prompt from turn t-1's prompt,
completion and tool result, plus the parse of turn t's completion (what verifiers' train
client runs per turn); and the full render of the conversation at the last turn. Prints
a line per number, then one JSON report (the Rust bench reads the last line).
"""

import json
import sys
import time


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def timed(fn, budget=0.5, minimum=10):
    """Mean wall and CPU time of fn() over about `budget` seconds."""
    fn()
    n = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while n < minimum or time.perf_counter() - wall0 < budget:
        fn()
        n += 1
    return (time.perf_counter() - wall0) / n, (time.process_time() - cpu0) / n


def main() -> None:
    data_path, folder = sys.argv[1], sys.argv[2]
    with open(data_path) as f:
        data = json.load(f)

    rss0 = rss_bytes()
    t0 = time.perf_counter()
    from renderers.base import load_tokenizer
    from renderers.configs import Qwen3RendererConfig
    from renderers.qwen3 import Qwen3Renderer

    tok = load_tokenizer(folder)
    r = Qwen3Renderer(tok, Qwen3RendererConfig())
    load_ms = (time.perf_counter() - t0) * 1e3
    rss = rss_bytes() - rss0

    tools = data["tools"]
    turns = data["turns"]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    start = [
        {"role": "system", "content": data["system"]},
        {"role": "user", "content": data["task"]},
    ]

    def tool(k):
        t = turns[k]
        return {"role": "tool", "tool_call_id": t["call_id"], "content": t["result"]}

    completions = [
        tok.encode(t["completion"], add_special_tokens=False) + [im_end] for t in turns
    ]
    prompts = [r.render_ids(start, tools=tools, add_generation_prompt=True)]
    for k in range(1, len(turns)):
        b = r.bridge_to_next_turn(prompts[k - 1], completions[k - 1], [tool(k - 1)], tools=tools)
        prompts.append(b.token_ids)

    turn_us, turn_cpu_us = [], []
    for k in data["measured"]:
        tail = [tool(k - 1)]

        def turn():
            b = r.bridge_to_next_turn(prompts[k - 1], completions[k - 1], tail, tools=tools)
            r.parse_response(completions[k], tools=tools, prompt_ids=b.token_ids)

        wall, cpu = timed(turn)
        turn_us.append(wall * 1e6)
        turn_cpu_us.append(cpu * 1e6)
        print(f"python turn {k:>2}: bridge+parse {wall * 1e6:8.1} µs (CPU {cpu * 1e6:.1} µs)")

    last = data["measured"][-1]
    messages = list(start)
    for j in range(last):
        t = turns[j]
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": t["reasoning"],
                "tool_calls": [
                    {
                        "id": t["call_id"],
                        "type": "function",
                        "function": {"name": t["name"], "arguments": t["arguments"]},
                    }
                ],
            }
        )
        messages.append(tool(j))
    full, full_cpu = timed(lambda: r.render(messages, tools=tools, add_generation_prompt=True))
    print(f"python full render at turn {last}: {full * 1e6:.1} µs (CPU {full_cpu * 1e6:.1} µs)")
    print(
        json.dumps(
            {
                "rss_bytes": rss,
                "load_ms": load_ms,
                "turn_us": turn_us,
                "turn_cpu_us": turn_cpu_us,
                "full_render_us": full * 1e6,
                "full_render_cpu_us": full_cpu * 1e6,
                "prompt_ids_at_last_turn": len(prompts[last]),
            }
        )
    )


if __name__ == "__main__":
    main()
