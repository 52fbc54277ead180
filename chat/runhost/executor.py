"""Executes runs: in the web process (default) or in ``runworker`` processes over Redis.

A run is launched by the action that created it, after the commit
(:func:`launch_on_commit`). It executes as an asyncio task beside a watcher. The
watcher listens for cancel on the channel layer and enforces the hang guard (time
spent waiting for the user does not count: a waiting run has no task). The
process's keeper (``chat.runhost.keeper``) checkpoints the reply, writes the
heartbeat that tells a dead run from a slow one, and reads the cancel flag as the
fallback for a lost doorbell. Exactly one terminal state is written per run,
guarded in the database (``chat.runhost.transitions.finish_run``).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from asgiref.sync import SyncToAsync, async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone, translation
from django.utils.translation import gettext_noop

from chat import rows, store
from chat.agent import events as ev
from chat.agent.builtin_tools import default_registry
from chat.agent.hooks import HookRegistry
from chat.agent.loop import AgentLoop, Decision, LoopConfig, LoopOutcome, QueuedText
from chat.agent.registry import ToolRegistry
from chat.agent.subagent import DELEGATE
from chat.catalog import ResolvedModel, UnknownModel, close_providers, resolve_model
from chat.core.messages import ChatMessage
from chat.core.voices import Voices, cast_instructions
from chat.live.doorbell import run_control_group
from chat.llm.types import USER_MESSAGES, ErrorCategory, ProviderError
from chat.models import Agent, ChatSession, ChatToolGrant, Run
from chat.runhost import pushed, titles, transitions
from chat.runhost.host import DjangoRunHost, partial_message, take_queued_inputs
from chat.runhost.keeper import KeptRun, keeper
from chat.runhost.setup import RunSetup, setup_for
from chat.runhost.workspace import ArtifactWorkspace

logger = logging.getLogger(__name__)

WATCH_INTERVAL = 0.5
SWEEP_INTERVAL = 5.0

_tasks: dict[str, asyncio.Task] = {}
_hosts: dict[str, DjangoRunHost] = {}  # runs executing in this process
_sweeper: asyncio.Task | None = None
_launching: set[asyncio.Task] = set()


# --- launching ------------------------------------------------------------------------------


def launch_on_commit(run_id: str | None, *, resume: bool = False) -> None:
    """Launch ``run_id`` once the current transaction commits (the actions' way)."""
    if run_id:
        transaction.on_commit(lambda: launch_soon(str(run_id), resume=resume))


def launch_soon(run_id: str, *, resume: bool = False) -> None:
    """Launch from a sync thread without waiting: on the event loop this thread serves.

    Actions run on the database thread (under ``database_sync_to_async``) or in a
    sync view's thread; either way the event loop they work for starts the run. A
    caller with no event loop (a management command) can only hand it to workers.
    """
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    if loop is not None and not loop.is_closed() and loop.is_running():
        loop.call_soon_threadsafe(_launch_here, run_id, resume)
        return
    if settings.LYCEUM_RUNNER == "worker":
        async_to_sync(_hand_to_workers)(run_id, resume)  # a loop of its own: no sweeper
        return
    logger.warning("run %s was not started: no event loop to run it in", run_id)


def _launch_here(run_id: str, resume: bool) -> None:
    if settings.LYCEUM_RUNNER != "worker":
        start_local(run_id, resume=resume)  # at once: the caller may look for the task next
        ensure_sweeper()
        return
    task = asyncio.get_running_loop().create_task(launch(run_id, resume=resume))
    _launching.add(task)
    task.add_done_callback(_launched)


def _launched(task: asyncio.Task) -> None:
    _launching.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.warning("handing a run to the workers failed", exc_info=task.exception())


async def launch(run_id: str | None, *, resume: bool = False) -> None:
    """Hand a run to whoever executes runs. Only after the run row is committed."""
    if not run_id:
        return
    if settings.LYCEUM_RUNNER == "worker":
        await _hand_to_workers(str(run_id), resume)
    else:
        start_local(str(run_id), resume=resume)
    # Whoever dispatches runs recovers them too (an API-only web process included).
    ensure_sweeper()


async def _hand_to_workers(run_id: str, resume: bool) -> None:
    """Send the run to the workers; a failed send is tried once more.

    The Redis connections retry a command once themselves (``chatsite.redishosts``);
    this covers the rest (a pool being rebuilt). A dispatch lost anyway is handed over
    again by the sweeper (``transitions.redispatch_undispatched``).
    """
    message = {"type": "run.execute", "run_id": run_id, "resume": resume}
    layer = get_channel_layer()
    try:
        await layer.send(settings.LYCEUM_WORKER_CHANNEL, message)
    except Exception:  # noqa: BLE001 - once more, then let the caller hear of it
        logger.warning("dispatching run %s failed; trying once more", run_id, exc_info=True)
        await asyncio.sleep(0.2)
        await layer.send(settings.LYCEUM_WORKER_CHANNEL, message)


def start_local(run_id: str, *, resume: bool = False) -> asyncio.Task:
    task = _tasks.get(run_id)
    if task and not task.done():
        if resume and run_id not in _resume_after:
            # The leg that suspended for an approval may still be finishing (its record is
            # written, its task not yet done) when the answer comes: the next leg starts
            # once it is done. A leg still running finds the run claimed and does nothing.
            _resume_after.add(run_id)
            task.add_done_callback(lambda _t: _resume_next_leg(run_id))
        return task
    task = _background(execute_run(run_id, resume=resume))
    _tasks[run_id] = task
    task.add_done_callback(lambda _t: _tasks.pop(run_id, None))
    return task


_resume_after: set[str] = set()


def _resume_next_leg(run_id: str) -> None:
    _resume_after.discard(run_id)
    if not asyncio.get_event_loop().is_closed():
        start_local(run_id, resume=True)


def _background(coro) -> asyncio.Task:
    """A task that outlives the request or socket that started it.

    It gets a fresh context: the caller's would tie its database calls to the
    request's thread executor, which is gone once the response is sent.
    """
    return asyncio.get_running_loop().create_task(coro, context=contextvars.Context())


def local_partial(run_id: str) -> tuple[str, str] | None:
    """The reply being streamed, when this process runs it (fresher than the checkpoint)."""
    host = _hosts.get(str(run_id))
    return host.partial if host else None


async def stop_all() -> None:
    """Cancel this process's run tasks and sweeper and wait for them (shutdown, tests).

    A cancelled run keeps its state "running": the next start's recovery marks it
    interrupted with its checkpoint, as after a crash.
    """
    global _sweeper
    tasks = [task for task in list(_tasks.values()) if not task.done()]
    if _sweeper is not None and not _sweeper.done():
        tasks.append(_sweeper)
    _sweeper = None
    hosts = list(_hosts.values())
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    # A host's own pending writes and pushes (batched events, a snapshot) go too.
    pending = [f for host in hosts for f in host.pending_work() if not f.done()]
    for future in pending:
        future.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    await keeper().stop()
    # A cancelled task leaves its database job running on the database thread; the thread
    # takes jobs in order, so one more job returns once every job before it is done (a
    # test's teardown must not empty the tables under a transaction still open).
    await database_sync_to_async(_nothing)()
    await close_providers()
    _tasks.clear()
    _resume_after.clear()
    _hosts.clear()


def _nothing() -> None:
    pass


def local_task(run_id: str) -> asyncio.Task | None:
    return _tasks.get(str(run_id))


def ensure_sweeper() -> None:
    global _sweeper
    if _sweeper is None or _sweeper.done():
        _sweeper = _background(sweep_forever())


async def sweep_forever() -> None:
    # A short stale window is pointless if sweeps are far apart: sweep at least twice in it.
    interval = min(SWEEP_INTERVAL, transitions.stale_after().total_seconds() / 2)
    while True:
        try:
            await sweep_once()
        except Exception:  # noqa: BLE001 - keep sweeping
            logger.exception("run sweeper failed")
        await asyncio.sleep(interval)


async def sweep_once() -> None:
    for run_id in await database_sync_to_async(transitions.expire_approvals)():
        await launch(run_id, resume=True)
    # Handed over but never claimed (a dispatch lost with Redis): once more, before
    # recovery would call them dead.
    for run_id in await database_sync_to_async(transitions.redispatch_undispatched)():
        logger.warning("run %s was not claimed in time; dispatching it again", run_id)
        await launch(run_id, resume=True)
    await database_sync_to_async(transitions.recover_stale_runs)()
    for run_id in await database_sync_to_async(transitions.start_stranded_runs)():
        await launch(run_id)


# --- preparing a run -------------------------------------------------------------------------


@dataclass
class Prepared:
    run: Run
    chat: ChatSession
    context: list[ChatMessage]
    resolved: ResolvedModel
    tools: ToolRegistry
    policies: dict[str, str]
    grants: set[str]
    max_rounds: int
    resume: tuple[ChatMessage, dict[str, Decision]] | None
    setup: RunSetup
    # A new run's inputs, taken with its claim: the loop's first round takes them
    # first thing, and a trip to the database thread less is one wait less in line
    # for a burst of sends. (A resumed run may suspend again before taking any.)
    queued: list[QueuedText] | None = None


@lru_cache(maxsize=1)
def hook_registry() -> HookRegistry:
    return HookRegistry.from_dotted_paths(settings.LYCEUM_HOOKS)


def tools_for(setup: RunSetup) -> tuple[ToolRegistry, dict[str, str]]:
    registry = default_registry()
    wanted = registry.names() if setup.tools is None else setup.tools
    names = [n for n in wanted if n in registry]
    policies = dict(setup.tool_policies or {})
    if setup.tools is None or DELEGATE in setup.tools:
        policies.setdefault(DELEGATE, "auto")
    tools = registry.subset(names).with_policies({k: v for k, v in policies.items() if k in names})
    return tools, policies


def _prepare(run_id: str, resume: bool) -> Prepared | None:
    with transaction.atomic():  # one commit for the claim and what goes with it
        return _claim_and_load(run_id, resume)


def _claim_and_load(run_id: str, resume: bool) -> Prepared | None:
    # Claim the run first: a channel layer may deliver one dispatch to two workers
    # (channels_redis re-queues a message another consumer is still handling), and a
    # run must execute once.
    run = _claim(run_id)
    if run is None:
        return None
    chat = run.chat
    setup = setup_for(chat)
    tools, policies = tools_for(setup)
    changes: dict[str, Any] = {}
    resume_state = None
    if resume and run.pending_message:
        resume_state = (ChatMessage.from_dict(run.pending_message), transitions.decisions_for(run))
        changes["pending_message"] = None
    if chat.model and chat.model != run.model:  # switched while the run waited
        changes["model"] = chat.model
    if setup.speakers != (run.speakers or []):
        changes["speakers"] = run.speakers = setup.speakers
    if changes:
        Run.objects.filter(pk=run.pk).update(**changes)
    return Prepared(
        run=run,
        chat=chat,
        context=store.load_context(chat.pk),
        resolved=resolve_model(chat.model or run.model),
        tools=tools,
        policies=policies,
        grants=_grants(chat.pk),
        max_rounds=setup.max_rounds,
        setup=setup,
        resume=resume_state,
        # A run handed over again, or taken along by a worker, comes as a resume with
        # nothing to resume: a new run, whose inputs are taken here too (a trip less).
        queued=None if resume_state else take_queued_inputs(chat.pk, run, locked=True),
    )


def _claim(run_id: str) -> Run | None:
    """Claim the run, if it is running and unclaimed; the run with its chat and the chat's
    agent (``select_related``), or None.

    Written-out statements (chat/rows.py): one ``UPDATE … RETURNING`` claims the run and
    reads it, one ``SELECT`` reads its chat and agent. Every run start makes them on the
    process's one database thread, where the ORM's building of the update and of the
    three-table read cost more than running them.
    """
    run_fields = rows.fields_of(Run)
    col = {name: rows.column(Run, name) for name in ("pk", "status", "claimed")}
    sql = (
        f"UPDATE {rows.table(Run)} SET {col['claimed']} = %s, "
        f"{rows.column(Run, 'heartbeat_at')} = %s, {rows.column(Run, 'redispatched')} = %s "
        f"WHERE {col['pk']} = %s AND {col['status']} = %s AND NOT {col['claimed']} "
        f"RETURNING {', '.join(rows.column(Run, name) for name in run_fields)}"
    )
    params = [
        rows.prep(Run, "claimed", True),
        rows.prep(Run, "heartbeat_at", timezone.now()),
        0,
        rows.prep(Run, "pk", run_id),
        str(Run.Status.RUNNING),
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        claimed = cursor.fetchone()
    if claimed is None:
        return None
    run: Run = rows.instance(Run, claimed)
    chat_fields = rows.fields_of(ChatSession)
    sql = (
        f"SELECT {rows.select_list(ChatSession, 'c')}, {rows.select_list(Agent, 'a')} "
        f"FROM {rows.table(ChatSession)} c LEFT OUTER JOIN {rows.table(Agent)} a "
        f"ON a.{rows.column(Agent, 'pk')} = c.{rows.column(ChatSession, 'agent')} "
        f"WHERE c.{rows.column(ChatSession, 'pk')} = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [rows.prep(ChatSession, "pk", run.chat_id)])
        row = cursor.fetchone()
    if row is None:  # deleted with its runs since: the claim rolls back with the caller
        raise ChatSession.DoesNotExist(f"no chat {run.chat_id}")
    chat = rows.instance(ChatSession, row[: len(chat_fields)])
    agent_values = row[len(chat_fields) :]
    agent = None if agent_values[0] is None else rows.instance(Agent, agent_values)
    ChatSession._meta.get_field("agent").set_cached_value(chat, agent)  # type: ignore[attr-defined]
    Run._meta.get_field("chat").set_cached_value(run, chat)  # type: ignore[attr-defined]
    return run


def _grants(chat_id) -> set[str]:
    """The tools this chat allowed for good (a written-out statement, as :func:`_claim`)."""
    sql = (
        f"SELECT {rows.column(ChatToolGrant, 'tool_name')} FROM {rows.table(ChatToolGrant)} "
        f"WHERE {rows.column(ChatToolGrant, 'chat')} = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [rows.prep(ChatToolGrant, "chat", chat_id)])
        return {name for (name,) in cursor.fetchall()}


# --- executing ---------------------------------------------------------------------------------


async def execute_run(run_id: str, *, resume: bool = False) -> None:
    try:
        prepared = await database_sync_to_async(_prepare)(run_id, resume)
    except UnknownModel as exc:
        await database_sync_to_async(transitions.finish_failed_early)(run_id, str(exc))
        return
    if prepared is None:
        return
    # What the run renders (its live fragments, run status) is in the chat's language;
    # the task has a context of its own (_background), so this stays within the run.
    translation.activate(prepared.chat.language or settings.LANGUAGE_CODE)
    host = DjangoRunHost(prepared.run, prepared.context)
    host.prefetched_queue = prepared.queued
    _hosts[run_id] = host
    host.grants = prepared.grants
    setup = prepared.setup
    host.agent_prompt = setup.system_prompt
    voices = Voices.from_names(prepared.run.speakers)
    if voices is not None:
        cast = cast_instructions(voices, setup.roles)
        host.agent_prompt = f"{host.agent_prompt}\n\n{cast}".strip()
    # One main assistant message per iteration, so a resumed leg's stream rounds
    # continue after the earlier leg's.
    host.round = prepared.run.iteration
    choice = prepared.resolved.choice
    loop = AgentLoop(
        host,
        prepared.resolved.provider,
        prepared.tools,
        LoopConfig(
            model=choice.model_id,
            context_window=choice.context_window,
            max_rounds=prepared.max_rounds,
            thinking=prepared.run.thinking,
            tool_timeout=settings.LYCEUM_TOOL_TIMEOUT,
            voices=voices,
        ),
        # The chat's artifacts: every process sees the same files.
        workspace=ArtifactWorkspace(
            prepared.chat.pk, run_id=run_id, loop=asyncio.get_running_loop()
        ),
        chat_id=str(prepared.chat.pk),
        hooks=hook_registry(),
        tool_policies=prepared.policies,
    )
    if prepared.resume is None:
        await host.emit(ev.RunStart(model=choice.alias))
    run = prepared.run
    loop.usage_in, loop.usage_out = (
        run.input_tokens,
        run.output_tokens,
    )  # earlier legs of a resumed run
    loop.usage_estimated = run.usage_estimated
    if run.kind == Run.Kind.COMPACT:
        body = asyncio.create_task(_compact_only(loop))
    else:
        body = asyncio.create_task(
            loop.run(resume=prepared.resume, first_iteration=run.iteration + 1)
        )
    kept = keeper().keep(run_id, lambda: host.partial)
    watcher = asyncio.create_task(_watch(run_id, body, kept))
    outcome = None
    next_run: str | None | object = _UNCHECKED  # the run's end starts the next in its trip
    try:
        outcome = await body
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():
            body.cancel()
            raise  # the process is shutting down; recovery marks the run interrupted
        # Only the watcher cancels the body; wait for its answer, since it may still be
        # leaving its group (a Redis round trip) when the body's cancellation lands here.
        reason = await _watcher_reason(watcher)
        next_run = await _end(host, loop, "guard" if reason == "guard" else "cancelled")
    except ProviderError as exc:
        next_run = await _end(host, loop, "failed", exc.category, exc.message)
    except Exception:
        logger.exception("run %s failed", run_id)
        next_run = await _end(host, loop, "failed", ErrorCategory.INTERNAL)
    else:
        if outcome.status == "completed":
            next_run = await _end(host, loop, "completed")
            if run.kind == Run.Kind.REPLY:
                titles.title_soon(prepared.chat.pk, prepared.resolved.provider, choice.model_id)
        else:
            await database_sync_to_async(transitions.cancel_if_requested)(run_id)
    finally:
        watcher.cancel()
        host.stop_pushing()
        keeper().release(run_id)
        _hosts.pop(run_id, None)
    if next_run is _UNCHECKED:
        await _start_next(prepared.chat)
    else:
        await launch(next_run)  # type: ignore[arg-type]


async def _compact_only(loop: AgentLoop) -> LoopOutcome:
    """ "Compact now": the same compaction path as automatic, outside a reply."""
    if not await loop.compact_now():
        raise ProviderError(
            ErrorCategory.PROVIDER_ERROR,
            gettext_noop("The conversation could not be compacted right now."),
        )
    return LoopOutcome("completed")


async def _watch(run_id: str, body: asyncio.Task, kept: KeptRun) -> str:
    """Cancel ``body`` on a cancel request or when the hang guard fires; say which.

    The cancel doorbell stops the run at once; the keeper's reading of the database
    flag (once per checkpoint interval, for all runs) is the fallback when it was lost.
    """
    layer = get_channel_layer()
    channel = await layer.new_channel()
    group = run_control_group(run_id)
    await layer.group_add(group, channel)
    started = time.monotonic()
    loop = asyncio.get_running_loop()
    # One receive stays pending from look to look (``wait_for`` made a task for each
    # look and cancelled it), and every run's looks fall on one grid of the loop's
    # clock: a hundred watchers wake in one turn of the event loop, not in a hundred.
    receive = asyncio.ensure_future(layer.receive(channel))
    try:
        while not body.done():
            look_at = (loop.time() // WATCH_INTERVAL + 1) * WATCH_INTERVAL
            await asyncio.wait((receive,), timeout=look_at - loop.time())
            message = None
            if receive.done():
                message = receive.result()
                receive = asyncio.ensure_future(layer.receive(channel))
            if (message and message.get("type") == "run.cancel") or kept.cancel_requested.is_set():
                body.cancel()
                return "cancel"
            if time.monotonic() - started > settings.LYCEUM_RUN_GUARD_SECONDS:
                body.cancel()
                return "guard"
        return "done"
    finally:
        if not receive.cancel() and not receive.cancelled():
            receive.exception()  # a failed receive was raised above or is moot now
        await layer.group_discard(group, channel)


async def _watcher_reason(watcher: asyncio.Task) -> str:
    try:
        return await watcher
    except Exception:  # noqa: BLE001 - a broken doorbell still ends the run as cancelled
        logger.warning("run watcher failed", exc_info=True)
        return "cancel"


_UNCHECKED = object()


async def _end(host, loop: AgentLoop, how: str, category=None, message: str = "") -> str | None:
    """Write the run's end; the next run of its chat, when messages wait for one (started
    in the same trip to the database thread, launched by the caller)."""
    host.stop_pushing()  # a snapshot due now would land after the reply's end
    await host.write_events()  # what the run announced comes before its end
    text, reasoning = loop.partial_text, loop.partial_reasoning
    usage = loop.usage()
    if how == "completed":
        event: ev.RunEvent = ev.Complete(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            usage_estimated=usage.estimated,
            text=loop.final_text,
        )
        status = Run.Status.COMPLETED
    elif how == "cancelled":
        event = ev.Cancelled(partial_text=text)
        status = Run.Status.CANCELLED
    else:
        if how == "guard":
            category = ErrorCategory.TIMED_OUT
            message = gettext_noop("The reply took longer than the time limit and was stopped.")
        category = ErrorCategory(category or ErrorCategory.PROVIDER_ERROR)
        message = message or USER_MESSAGES[category]
        event = ev.Error(category=str(category), message=message, partial_text=text)
        status = Run.Status.FAILED
    partials = []
    if how != "completed":
        partials = partial_message(text, reasoning, str(status), host.run.speakers)
    next_run = await database_sync_to_async(_finish_and_start_next)(
        host, status, event, partials, usage
    )
    pushed.forget_soon(host.run.pk)
    return next_run


def _finish_and_start_next(host, status, event, partials, usage) -> str | None:
    transitions.finish_run(host, status, event, partials, usage)
    # Messages sent while the run was finishing start the next run (:func:`_start_next`).
    return transitions.start_run_if_idle(host.run.chat)


async def _start_next(chat: ChatSession) -> None:
    """Messages sent while the run was finishing start the next run."""
    run_id = await database_sync_to_async(transitions.start_run_if_idle)(chat)
    await launch(run_id)
