"""CPU per streamed token of the streaming path's pieces, offline, each thread's own CPU.

Run: ``.venv/bin/python bench/bench_tokpath.py [--per-read 3] [--replies 60]``

The reply is ``bench_streams.py``'s (``tests.fakeopenai.bench_script(300, markdown=True,
stamp=True)``), its SSE events cut into reads of ``--per-read`` events (at 30 tokens/s
and the 0.1 s paced reads, three a read), with one push per read as the server makes
them. Each row is microseconds of ``time.thread_time()`` per token, three measurements:

* ``decode``    SSE → chunk dicts → deltas (``SSEDecoder``, ``ChunkDecoder``,
  ``StreamAccumulator``), as the provider reads;
* ``render``    ``StreamingMarkdown.render`` at each push, then ``render_final``;
* ``slot``      ``fragments.stream_slot`` of each push's HTML;
* ``dispatch``  a snapshot from ``group_send`` on the in-memory layer to a consumer's
  handler (a ``DirectDispatch`` consumer), and the same through Channels' own loop
  (``await_many_dispatch``: a task and an ``asyncio.wait`` per message).

What the socket, the event loop and the database thread add is ``bench_streams.py``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchdb import django_database  # noqa: E402


def reads_of_reply(per_read: int) -> tuple[list[bytes], list[str]]:
    from tests.fakeopenai import bench_script

    pieces = [
        p.replace("{t}", "1764600000000000")
        for p in bench_script(300, markdown=True, stamp=True).tokens
    ]

    def event(delta: dict, finish: str | None = None) -> str:
        chunk = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "fake-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return "data: " + json.dumps(chunk, separators=(",", ":")) + "\n\n"

    events = [event({"role": "assistant", "content": ""})]
    events += [event({"content": p}) for p in pieces]
    events += [event({}, "stop"), "data: [DONE]\n\n"]
    reads = ["".join(events[i : i + per_read]).encode() for i in range(0, len(events), per_read)]
    return reads, pieces


def per_token(run, tokens: int) -> float:
    started = time.thread_time()
    run()
    return (time.thread_time() - started) / tokens * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-read", type=int, default=3, help="SSE events a read (3)")
    parser.add_argument("--replies", type=int, default=60, help="replies per measurement (60)")
    args = parser.parse_args()
    with django_database("lyceum-bench-tokpath-", False):
        from channels.consumer import AsyncConsumer
        from channels.layers import channel_layers

        from chat.live.direct import DirectDispatch
        from chat.llm.sse import SSEDecoder
        from chat.llm.wire import ChunkDecoder, StreamAccumulator
        from chat.presentation import fragments
        from chat.presentation.markdown import StreamingMarkdown

        reads, pieces = reads_of_reply(args.per_read)
        tokens = len(pieces) * args.replies
        texts, text = [], ""
        for i in range(0, len(pieces), args.per_read):
            text += "".join(pieces[i : i + args.per_read])
            texts.append(text)

        def decode() -> None:
            for _ in range(args.replies):
                sse, decoder, accumulator = SSEDecoder(), ChunkDecoder(), StreamAccumulator()
                for data in reads:
                    for chunk in decoder.decode_each(sse.feed(data)):
                        accumulator.add(chunk)
                accumulator.finish()

        def render() -> None:
            for _ in range(args.replies):
                stream = StreamingMarkdown()
                for prefix in texts:
                    stream.render(prefix)
                stream.render_final(text)

        pushed = [html for html in map(StreamingMarkdown().render, texts)]

        def slot() -> None:
            for _ in range(args.replies):
                for html in pushed:
                    fragments.stream_slot("5d8f3b36-2f1e-4d8b-9c51-1c8b1f7d2a10", html, "")

        snapshot = {
            "type": "chat.stream",
            "chat_id": "x" * 36,
            "run_id": "y" * 36,
            "round": 0,
            "speakers": [],
            "text": text,
            "reasoning": "",
            "html": pushed[-1],
            "sent_at": 1.0,
        }

        class Direct(DirectDispatch, AsyncConsumer):
            channel_layer_alias = "default"
            handled = 0

            async def chat_stream(self, message: dict) -> None:
                self.handled += 1

        class ChannelsLoop(Direct):
            async def __call__(self, scope, receive, send) -> None:
                await AsyncConsumer.__call__(self, scope, receive, send)

        def dispatch(kind: type[Direct]):
            def run() -> None:
                async def pushes() -> None:
                    channel_layers.backends.pop("default", None)
                    consumer = kind()
                    client: asyncio.Queue = asyncio.Queue()
                    task = asyncio.ensure_future(consumer({"type": "bench"}, client.get, None))
                    while not hasattr(consumer, "channel_name"):
                        await asyncio.sleep(0)
                    await consumer.channel_layer.group_add("chat.1", consumer.channel_name)
                    for n in range(len(texts) * args.replies):
                        await consumer.channel_layer.group_send("chat.1", snapshot)
                        while consumer.handled <= n:  # one snapshot at a time, as pushes come
                            await asyncio.sleep(0)
                    task.cancel()

                asyncio.run(pushes())

            return run

        rows = [
            ("decode", decode),
            ("render", render),
            ("slot", slot),
            ("dispatch (DirectDispatch)", dispatch(Direct)),
            ("dispatch (Channels' loop)", dispatch(ChannelsLoop)),
        ]
        print(f"us of CPU per token, {args.per_read} tokens a read and a push, {tokens} tokens")
        for name, run in rows:
            run()  # warm up
            figures = " / ".join(f"{per_token(run, tokens):.2f}" for _ in range(3))
            print(f"{name:28} {figures}")


if __name__ == "__main__":
    main()
