"""The chat socket: one consumer per open chat page, at ``/ws/chat/<id>/``.

It does no work itself. Each frame names an action; access is checked again for
every action, and one function of ``chat.actions`` does the rest (including
starting the run it causes). Pushes come from the chat's group and go through the
socket's :class:`~chat.live.subscription.ChatSubscription`, which keeps the resync
cursor and reads the log when a doorbell does not follow on from what the page has.
"""

from __future__ import annotations

import logging
from functools import cached_property
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.http import Http404
from django.utils import translation
from django.utils.translation import gettext as _

from chat import actions
from chat.access import ChatAction, ViewHow, access_chat, note_view
from chat.inputs import BadInput, parse_object
from chat.live.direct import DirectDispatch, frame_send
from chat.live.doorbell import chat_group
from chat.live.language import scope_language
from chat.live.layers import live_layer_alias
from chat.live.sessions import session_user, user_group
from chat.live.subscription import ChatSubscription
from chat.presentation import fragments
from chat.runhost import executor

logger = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
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
    "edit",
    "switch_version",
}

# Every write action's handler makes one ``_act`` call, which checks access in the same
# trip to the database thread as the action itself (a send's first token waits for each
# trip, in line behind every other run's). An action not listed here is checked before
# its handler runs. (tests/classroom/test_access.py sends each one from a watcher.)
CHECKED_BY_ACT = WRITE_ACTIONS


class _Refused(Exception):
    """``_act`` found the socket may no longer write to its chat."""


def _text(frame: dict[str, Any], name: str) -> str:
    """A text field of a frame ("" when absent); any other type is refused with a message."""
    value = frame.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise actions.ActionError(_("“%(name)s” must be text.") % {"name": name})
    return value


def _number(frame: dict[str, Any], name: str) -> int:
    """A whole-number field of a frame (forms send text); anything else is refused."""
    value = frame.get(name)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise actions.ActionError(_("“%(name)s” must be a number.") % {"name": name})
    try:
        number = int(value)
    except ValueError:
        raise actions.ActionError(_("“%(name)s” must be a number.") % {"name": name}) from None
    if not 0 <= number < 2**53:
        raise actions.ActionError(_("“%(name)s” is out of range.") % {"name": name})
    return number


class ChatConsumer(DirectDispatch, AsyncWebsocketConsumer):
    chat_id: str
    subscription: ChatSubscription
    # Set when a re-check finds the socket's login gone: the close code to use.
    session_ended: int = 0

    @property
    def channel_layer_alias(self) -> str:  # read by Channels as the consumer starts
        return live_layer_alias()

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        translation.activate(scope_language(self.scope))
        self.chat_id = str(self.scope["url_route"]["kwargs"]["chat_id"])
        if not await self._allowed(ChatAction.VIEW):
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await database_sync_to_async(note_view)(self.user, self.chat_id, ViewHow.SOCKET)
        self.subscription = ChatSubscription(
            self.chat_id,
            send=self._send_html,
            may_view=lambda: self._allowed(ChatAction.VIEW),
            on_access_lost=lambda: self.close(code=self.session_ended or CLOSE_FORBIDDEN),
        )
        self.group = chat_group(self.chat_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        # Logout, a password change or a deactivation rings here (chat.live.sessions).
        self.user_group = user_group(user.pk)
        await self.channel_layer.group_add(self.user_group, self.channel_name)
        await self.accept()
        executor.ensure_sweeper()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "subscription"):
            self.subscription.close()
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if hasattr(self, "user_group"):
            await self.channel_layer.group_discard(self.user_group, self.channel_name)

    async def _send_html(self, html: str) -> None:
        # What ``self.send(text_data=html)`` sends, without the consumer's and the
        # session wrapper's coroutines around it (see direct.frame_send).
        await self._frames({"type": "websocket.send", "text": html})

    @cached_property
    def _frames(self) -> Any:
        return frame_send(self.base_send)

    # --- frames from the page ---------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        raw = text_data if text_data is not None else (bytes_data or b"").decode("utf-8", "replace")
        if len(raw.encode("utf-8")) > settings.LYCEUM_MAX_FRAME_BYTES:
            await self._notice(_("That message is too large to send."))
            return
        try:
            # Deep nesting, NUL characters, lone surrogates, huge numbers: refused here.
            frame = parse_object(raw, finite=False)
        except BadInput as exc:
            await self._notice(
                _("The page sent something unreadable: %(why)s") % {"why": exc.message}
            )
            return
        action = frame.get("action")
        action = action if isinstance(action, str) else ""
        handler = getattr(self, f"do_{action}", None) if action.isidentifier() else None
        if handler is None:
            await self._notice(_("Unknown action “%(action)s”.") % {"action": action[:40]})
            return
        needed = ChatAction.WRITE if action in WRITE_ACTIONS else ChatAction.VIEW
        if action not in CHECKED_BY_ACT and not await self._allowed(needed):
            await self._refuse(needed)
            return
        try:
            await handler(frame)
            if needed == ChatAction.WRITE:
                self.subscription.expect_activity()
        except _Refused:
            await self._refuse(needed)
        except actions.ActionError as exc:
            await self._notice(exc.message)
        except Exception:
            # One failed action must not take the socket (and the page's live view) down.
            logger.exception("socket action %r on chat %s failed", action, self.chat_id)
            await self._notice(_("That did not work because of an error on the server; try again."))

    async def _refuse(self, needed: ChatAction) -> None:
        if self.session_ended:  # logged out, password changed, or deactivated
            await self.close(code=self.session_ended)
            return
        if needed == ChatAction.WRITE and await self._allowed(ChatAction.VIEW):
            # A watcher (say, a teacher) keeps the live view; only the write is refused.
            await self._notice(_("You can only watch this chat."))
            return
        await self._notice(_("You can no longer use this chat."))
        await self.close(code=CLOSE_FORBIDDEN)

    async def _notice(self, message: str) -> None:
        await self.send(text_data=fragments.error_notice(message))

    async def _allowed(self, action: ChatAction) -> bool:
        return await database_sync_to_async(self._check_access)(action)

    def _check_access(self, action: ChatAction) -> bool:
        # The scope's user was read once, at connect: a session ended since (logout, a
        # password change elsewhere) or a user deactivated must not go on through it.
        user, self.session_ended = session_user(self.scope)
        if user is None:
            return False
        self.user = user
        try:
            access_chat(user, self.chat_id, action)
        except (Http404, ObjectDoesNotExist):
            return False
        return True

    async def _act(self, action, *args: Any, **kwargs: Any) -> Any:
        """Check that this socket's login may still write here, then run one action as
        its user on its chat: both in one trip to the database thread."""
        return await database_sync_to_async(self._checked_act)(action, args, kwargs)

    def _checked_act(self, action, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self._check_access(ChatAction.WRITE):
            raise _Refused
        return action(self.user, self.chat_id, *args, **kwargs)

    async def do_resync(self, frame: dict[str, Any]) -> None:
        try:
            last_seq = int(frame.get("last_seq", 0))
        except (TypeError, ValueError, OverflowError):  # OverflowError: 1e999 parses as inf
            last_seq = 0
        await self.subscription.resync(last_seq)

    async def do_send(self, frame: dict[str, Any]) -> None:
        attached = frame.get("attachments") or []
        if isinstance(attached, str):  # one hidden input: htmx sends a string, not a list
            attached = [attached]
        await self._act(
            actions.send_message,
            _text(frame, "message"),
            _text(frame, "client_id"),
            attachments=[str(a) for a in attached if isinstance(a, str)][:20],
            language=scope_language(self.scope),
        )
        await self._send_html(fragments.composer_reset(self.chat_id))

    async def do_cancel(self, frame: dict[str, Any]) -> None:
        await self._act(actions.cancel_run)

    async def _decide(self, frame: dict[str, Any], *, approve: bool, always: bool = False):
        await self._act(
            actions.decide_approval,
            _text(frame, "call_id"),
            approve=approve,
            reason=_text(frame, "reason"),
            always=always,
        )

    async def do_approve(self, frame: dict[str, Any]) -> None:
        await self._decide(frame, approve=True)

    async def do_always(self, frame: dict[str, Any]) -> None:
        await self._decide(frame, approve=True, always=True)

    async def do_deny(self, frame: dict[str, Any]) -> None:
        await self._decide(frame, approve=False)

    async def do_switch_model(self, frame: dict[str, Any]) -> None:
        await self._act(actions.switch_model, _text(frame, "model"))

    async def do_compact(self, frame: dict[str, Any]) -> None:
        await self._act(actions.request_compaction)

    async def do_regenerate(self, frame: dict[str, Any]) -> None:
        seq = _number(frame, "seq") if frame.get("seq") not in (None, "") else None
        await self._act(actions.regenerate, seq)

    async def do_edit(self, frame: dict[str, Any]) -> None:
        await self._act(
            actions.edit_message,
            _number(frame, "seq"),
            _text(frame, "message"),
            _text(frame, "client_id"),
        )

    async def do_switch_version(self, frame: dict[str, Any]) -> None:
        await self._act(actions.switch_version, _number(frame, "base"), _number(frame, "index"))

    async def do_edit_last(self, frame: dict[str, Any]) -> None:
        await self._act(
            actions.edit_last_message,
            _text(frame, "message"),
            _text(frame, "client_id"),
        )

    # --- pushes from the chat's group -----------------------------------------------------

    async def user_session_check(self, event: dict[str, Any]) -> None:
        """The user logged out, changed the password or was deactivated somewhere."""
        if not await self._allowed(ChatAction.VIEW):
            if hasattr(self, "subscription"):
                self.subscription.access_lost = True
                self.subscription.close()
            await self.close(code=self.session_ended or CLOSE_FORBIDDEN)

    async def chat_events(self, event: dict[str, Any]) -> None:
        await self.subscription.on_events(event)

    async def chat_stream(self, event: dict[str, Any]) -> None:
        await self.subscription.on_stream(event)


class UnknownSocket(AsyncWebsocketConsumer):
    """Any other socket path (or a chat id that is not one): refused, without a traceback."""

    async def connect(self) -> None:
        await self.close(code=CLOSE_NOT_FOUND)
