"""Benchmark window selection and micro compaction on large chats.

Run: ``.venv/bin/python bench/bench_select.py`` (from the repository root). Prints the
median and best wall time of several runs per case. Target: select_messages on 10,000
messages under 20 ms.

Cases:
* ``fast path`` — limits the chat already satisfies (estimates, then a copy);
* ``tokens 25%`` — a token budget of a quarter of the chat: all four stages do real work;
* ``tokens+100 msgs`` — the same plus the reference default of 100 messages;
* ``128k window`` — the budget derived for a 128k-token model with 8k output reserve;
* ``micro_compact`` — keep_recent=10 over the whole chat.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chat.core.compact import micro_compact  # noqa: E402
from chat.core.messages import ChatMessage, Role, ToolCall  # noqa: E402
from chat.core.tokens import estimate_tokens  # noqa: E402
from chat.core.window import limits_for_context_window, select_messages  # noqa: E402

RUNS = 15
TOOLS = ["read_file", "shell", "search", "write_file", "web_fetch", "delegate"]
ENGLISH = [
    "the",
    "agent",
    "reads",
    "a",
    "file",
    "then",
    "runs",
    "the",
    "tests",
    "and",
    "fixes",
    "what",
    "failed",
    "def",
    "return",
]
CHINESE = list("请帮我修复这个测试文件的错误然后运行")


def text(rng: random.Random, chars: int, chinese_share: float) -> str:
    """ASCII prose/code, or (with probability ``chinese_share``) Chinese mixed with ASCII."""
    if rng.random() < chinese_share:
        pieces = rng.choices(CHINESE * 3 + ENGLISH, k=max(1, chars // 3))
        return "".join(pieces)[:chars]
    words: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(ENGLISH)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def result_size(rng: random.Random) -> int:
    # Mostly small results, a long tail of big file reads and command outputs.
    return min(40_000, int(rng.lognormvariate(6.5, 1.3)))


def build_chat(message_count: int, chinese_share: float = 0.3, seed: int = 7) -> list[ChatMessage]:
    """Requests, tool rounds and answers; ``chinese_share`` of prose (a third of that for
    tool output) is non-ASCII."""
    rng = random.Random(seed)
    prose, output = chinese_share, chinese_share / 3

    def make(chars: int, share: float) -> str:
        return text(rng, chars, share)

    messages: list[ChatMessage] = [ChatMessage(role=Role.SYSTEM, content=make(400, 0))]
    serial = 0
    while len(messages) < message_count:
        messages.append(ChatMessage(role=Role.USER, content=make(rng.randint(20, 600), prose)))
        for _ in range(rng.randint(0, 4)):  # tool rounds for this request
            calls = []
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                serial += 1
                calls.append(ToolCall(f"call_{serial}", rng.choice(TOOLS), '{"path": "a.py"}'))
            messages.append(ChatMessage(role=Role.ASSISTANT, content="", tool_calls=calls))
            for call in calls:
                messages.append(
                    ChatMessage(
                        role=Role.TOOL,
                        content=make(result_size(rng), output),
                        tool_call_id=call.id,
                    )
                )
        messages.append(
            ChatMessage(
                role=Role.ASSISTANT,
                content=make(rng.randint(50, 2_000), prose),
                reasoning_content=make(300, prose) if rng.random() < 0.3 else None,
            )
        )
    return messages  # may end a few messages past message_count: groups are never cut


def timings_ms(action: Callable[[], object]) -> tuple[float, float]:
    """(median, best) of RUNS runs: the best shows the cost without scheduler noise."""
    timings = []
    for _ in range(RUNS):
        start = time.perf_counter()
        action()
        timings.append((time.perf_counter() - start) * 1000)
    return statistics.median(timings), min(timings)


def report(label: str, chat: list[ChatMessage]) -> None:
    total = estimate_tokens(chat)
    cases: list[tuple[str, dict[str, int]]] = [
        ("fast path", {"max_messages": 0, "max_tokens": total + 1}),
        ("tokens 25%", {"max_tokens": total // 4}),
        ("tokens+100 msgs", {"max_tokens": total // 4, "max_messages": 100}),
        ("128k window", {"max_tokens": limits_for_context_window(128_000, 8_000)}),
    ]
    rows: list[tuple[str, int, tuple[float, float]]] = []
    for name, limits in cases:
        kept = len(select_messages(chat, **limits))
        rows.append((name, kept, timings_ms(lambda limits=limits: select_messages(chat, **limits))))
    _, replaced = micro_compact(chat)
    rows.append(("micro_compact", replaced, timings_ms(lambda: micro_compact(chat))))
    for name, kept, (median, best) in rows:
        print(
            f"{label:<8} {len(chat):>9} {total:>10}  {name:<16} {kept:>6} {median:>8.2f} {best:>8.2f}"
        )


def main() -> None:
    print(f"{RUNS} runs each; 'kept' = messages out (micro_compact: results replaced)")
    header = f"{'content':<8} {'messages':>9} {'tokens':>10}  {'case':<16} {'kept':>6}"
    print(f"{header} {'median ms':>8} {'best ms':>8}")
    report("mixed", build_chat(1_000))
    report("mixed", build_chat(10_000))
    report("all CJK", build_chat(10_000, chinese_share=1.0))


if __name__ == "__main__":
    main()
