"""The teacher's wall open while a class streams: N students, one wall socket following all.

Run: ``.venv/bin/python bench/bench_wall.py [--clients 40] [--tokens 300] [--tps 30]
[--ramp 10]`` (the options of ``bench_streams.py``; ``--modes redis`` by default: Redis
channel layer, one Daphne, one ``runworker``).

It is ``bench_classroom.py`` (each student's class chat, three personas per reply) with
the class's teacher's wall open on ``/ws/classes/<id>/live/`` through the whole round:

* **chunk → student**: as in bench_streams, from the upstream writing a stamped token to
  the student's socket receiving the first frame that holds it;
* **chunk → wall**: the same for the wall socket (a tile's "writing…" line carries the
  tail of the reply; a token is seen on the wall by the first tile frame holding it);
* **lost on the wall**: per chat, every display event a tile shows (messages, scene
  markers, stops) must reach the wall exactly once, and each tile's ``seq`` cursor must
  reach the chat's last ``seq``; tokens never seen on the wall are counted apart (a
  tile shows a tail of the reply, so a push carrying more than the tail skips some);
* **wall socket CPU**: the round runs twice, without and with the wall; the Daphne
  process's CPU difference per 1,000 streamed tokens is the wall's cost.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_classroom as bc  # noqa: E402
import bench_streams as bs  # noqa: E402

TILE_STREAM_RE = re.compile(rb'id="tile-stream-([0-9a-f-]{36})"[^>]*>(.*?)</p>', re.S)
TILE_ITEMS_RE = re.compile(rb'beforeend:#tile-msgs-([0-9a-f-]{36})">(.*?)</div>', re.S)
TILE_ITEM_SEQ_RE = re.compile(rb'class="tile-item [a-z]+" data-seq="(\d+)"')
TILE_SEQ_RE = re.compile(rb'id="tile-seq-([0-9a-f-]{36})" class="tile-seq" data-seq="(\d+)"')

STATE: dict = {"wall": False, "room": None, "session": "", "frames": [], "rounds": []}


def class_chats(seats: list[bs.Seat]) -> list[str]:
    """bench_classroom's class, plus a logged-in session for its teacher (the wall)."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import (
        BACKEND_SESSION_KEY,
        HASH_SESSION_KEY,
        SESSION_KEY,
        get_user_model,
    )

    from classroom.models import ClassroomChat

    chats = bc.class_chats(seats)
    link = ClassroomChat.objects.select_related("classroom").get(chat_id=chats[0])
    teacher = get_user_model().objects.get(username="bench-teacher")
    session = import_module(settings.SESSION_ENGINE).SessionStore()
    session[SESSION_KEY] = str(teacher.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = teacher.get_session_auth_hash()
    session.create()
    STATE["room"], STATE["session"] = link.classroom_id, session.session_key
    STATE["chats"] = chats
    return chats


_drive = bs.drive_clients


async def drive_with_wall(clients, warm, port, ramp, timeout, mark) -> None:
    frames: list[tuple[float, bytes]] = []
    STATE["frames"] = frames
    wall = reader = None
    if STATE["wall"]:
        wall = await bs.MiniWebSocket.connect(
            port,
            f"/ws/classes/{STATE['room']}/live/",
            {"Origin": f"http://127.0.0.1:{port}", "Cookie": f"sessionid={STATE['session']}"},
        )

        async def read() -> None:
            while (payload := await wall.receive()) is not None:
                frames.append((time.time(), payload))

        reader = asyncio.create_task(read())
        wall.send_text(json.dumps({"action": "resync", "seqs": {}}).encode())
    await _drive(clients, warm, port, ramp, timeout, mark)
    if wall is not None:
        await asyncio.sleep(bs_quiet())
        wall.start_close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reader, 5)
        wall.writer.close()


def bs_quiet() -> float:
    return 3.0  # past the subscriptions' quiet check (2 s): whatever was missed is read


_check = bc.check_class_client


def check_with_wall(client: bs.ClientRun, replies: dict[str, str], check: bs.Check) -> None:
    _check(client, replies, check)
    if not STATE["wall"]:
        return
    from chat import store
    from classroom import wall

    wall_check = STATE.setdefault("wall_check", collections.defaultdict(list))
    sent_text = replies.get(client.prompt) or ""
    sent_at = {int(i): int(t) / 1e6 for i, t in bs.TOKEN_RE.findall(sent_text.encode())}
    chat = client.chat_id.encode()
    shown: set[int] = set()
    items: collections.Counter[int] = collections.Counter()
    cursor = 0
    for received, payload in STATE["frames"]:
        if chat not in payload:
            continue
        for chat_id, body in TILE_STREAM_RE.findall(payload):
            if chat_id != chat:
                continue
            for index, _stamp in bs.TOKEN_RE.findall(body):
                index = int(index)
                if index in sent_at and index not in shown:
                    shown.add(index)
                    wall_check["latency_ms"].append((received - sent_at[index]) * 1000)
        for chat_id, body in TILE_ITEMS_RE.findall(payload):
            if chat_id == chat:
                for seq in TILE_ITEM_SEQ_RE.findall(body):
                    items[int(seq)] += 1
        for chat_id, seq in TILE_SEQ_RE.findall(payload):
            if chat_id == chat:
                cursor = max(cursor, int(seq))
    events = store.display_events_after(client.chat_id, 0)
    expected = {e.seq for e in events if wall.tile_item(e, "s") is not None}
    wall_check["tokens"].append(len(sent_at))
    wall_check["tokens_unseen"].append(len(sent_at) - len(shown))
    wall_check["items_lost"].append(len(expected - set(items)))
    wall_check["items_duplicated"].append(sum(n - 1 for n in items.values() if n > 1))
    wall_check["cursor_behind"].append(max(0, (events[-1].seq if events else 0) - cursor))


_run_round = bs.run_round


def run_round_twice(mode, interval, seats, args, db_env, workdir, upstream):
    """Without the wall, then with it (new class chats each time); the second is reported."""
    load, began = [os.getloadavg()[0]], time.time()
    STATE["wall"] = False
    without = _run_round(mode, interval, seats, args, db_env, workdir, upstream)
    load.append(os.getloadavg()[0])
    for name in ("daphne", "worker"):  # --cprofile: keep the first round's apart
        for suffix in ("pstats", "db.pstats"):
            kept = Path(f"/tmp/{name}-{mode}-{interval}.{suffix}")
            if kept.exists() and kept.stat().st_mtime >= began:  # this round's
                kept.replace(kept.with_name(f"{name}-{mode}-{interval}-without-wall.{suffix}"))
    STATE["wall"] = True
    STATE["wall_check"] = collections.defaultdict(list)
    with_wall = _run_round(mode, interval, seats, args, db_env, workdir, upstream)
    load.append(os.getloadavg()[0])
    STATE["rounds"].append((without, with_wall, dict(STATE["wall_check"]), load))
    return with_wall


def report() -> None:
    for without, with_wall, wall_check, load in STATE["rounds"]:
        latencies = wall_check.get("latency_ms", [])
        tokens = sum(wall_check.get("tokens", [])) or 1
        daphne = next(k for k in with_wall.cpu if k.startswith("daphne") and "main" not in k)
        cpu_without = without.cpu[daphne] * 1e6 / tokens
        cpu_with = with_wall.cpu[daphne] * 1e6 / tokens
        loop_without = without.cpu.get(f"{daphne} main thread", 0) * 1e6 / tokens
        loop_with = with_wall.cpu.get(f"{daphne} main thread", 0) * 1e6 / tokens
        student = with_wall.check.latencies_ms
        print(f"\n== the wall: {with_wall.clients} students streaming, one wall socket open")
        print(
            "   load average (1 min): {:.2f} before, {:.2f} between the rounds, {:.2f} after".format(
                *load
            )
        )
        print(
            f"   chunk → student p50/p95/max  {bs.percentile(student, 50):7.1f} /"
            f" {bs.percentile(student, 95):7.1f} / {max(student or [0]):7.1f} ms"
            f"  (without the wall: p95 {bs.percentile(without.check.latencies_ms, 95):.1f} ms)"
        )
        print(
            f"   chunk → wall    p50/p95/max  {bs.percentile(latencies, 50):7.1f} /"
            f" {bs.percentile(latencies, 95):7.1f} / {max(latencies or [0]):7.1f} ms"
            f"  ({len(latencies)} tokens seen on the wall)"
        )
        print(
            f"   lost on the wall: {sum(wall_check.get('items_lost', []))} items, "
            f"{sum(wall_check.get('items_duplicated', []))} duplicated, "
            f"{sum(wall_check.get('cursor_behind', []))} seqs behind; "
            f"tokens never in a tile's tail: {sum(wall_check.get('tokens_unseen', []))}"
            f" of {tokens}"
        )
        print(
            f"   lost for the students: {with_wall.check.events_lost} events, "
            f"{with_wall.check.events_duplicated} duplicated, "
            f"{with_wall.check.tokens_unseen} tokens unseen, "
            f"{with_wall.check.text_mismatches} texts differ"
        )
        print(
            f"   Daphne CPU per 1k tokens: {cpu_with:.1f} ms with the wall, "
            f"{cpu_without:.1f} ms without: the wall socket ≈ {cpu_with - cpu_without:.1f} ms"
            " per 1k tokens (two runs on a shared box: noisy)"
        )
        print(
            f"   of which Daphne's event loop: {loop_with:.1f} ms with the wall, "
            f"{loop_without:.1f} ms without (≈ {loop_with - loop_without:.1f} ms per 1k tokens)"
        )


def main(argv: list[str]) -> None:
    if argv[:1] == ["--serve"]:
        bs.main(argv)
        return
    bs.fake_upstream = bc.voiced_upstream
    bs.new_chats = class_chats
    bs.check_client = check_with_wall
    bs.drive_clients = drive_with_wall
    bs.run_round = run_round_twice
    defaults = {"--clients": "40", "--ramp": "10", "--modes": "redis"}
    for option, value in defaults.items():
        if option not in argv:
            argv = [*argv, option, value]
    print(f"bench_wall: one class, {bc.CAST} answer every message, the teacher's wall open")
    bs.main(argv)
    report()


if __name__ == "__main__":
    main(sys.argv[1:])
