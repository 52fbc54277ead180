"""A class streaming at once: N students, each reply spoken by three personas in one call.

Run: ``.venv/bin/python bench/bench_classroom.py [--clients 30] [--tokens 300] [--tps 30]
[--ramp 10]`` (the options of ``bench_streams.py``; ``--modes inprocess,redis``).

It is ``bench_streams.py`` with three changes, so the figures read the same way:

* the fake upstream writes its stamped tokens as three tagged segments
  (``<Ada>…</Ada><Maya>…</Maya><Leo>…</Leo>``, ``tests.fakeopenai --voices``);
* each client's chat is that student's class chat (one class per round, made by one
  teacher, the students enrolled with the join code), so runs are set up by the
  classroom (scene, guardrail, cast) and stream one bubble per persona;
* the text check compares each persona's stored message with its segment of what the
  upstream sent, and reads the tokens of every persona bubble the client was sent.

Latency is from the upstream writing a token to the student's socket receiving the
first frame that holds it; lost / duplicated events are checked by ``seq`` exactly as
for plain chats. Compare ``CPU ms / 1k tokens`` with ``bench_streams.py`` run with the
same ``--clients/--tokens/--tps/--ramp`` for a plain chat's cost.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_streams as bs  # noqa: E402

CAST = ["Ada", "Maya", "Leo"]  # the speakers the upstream writes (the preset cast's)


@contextmanager
def voiced_upstream(workdir: Path, tokens: int, tps: float, reply: str) -> Iterator:
    record = workdir / "replies.jsonl"
    command = [sys.executable, "-m", "tests.fakeopenai", "--port", "0", "--tokens", str(tokens)]
    command += ["--tokens-per-second", str(tps), "--stamp", "--record", str(record)]
    command += ["--voices", ",".join(CAST)]
    if reply == "markdown":
        command.append("--markdown")
    env = {**os.environ, "PYTHONPATH": str(bs.ROOT)}
    popen = subprocess.Popen(
        command, cwd=bs.ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    proc = bs.Proc("fake-openai", popen, workdir / "fake-openai.log")
    try:
        assert popen.stdout is not None
        line = popen.stdout.readline().split()
        if len(line) != 2 or line[0] != "READY":
            raise RuntimeError(f"the fake server did not start: {line!r}")
        yield f"http://127.0.0.1:{line[1]}/v1", record, proc
    finally:
        bs.stop_process(proc)


def class_chats(seats: list[bs.Seat]) -> list[str]:
    """A new class (per round), every seat enrolled; each seat's class chat."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from chat.roles import TEACHERS_GROUP
    from classroom import actions

    User = get_user_model()
    teacher, _ = User.objects.get_or_create(username="bench-teacher")
    teacher.groups.add(Group.objects.get_or_create(name=TEACHERS_GROUP)[0])
    room = actions.create_classroom(teacher, title="Bench class", model=bs.MODEL_ALIAS)
    actions.save_scene(teacher, room.pk, title="Scene one", content="# Topic\n\nText.")
    users = User.objects.in_bulk([s.user_id for s in seats])
    chats = []
    for seat in seats:
        actions.join_classroom(users[seat.user_id], room.join_code)
        chats.append(str(actions.open_class_chat(users[seat.user_id], room.pk).chat_id))
    return chats


def check_class_client(client: bs.ClientRun, replies: dict[str, str], check: bs.Check) -> None:
    """bench_streams.check_client, for one reply spoken as one message per persona."""
    from chat import store
    from chat.core.voices import Voices, split_reply
    from chat.presentation import display

    if client.error or not client.done_at:
        check.unfinished += 1
        check.errors.append(f"client {client.seat.index}: {client.error or 'no terminal frame'}")
    events = store.display_events_after(client.chat_id, 0)
    last_seq = events[-1].seq if events else 0
    item_seqs = {e.seq for e in events if display.item_from_event(e) is not None}
    sent_text = replies.get(client.prompt)
    sent_tokens = bs.TOKEN_RE.findall(sent_text.encode()) if sent_text else []
    check.tokens_sent += len(sent_tokens)
    sent_at = {int(i): int(t) / 1e6 for i, t in sent_tokens}
    if sent_at:
        check.reply_starts.append(min(sent_at.values()))
    covered = 0
    seen_items: collections.Counter[int] = collections.Counter()
    shown: set[int] = set()
    final_tokens: dict[int, list] = {}  # item seq -> tokens of that persona's written bubble
    for received, payload in client.frames:
        finals = list(bs.FINAL_REPLY_RE.finditer(payload))
        for token_index, _stamp in bs.TOKEN_RE.findall(payload):
            index = int(token_index)
            if index not in shown and index in sent_at:
                shown.add(index)
                latency = (received - sent_at[index]) * 1000
                check.latencies_ms.append(latency)
                check.sent_and_latency.append((sent_at[index], latency))
                if finals and not payload.count(b'id="stream"'):
                    check.final_only_ms.append(latency)
                if len(shown) == 1:
                    check.first_token_ms.append((received - client.sent_at) * 1000)
        for _dom, seq in bs.ITEM_RE.findall(payload):
            seen_items[int(seq)] += 1
        for marker in bs.MARKER_RE.findall(payload):
            marker = int(marker)
            if marker <= covered:
                check.events_duplicated += 1
            covered = max(covered, marker)
        for final in finals:
            final_tokens[int(final.group(1))] = bs.TOKEN_RE.findall(final.group(0))
    check.tokens_unseen += len(sent_at) - len(shown)
    check.events_lost += max(0, last_seq - covered)
    check.events_lost += len(item_seqs - set(seen_items))
    check.events_duplicated += sum(n - 1 for n in seen_items.values() if n > 1)
    stored = [
        (e.payload.get("sender_name"), e.payload.get("content"))
        for e in events
        if e.kind == "msg" and e.payload.get("role") == "assistant"
    ]
    expected = split_reply(Voices(tuple(CAST)), sent_text) if sent_text else None
    client_tokens = [t for seq in sorted(final_tokens) for t in final_tokens[seq]]
    if expected is None or stored != expected or client_tokens != sent_tokens:
        check.text_mismatches += 1
        check.errors.append(
            f"client {client.seat.index}: text differs (speakers stored "
            f"{[s for s, _ in stored]}, expected {[s for s, _ in expected or []]}; client "
            f"tokens {'same' if client_tokens == sent_tokens else 'different'})"
        )


def main(argv: list[str]) -> None:
    if argv[:1] == ["--serve"]:
        bs.main(argv)
        return
    bs.fake_upstream = voiced_upstream
    bs.new_chats = class_chats
    bs.check_client = check_class_client
    defaults = {"--clients": "30", "--ramp": "10"}
    for option, value in defaults.items():
        if option not in argv:
            argv = [*argv, option, value]
    print(f"bench_classroom: one class, {CAST} answer every message in one call")
    bs.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
