"""Follow one run of a chat as typed run events, for the HTTP API.

The database is the source of truth: display events are read after the last
``seq`` seen. The channel layer is only a doorbell that wakes the follower early
and carries coalesced snapshots of the reply being streamed, from which the
``delta`` / ``thinking_delta`` events are derived; a lost doorbell costs latency,
never text, because the written message completes whatever the snapshots missed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from channels.db import database_sync_to_async

from chat import store
from chat.agent.events import TERMINAL_TYPES
from chat.core.voices import Voices, VoiceSplitter
from chat.live.doorbell import chat_group
from chat.live.layers import live_layer
from chat.store import StoredEvent

POLL_SECONDS = 1.0
BATCH = 500


@dataclass
class RunFollower:
    """Turns display events and stream snapshots into the typed events of one run.

    The run is known up front (``run_id``) or found by the ``input_taken`` event that
    took the user's message (``input_seq``).
    """

    chat_id: str
    last_seq: int
    input_seq: int | None = None
    run_id: str | None = None
    # Per (stream round, voice): (text, reasoning) already sent as deltas.
    sent: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)
    flushed_round: int = -1
    done: bool = False
    # A resumed stream: what of each reply (round, voice) the client had (text, reasoning
    # lengths), from its Last-Event-ID; taken up when the reply shows up again.
    resumed: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    # The SSE id of each event produced (by the event's identity), taken when it is sent.
    ids: dict[int, str] = field(default_factory=dict)

    def _out(self, out: list[dict[str, Any]], item: dict[str, Any]) -> None:
        """Produce ``item``, noting the id to resume after it as things stand now."""
        out.append(item)
        self.ids[id(item)] = self.event_id()

    def take_id(self, item: dict[str, Any]) -> str:
        return self.ids.pop(id(item), str(self.last_seq))

    def event_id(self) -> str:
        """The SSE id of the event just produced: the seq, then what of each reply still
        streaming was sent (``<seq>`` or ``<seq>_<round>.<voice>.<text>.<reasoning>…``).

        A client that sends it back as ``Last-Event-ID`` resumes with no event twice.
        """
        parts = [str(self.last_seq)]
        for (round_, voice), (text, reasoning) in sorted(self.sent.items()):
            if round_ > self.flushed_round:
                parts.append(f"{round_}.{voice}.{len(text)}.{len(reasoning)}")
        return "_".join(parts)

    @classmethod
    def resuming(cls, chat_id: str, run_id: str, last_event_id: str) -> RunFollower:
        """A follower carrying on after ``last_event_id`` (ValueError if it is not one)."""
        seq, *replies = last_event_id.strip().split("_")
        follower = cls(chat_id=chat_id, last_seq=int(seq), run_id=run_id)
        if follower.last_seq < 0 or len(replies) > 64:
            raise ValueError(last_event_id)
        for reply in replies:
            round_, voice, text, reasoning = (int(n) for n in reply.split("."))
            follower.resumed[(round_, voice)] = (text, reasoning)
        return follower

    def apply_events(self, events: list[StoredEvent]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in events:
            self.last_seq = event.seq
            if self.done:
                break
            payload = event.payload
            if (
                self.run_id is None
                and event.kind == "input_taken"
                and payload.get("input_seq") == self.input_seq
            ):
                self.run_id = payload.get("run_id")
            if self.run_id is None:
                continue
            if event.kind == "msg":
                out += self._flush_message(event)
                continue
            if payload.get("run_id") != self.run_id:
                continue
            if event.kind in TERMINAL_TYPES:
                self.done = True
            self._out(out, {**payload, "seq": event.seq})
        return out

    def apply_snapshot(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        if self.run_id is None or message.get("run_id") != self.run_id:
            return []
        round_ = int(message.get("round", 0))
        if round_ <= self.flushed_round:
            return []  # a late snapshot of a reply already written
        text, reasoning = message.get("text") or "", message.get("reasoning") or ""
        voices = Voices.from_names(message.get("speakers"))
        if voices is None:
            return self._deltas((round_, -1), text, reasoning)
        splitter = VoiceSplitter(voices)
        splitter.feed(text)
        out = self._deltas((round_, -1), "", reasoning)
        for index, (speaker, said) in enumerate(splitter.replies()):
            out += self._deltas((round_, index), said, "", speaker=speaker)
        return out

    def _flush_message(self, event: StoredEvent) -> list[dict[str, Any]]:
        payload = event.payload
        extra = payload.get("extra") or {}
        voice = extra.get("voice")
        if (
            payload.get("role") != "assistant"
            or (payload.get("sender_name") and voice is None)  # a sub-agent's message
            or extra.get("run_id") != self.run_id
        ):
            return []
        round_ = int(extra.get("round", 0))
        reasoning = payload.get("reasoning_content") or ""
        if voice is None:
            out = self._deltas((round_, -1), payload.get("content") or "", reasoning)
        else:
            out = self._deltas((round_, -1), "", reasoning) if reasoning else []
            out += self._deltas(
                (round_, int(voice)),
                payload.get("content") or "",
                "",
                speaker=payload["sender_name"],
            )
        self.flushed_round = max(self.flushed_round, round_)
        return out

    def _deltas(
        self, key: tuple[int, int], text: str, reasoning: str, *, speaker: str = ""
    ) -> list[dict[str, Any]]:
        """What of ``text``/``reasoning`` (one reply so far) was not sent yet.

        ``key`` is (round, voice): one reply of the main agent has voice -1; a run with
        several speakers has one reply per voice, and its deltas name their speaker.
        """
        if key not in self.sent and key in self.resumed:  # the client had this much
            text_len, reasoning_len = self.resumed.pop(key)
            self.sent[key] = (text[:text_len], reasoning[:reasoning_len])
        sent_text, sent_reasoning = self.sent.get(key, ("", ""))
        out: list[dict[str, Any]] = []
        common: dict[str, Any] = {
            "chat_id": self.chat_id,
            "run_id": self.run_id,
            "seq": self.last_seq,
        }
        if speaker:
            common["speaker"] = speaker
        self.sent[key] = (sent_text, sent_reasoning)
        if reasoning.startswith(sent_reasoning) and len(reasoning) > len(sent_reasoning):
            delta = reasoning[len(sent_reasoning) :]
            self.sent[key] = (sent_text, reasoning)
            self._out(out, {"type": "thinking_delta", **common, "text": delta})
        if text.startswith(sent_text) and len(text) > len(sent_text):
            delta = text[len(sent_text) :]
            self.sent[key] = (text, self.sent[key][1])
            self._out(out, {"type": "delta", **common, "text": delta})
        return out


async def follow_run(follower: RunFollower) -> AsyncIterator[dict[str, Any]]:
    """Yield the run's typed events until its terminal event.

    After each event ``follower.event_id()`` is the id to resume after it.
    """
    layer = live_layer()
    channel = await layer.new_channel()
    group = chat_group(follower.chat_id)
    await layer.group_add(group, channel)
    read = database_sync_to_async(store.display_events_after)
    receiving: asyncio.Future | None = None
    try:
        while not follower.done:
            events = await read(follower.chat_id, follower.last_seq, BATCH)
            for item in follower.apply_events(events):
                yield item
            if follower.done or len(events) == BATCH:
                continue
            # One receive kept across polls: a pub/sub layer unsubscribes a channel
            # whose receive is cancelled, dropping what arrives until the next one.
            if receiving is None:
                receiving = asyncio.ensure_future(layer.receive(channel))
            done, _ = await asyncio.wait({receiving}, timeout=POLL_SECONDS)
            if not done:
                continue
            message, receiving = receiving.result(), None
            if message.get("type") == "chat.stream":
                for item in follower.apply_snapshot(message):
                    yield item
    finally:
        if receiving is not None:
            receiving.cancel()
        await layer.group_discard(group, channel)
