"""The teacher's wall socket: one per open wall, at ``/ws/classes/<id>/live/``.

It follows every class chat of the class with one :class:`ChatSubscription` each (the
chat's group ``chat.<id>``, tiles rendered by :mod:`classroom.wall`), so each tile has
a chat page's guarantees: resync by ``seq`` per chat, no gap, no duplicate, access
re-checked. The class's group (``class.<id>``) says when a student joins or opens the
chat (a new tile, a new subscription), when flags change, and when the class's state
(paused, scene) does. Frames from the page name a teacher action; the teacher's
access is checked again for each, and one function of ``classroom.actions`` does it.
``?student=<id>`` follows one student only (the focused view).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.http import Http404
from django.utils import translation
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from chat.access import ChatAction, can_access_chat
from chat.actions import ActionError
from chat.live import subscription as live_subscription
from chat.live.consumers import CLOSE_FORBIDDEN, CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED
from chat.live.direct import DirectDispatch
from chat.live.doorbell import chat_group
from chat.live.language import scope_language
from chat.live.layers import live_layer_alias
from chat.live.subscription import ChatSubscription
from chat.models import ChatSession
from chat.presentation import fragments
from chat.runhost import executor
from classroom import actions, wall
from classroom.access import ClassAction, access_classroom
from classroom.models import Classroom, ClassroomChat, TeacherView

logger = logging.getLogger(__name__)

# The wall re-checks its access to every followed chat in the background, every
# ChatSubscription's ACCESS_RECHECK_SECONDS, this many chats per trip to the database thread.
ACCESS_CHECK_CHUNK = 10


class WallConsumer(DirectDispatch, AsyncWebsocketConsumer):
    classroom_id: int
    student_id: int | None

    @property
    def channel_layer_alias(self) -> str:
        return live_layer_alias()

    async def connect(self) -> None:
        self.subscriptions: dict[str, ChatSubscription] = {}
        self.names: dict[str, str] = {}
        # The newest stream snapshot per chat, sent together once per push interval.
        self.snapshots: dict[str, dict[str, Any]] = {}
        self.flushing: asyncio.TimerHandle | None = None
        self._flush_task: asyncio.Task | None = None
        # The batched access re-checks: chat -> (when, allowed), the check under way.
        self._access: dict[str, tuple[float, bool]] = {}
        self._access_check: asyncio.Task | None = None
        self._rechecks: asyncio.Task | None = None
        translation.activate(scope_language(self.scope))
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.classroom_id = int(self.scope["url_route"]["kwargs"]["classroom_id"])
        query = parse_qs((self.scope.get("query_string") or b"").decode("latin-1"))
        try:
            self.student_id = int(query["student"][0]) if "student" in query else None
        except ValueError:
            self.student_id = None
        if not await self._teaches():
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.group = actions.class_group(self.classroom_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        self.students = await database_sync_to_async(self._students)()  # the page's tiles
        await self.accept()
        await self._follow_new_chats()
        self._rechecks = asyncio.get_running_loop().create_task(self._recheck_access())
        executor.ensure_sweeper()

    async def disconnect(self, code: int) -> None:
        self.snapshots = {}  # nothing more to flush
        if self.flushing is not None:
            self.flushing.cancel()
        if self._flush_task is not None:
            self._flush_task.cancel()
        if self._rechecks is not None:
            self._rechecks.cancel()
        for chat_id, subscription in self.subscriptions.items():
            subscription.close()
            await self.channel_layer.group_discard(chat_group(chat_id), self.channel_name)
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    # --- access --------------------------------------------------------------------------

    async def _teaches(self) -> bool:
        return await database_sync_to_async(self._check_teaches)()

    def _check_teaches(self) -> bool:
        user = self.scope["user"]
        try:
            user.refresh_from_db(fields=["is_active"])
            access_classroom(user, self.classroom_id, ClassAction.TEACH)
        except (Http404, ObjectDoesNotExist):
            return False
        return True

    async def _may_view_async(self, chat_id: str) -> bool:
        """A tile's access re-check (its subscription's, every ACCESS_RECHECK_SECONDS).

        Answered from the wall's background check (:meth:`_recheck_access`, which acts
        on a loss itself) while that keeps up, so a push never waits for the database;
        checked here only when the newest answer is older than two periods. Asked one
        by one, the forty tiles' re-checks fell due together, in one flush: forty trips
        to the process's one database thread in a row, holding the wall's frames (and
        every other socket's trip) for up to a second.
        """
        answer = self._access.get(chat_id)
        now = asyncio.get_running_loop().time()
        if answer is not None and now - answer[0] < 2 * live_subscription.ACCESS_RECHECK_SECONDS:
            return answer[1]
        answers = await self._check_access({*self.subscriptions, chat_id})
        return bool(answers.get(chat_id))

    async def _recheck_access(self) -> None:
        """Re-check every followed chat every ACCESS_RECHECK_SECONDS; a chat no longer
        visible stops being pushed at once (the socket closes if the class is lost)."""
        while True:
            await asyncio.sleep(live_subscription.ACCESS_RECHECK_SECONDS)
            try:
                answers = await self._check_access(set(self.subscriptions))
            except Exception:  # noqa: BLE001 - the tiles' own re-checks go on
                logger.warning(
                    "access re-check of wall %s failed", self.classroom_id, exc_info=True
                )
                continue
            lost_all = self.subscriptions and not any(answers.values())
            if lost_all and not await self._teaches():
                await self.close(code=CLOSE_FORBIDDEN)
                return
            for chat_id, allowed in answers.items():
                subscription = self.subscriptions.get(chat_id)
                if not allowed and subscription is not None:
                    subscription.access_lost = True  # nothing more is pushed for it
                    await self._lost(chat_id)

    async def _check_access(self, chat_ids: set[str]) -> dict[str, bool]:
        """One check at a time, shared: a check under way that asked about these chats
        answers for them; the answers are kept with their time."""
        while True:
            checking = self._access_check
            if checking is None or checking.done():
                checking = self._access_check = asyncio.get_running_loop().create_task(
                    self._check_access_now(sorted(chat_ids))
                )
            answers = await asyncio.shield(checking)
            if chat_ids <= answers.keys():
                return answers

    async def _check_access_now(self, chat_ids: list[str]) -> dict[str, bool]:
        answers: dict[str, bool] = {}
        for start in range(0, len(chat_ids), ACCESS_CHECK_CHUNK):  # others' trips between
            chunk = chat_ids[start : start + ACCESS_CHECK_CHUNK]
            answers.update(await database_sync_to_async(self._may_view_many)(chunk))
        now = asyncio.get_running_loop().time()
        self._access.update((chat_id, (now, allowed)) for chat_id, allowed in answers.items())
        return answers

    def _may_view_many(self, chat_ids: list[str]) -> dict[str, bool]:
        """Whether the teacher may still view each chat (the class's teacher, and the
        chat's own VIEW access, as ``access_chat`` decides it)."""
        user = self.scope["user"]
        try:
            user.refresh_from_db(fields=["is_active"])
            access_classroom(user, self.classroom_id, ClassAction.TEACH)
        except (Http404, ObjectDoesNotExist):
            return dict.fromkeys(chat_ids, False)
        chats = ChatSession.objects.select_related("owner").in_bulk(chat_ids)
        found = {str(pk): chat for pk, chat in chats.items()}
        return {
            chat_id: chat_id in found and can_access_chat(user, found[chat_id], ChatAction.VIEW)
            for chat_id in chat_ids
        }

    # --- following the class's chats -------------------------------------------------------

    def _class_chats(self) -> dict[str, str]:
        links = ClassroomChat.objects.filter(classroom_id=self.classroom_id)
        if self.student_id is not None:
            links = links.filter(student_id=self.student_id)
        return {
            str(chat_id): name
            for chat_id, name in links.values_list("chat_id", "student__username")
        }

    def _students(self) -> set[int]:
        return {tile.student.pk for tile in self._tiles()}

    def _tiles(self) -> list[wall.Tile]:
        classroom = Classroom.objects.get(pk=self.classroom_id)
        return wall.tiles(classroom, student_id=self.student_id)

    def _record(self, chat_ids: list[str]) -> None:
        how = TeacherView.How.WALL
        classroom = Classroom.objects.get(pk=self.classroom_id)
        actions.record_views(self.scope["user"], classroom, chat_ids, how)

    async def _follow_new_chats(self) -> list[str]:
        found = await database_sync_to_async(self._class_chats)()
        new = [chat_id for chat_id in found if chat_id not in self.subscriptions]
        now = asyncio.get_running_loop().time()
        for chat_id in new:
            self.names[chat_id] = found[chat_id]
            # Called once the teacher was just found teaching the class, whose chats these
            # are: the tile's first re-check falls due with the background check, not
            # before it (where it would wait for a whole check in a flush).
            self._access[chat_id] = (now, True)
            self.subscriptions[chat_id] = ChatSubscription(
                chat_id,
                send=self._send_html,
                may_view=functools.partial(self._may_view_async, chat_id),
                on_access_lost=functools.partial(self._lost, chat_id),
                next_batch=wall.batch_renderer(found[chat_id]),
                stream_html=wall.stream_html,
                partial_html=wall.partial_html,
                events_html=wall.events_renderer(found[chat_id]),
            )
            await self.channel_layer.group_add(chat_group(chat_id), self.channel_name)
        if new:
            await database_sync_to_async(self._record)(new)
        return new

    async def _lost(self, chat_id: str) -> None:
        subscription = self.subscriptions.pop(chat_id, None)
        if subscription is not None:
            subscription.close()
        await self.channel_layer.group_discard(chat_group(chat_id), self.channel_name)
        if not await self._teaches():
            await self.close(code=CLOSE_FORBIDDEN)

    async def _send_html(self, html: str) -> None:
        await self.send(text_data=html)

    # --- frames from the page ------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        raw = text_data if text_data is not None else (bytes_data or b"").decode("utf-8", "replace")
        if len(raw.encode("utf-8")) > settings.LYCEUM_MAX_FRAME_BYTES:
            await self._notice(_("That message is too large to send."))
            return
        try:
            frame = json.loads(raw)
        except (ValueError, RecursionError):
            frame = None
        if not isinstance(frame, dict):
            await self._notice(_("The page sent something unreadable."))
            return
        action = str(frame.get("action") or "")
        handler = getattr(self, f"do_{action}", None) if action.isidentifier() else None
        if handler is None:
            await self._notice(_("Unknown action “%(action)s”.") % {"action": action[:40]})
            return
        if not await self._teaches():
            await self._notice(_("You can no longer watch this class."))
            await self.close(code=CLOSE_FORBIDDEN)
            return
        try:
            await handler(frame)
        except ActionError as exc:
            await self._notice(exc.message)

    async def _notice(self, message: str) -> None:
        await self.send(text_data=fragments.error_notice(message))

    async def _act(self, action, *args: Any) -> Any:
        return await database_sync_to_async(action)(self.scope["user"], self.classroom_id, *args)

    async def do_resync(self, frame: dict[str, Any]) -> None:
        seqs = frame.get("seqs")
        seqs = seqs if isinstance(seqs, dict) else {}
        for chat_id, subscription in list(self.subscriptions.items()):
            try:
                last_seq = int(seqs.get(chat_id, 0))
            except (TypeError, ValueError, OverflowError):
                last_seq = 0
            await subscription.resync(last_seq)

    async def do_step_in(self, frame: dict[str, Any]) -> None:
        await self._act(
            actions.step_in, _int(frame.get("student")), str(frame.get("message") or "")
        )

    async def do_broadcast(self, frame: dict[str, Any]) -> None:
        count = await self._act(actions.broadcast, str(frame.get("message") or ""))
        await self._notice(
            ngettext("Sent to %(count)s student.", "Sent to %(count)s students.", count)
            % {"count": count}
        )

    async def do_pause(self, frame: dict[str, Any]) -> None:
        await self._act(actions.pause_ai)

    async def do_resume(self, frame: dict[str, Any]) -> None:
        await self._act(actions.resume_ai)

    async def do_move(self, frame: dict[str, Any]) -> None:
        await self._act(actions.set_current_scene, _int(frame.get("scene")))

    async def do_review(self, frame: dict[str, Any]) -> None:
        await self._act(actions.review_flag, _int(frame.get("flag")))

    # --- pushes ------------------------------------------------------------------------------

    async def chat_events(self, event: dict[str, Any]) -> None:
        subscription = self.subscriptions.get(str(event.get("chat_id")))
        if subscription is not None:
            await subscription.on_events(event)

    async def chat_stream(self, event: dict[str, Any]) -> None:
        """Keep the newest snapshot per chat; one frame per push interval sends the
        "writing…" lines of the tiles that changed (never one frame per snapshot)."""
        chat_id = str(event.get("chat_id"))
        if chat_id not in self.subscriptions:
            return
        self.snapshots[chat_id] = event
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        # One flush at a time: one that waits for an access check is not overtaken by the
        # next (whose older tails would then arrive after newer ones).
        if self.flushing is None and self._flush_task is None:
            interval = float(settings.LYCEUM_STREAM_PUSH_INTERVAL)
            loop = asyncio.get_running_loop()
            self.flushing = loop.call_later(interval, self._start_flush)

    def _start_flush(self) -> None:
        self.flushing = None
        self._flush_task = asyncio.get_running_loop().create_task(self._flush_snapshots())

    async def _flush_snapshots(self) -> None:
        try:
            snapshots, self.snapshots = self.snapshots, {}
            watched = []
            for chat_id in snapshots:
                subscription = self.subscriptions.get(chat_id)
                if subscription is None or subscription.last_seq is None:
                    continue
                if await subscription.may_still_watch():  # no trip while the checks keep up
                    watched.append(subscription)
            # Rendered after the checks, with no wait until the send: a reply written
            # while a check was under way (its doorbell sent the tile's own lines)
            # drops its late snapshot here.
            html = "".join(s.stream_fragment(snapshots[s.chat_id]) for s in watched)
            if html:
                await self._send_html(html)
        finally:
            self._flush_task = None
            if self.snapshots:
                self._schedule_flush()

    async def class_roster(self, event: dict[str, Any]) -> None:
        """A student joined or opened the class chat: a new tile, followed from seq 0."""
        if not await self._teaches():
            await self.close(code=CLOSE_FORBIDDEN)
            return
        html = await database_sync_to_async(self._new_tiles)()
        if html:
            await self._send_html(html)
        for chat_id in await self._follow_new_chats():
            await self.subscriptions[chat_id].resync(0)

    def _new_tiles(self) -> str:
        classroom = Classroom.objects.get(pk=self.classroom_id)
        known = set(self.subscriptions)
        parts = []
        for tile in wall.tiles(classroom, student_id=self.student_id):
            on_page = tile.student.pk in self.students
            if (tile.chat_id in known) if tile.chat_id else on_page:
                continue
            self.students.add(tile.student.pk)
            tile.items, tile.last_seq = [], 0  # the subscription sends them from seq 0
            if on_page:  # the tile of a student who had no chat yet: replaced
                parts.append(wall.tile_html(tile, classroom, oob=True))
            else:  # a new student: a tile at the end
                parts.append(
                    f'<div hx-swap-oob="beforeend:#wall">{wall.tile_html(tile, classroom)}</div>'
                )
        return "".join(parts)

    async def class_flags(self, event: dict[str, Any]) -> None:
        chat_id = str(event.get("chat_id"))
        subscription = self.subscriptions.get(chat_id)
        if subscription is None or not await subscription.may_still_watch():
            return
        flags = await database_sync_to_async(wall.open_flags)(chat_id)
        await self._send_html(wall.flags_html(chat_id, flags))

    async def class_state(self, event: dict[str, Any]) -> None:
        if not await self._teaches():
            await self.close(code=CLOSE_FORBIDDEN)
            return
        html = await database_sync_to_async(self._state_html)()
        await self._send_html(html)

    def _state_html(self) -> str:
        classroom = Classroom.objects.select_related("current_scene").get(pk=self.classroom_id)
        return wall.state_html(classroom)

    async def class_activity(self, event: dict[str, Any]) -> None:
        pass  # the chat's own doorbell updates the tile


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise ActionError(_("The page sent something unreadable.")) from None
