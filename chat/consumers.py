"""The chat socket: one consumer per open chat, at ``/ws/chat/<id>/``.

It does no work itself. Each frame names an action, access is checked again
for every action, and the action functions of ``chat.runs`` do the rest. Pushes
come from the chat's group: the doorbell says "something was written", and the
consumer reads the display events it has not sent yet from the database, so a
lost doorbell costs latency, never an event. Stream snapshots (the reply being
written) go straight to the page.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.http import Http404

from chat import live, runner, runs
from chat.access import ChatAction, access_chat
from chat.dispatch import DirectDispatch
from chat.models import Run
from chatsite.layers import live_layer_alias

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
# When stream snapshots stop for this long, read the log once (see _arm_quiet_check).
QUIET_CHECK_SECONDS = 2.0
# A page that only watches makes no actions to check: its view access is checked again
# before a push once this long has passed since the last check (one query, not one a push).
ACCESS_RECHECK_SECONDS = 10.0
WRITE_ACTIONS = {
    "send",
    "cancel",
    "approve",
    "always",
    "deny",
    "switch_model",
    "compact",
    "regenerate",
    "edit_last",
}


class ChatConsumer(DirectDispatch, AsyncWebsocketConsumer):
    chat_id: str
    last_seq: int | None = None  # None until the page says where it is (resync)
    flushed_round: dict[str, int]
    _reading_events = False
    _read_again = False
    _quiet_check: asyncio.TimerHandle | None = None
    _quiet_task: asyncio.Task | None = None
    _last_snapshot_at = 0.0
    _access_checked_at = 0.0
    _access_lost = False

    @property
    def channel_layer_alias(self) -> str:  # read by Channels as the consumer starts
        return live_layer_alias()

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.chat_id = str(self.scope["url_route"]["kwargs"]["chat_id"])
        if not await self._allowed(ChatAction.VIEW):
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self._access_checked_at = asyncio.get_running_loop().time()
        self.flushed_round = {}
        self.group = runs.chat_group(self.chat_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        runner.ensure_sweeper()

    async def disconnect(self, code: int) -> None:
        if self._quiet_check is not None:
            self._quiet_check.cancel()
        if self._quiet_task is not None:
            self._quiet_task.cancel()
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    # --- frames from the page ---------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        raw = text_data if text_data is not None else (bytes_data or b"").decode("utf-8", "replace")
        if len(raw.encode("utf-8")) > settings.LYCEUM_MAX_FRAME_BYTES:
            await self.send(text_data=live.error_notice("That message is too large to send."))
            return
        try:
            frame = json.loads(raw)
        except (ValueError, RecursionError):  # deep nesting exhausts the parser's stack
            await self.send(text_data=live.error_notice("The page sent something unreadable."))
            return
        if not isinstance(frame, dict):
            await self.send(text_data=live.error_notice("The page sent something unreadable."))
            return
        action = str(frame.get("action") or "")
        handler = getattr(self, f"do_{action}", None) if action.isidentifier() else None
        if handler is None:
            await self.send(text_data=live.error_notice(f"Unknown action “{action[:40]}”."))
            return
        needed = ChatAction.WRITE if action in WRITE_ACTIONS else ChatAction.VIEW
        if not await self._allowed(needed):
            if needed == ChatAction.WRITE and await self._allowed(ChatAction.VIEW):
                # A watcher (say, a teacher) keeps the live view; only the write is refused.
                await self.send(text_data=live.error_notice("You can only watch this chat."))
                return
            await self.send(text_data=live.error_notice("You can no longer use this chat."))
            await self.close(code=CLOSE_FORBIDDEN)
            return
        try:
            await handler(frame)
        except runs.ActionError as exc:
            await self.send(text_data=live.error_notice(exc.message))

    async def _allowed(self, action: ChatAction) -> bool:
        return await database_sync_to_async(self._check_access)(action)

    def _check_access(self, action: ChatAction) -> bool:
        user = self.scope["user"]
        try:
            # The scope's user was read once, at connect: a user deactivated (or deleted)
            # since must not go on acting through a socket opened before.
            user.refresh_from_db(fields=["is_active"])
            access_chat(user, self.chat_id, action)
        except (Http404, ObjectDoesNotExist):
            return False
        return True

    async def do_resync(self, frame: dict[str, Any]) -> None:
        try:
            self.last_seq = max(0, int(frame.get("last_seq", 0)))
        except (TypeError, ValueError, OverflowError):  # OverflowError: 1e999 parses as inf
            self.last_seq = 0
        await self._push_new_events()
        await self._push_current_partial()

    async def do_send(self, frame: dict[str, Any]) -> None:
        user = self.scope["user"]
        result = await database_sync_to_async(runs.send_message)(
            user, self.chat_id, str(frame.get("message") or ""), str(frame.get("client_id") or "")
        )
        await self.send(text_data=live.composer_reset(self.chat_id))
        await runner.dispatch(result.run_id)

    async def do_cancel(self, frame: dict[str, Any]) -> None:
        await database_sync_to_async(runs.cancel_run)(self.scope["user"], self.chat_id)
        # A waiting run ends right here: start what was queued behind it.
        await runner.start_next_run(self.chat_id)

    async def _decide(self, frame: dict[str, Any], *, approve: bool, always: bool = False):
        result = await database_sync_to_async(runs.decide_approval)(
            self.scope["user"],
            self.chat_id,
            str(frame.get("call_id") or ""),
            approve=approve,
            reason=str(frame.get("reason") or ""),
            always=always,
        )
        await runner.dispatch(result.run_id, resume=True)

    async def do_approve(self, frame: dict[str, Any]) -> None:
        await self._decide(frame, approve=True)

    async def do_always(self, frame: dict[str, Any]) -> None:
        await self._decide(frame, approve=True, always=True)

    async def do_deny(self, frame: dict[str, Any]) -> None:
        await self._decide(frame, approve=False)

    async def do_switch_model(self, frame: dict[str, Any]) -> None:
        await database_sync_to_async(runs.switch_model)(
            self.scope["user"], self.chat_id, str(frame.get("model") or "")
        )

    async def do_compact(self, frame: dict[str, Any]) -> None:
        run_id = await database_sync_to_async(runs.request_compaction)(
            self.scope["user"], self.chat_id
        )
        await runner.dispatch(run_id)

    async def do_regenerate(self, frame: dict[str, Any]) -> None:
        run_id = await database_sync_to_async(runs.regenerate)(self.scope["user"], self.chat_id)
        await runner.dispatch(run_id)

    async def do_edit_last(self, frame: dict[str, Any]) -> None:
        result = await database_sync_to_async(runs.edit_last_message)(
            self.scope["user"],
            self.chat_id,
            str(frame.get("message") or ""),
            str(frame.get("client_id") or ""),
        )
        await runner.dispatch(result.run_id)

    # --- pushes ------------------------------------------------------------------------

    async def _may_still_watch(self) -> bool:
        """Whether pushes may go on: access can be taken away while the socket is open.

        Checked again at most every ``ACCESS_RECHECK_SECONDS``; once lost, the socket is
        closed and nothing more is pushed.
        """
        if self._access_lost:
            return False
        now = asyncio.get_running_loop().time()
        if now - self._access_checked_at < ACCESS_RECHECK_SECONDS:
            return True
        self._access_checked_at = now
        if await self._allowed(ChatAction.VIEW):
            return True
        self._access_lost = True
        await self.close(code=CLOSE_FORBIDDEN)
        return False

    async def chat_events(self, event: dict[str, Any]) -> None:
        """Doorbell: display events up to ``seq`` were written (see runs.events_doorbell)."""
        seq = int(event.get("seq", 0))
        if self.last_seq is None or seq <= self.last_seq:
            return
        if not await self._may_still_watch():
            return
        if event.get("after") == self.last_seq and "html" in event and not self._reading_events:
            # The very next events, rendered by the writer: no trip to the database.
            self._note_written_rounds(event.get("rounds") or [])
            self.last_seq = seq
            await self.send(text_data=event["html"])
            return
        await self._push_new_events()

    def _note_written_rounds(self, rounds: list[tuple[str, int]]) -> None:
        for run_id, round_ in rounds:
            self.flushed_round[run_id] = max(self.flushed_round.get(run_id, -1), round_)

    async def chat_stream(self, event: dict[str, Any]) -> None:
        """A snapshot of the reply being streamed."""
        if self.last_seq is None or not await self._may_still_watch():
            return
        run_id = str(event.get("run_id"))
        if int(event.get("round", 0)) <= self.flushed_round.get(run_id, -1):
            return  # that reply was written already
        await self.send(text_data=event["html"])
        self._arm_quiet_check()

    def _arm_quiet_check(self) -> None:
        """Read the log once the stream has gone quiet for a while.

        The doorbell may be dropped under load (a full channel), and when the one that
        announces the written reply is lost, no later frame reveals the gap: the page
        would show the half-streamed text until reloaded. Costs one query per stream end.
        """
        loop = asyncio.get_running_loop()
        self._last_snapshot_at = loop.time()
        if self._quiet_check is None:  # one timer per stream, not one per snapshot
            self._quiet_check = loop.call_later(QUIET_CHECK_SECONDS, self._start_quiet_check)

    def _start_quiet_check(self) -> None:
        loop = asyncio.get_running_loop()
        quiet_for = loop.time() - self._last_snapshot_at
        if quiet_for < QUIET_CHECK_SECONDS:
            remaining = QUIET_CHECK_SECONDS - quiet_for
            self._quiet_check = loop.call_later(remaining, self._start_quiet_check)
            return
        self._quiet_check = None
        self._quiet_task = loop.create_task(self._quiet_push())

    async def _quiet_push(self) -> None:
        try:
            if await self._may_still_watch():
                await self._push_new_events()
        except Exception:  # noqa: BLE001 - a safety net must not take the socket down
            logger.warning("quiet check of chat %s failed", self.chat_id, exc_info=True)

    async def _push_new_events(self) -> None:
        # One reader at a time: a doorbell (or the quiet check) arriving while the log is
        # being read asks for one more read afterwards; a burst of doorbells costs two
        # reads, not one each, and no two readers send the same events.
        if self._reading_events:
            self._read_again = True
            return
        self._reading_events = True
        try:
            self._read_again = True
            while self._read_again:
                self._read_again = False
                await self._push_events_after_last_seq()
        finally:
            self._reading_events = False

    async def _push_events_after_last_seq(self) -> None:
        next_batch = database_sync_to_async(live.next_batch)
        while True:
            events, html = await next_batch(self.chat_id, self.last_seq)
            if not events:
                return
            self._note_written_rounds(live.written_rounds(events))
            self.last_seq = events[-1].seq
            await self.send(text_data=html)
            if len(events) < live.REPLAY_BATCH:
                return

    async def _push_current_partial(self) -> None:
        """A page (re)connecting during a run gets the reply written so far."""
        run = await database_sync_to_async(
            Run.objects.filter(chat_id=self.chat_id, status__in=runs.LIVE).first
        )()
        if run is None:
            return
        if run.status == Run.Status.WAITING:
            # Nothing is being written while the run waits for the user's approval:
            # an empty slot, not a typing indicator (as the live page shows it).
            await self.send(text_data=live.idle_stream_slot() + live.controls(True, self.chat_id))
            return
        text, reasoning = runner.local_partial(str(run.pk)) or (
            run.partial_text,
            run.partial_reasoning,
        )
        await self.send(
            text_data=live.partial_stream_slot(str(run.pk), text, reasoning)
            + live.controls(True, self.chat_id)
        )
