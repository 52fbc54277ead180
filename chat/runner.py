"""Executes runs: in the web process (default) or in ``runworker`` processes over Redis.

A run is an asyncio task beside a watcher. The watcher listens for cancel on the
channel layer and enforces the hang guard (time spent waiting for the user does not
count: a waiting run has no task). The process's keeper (``chat.keeper``) checkpoints
the reply, writes the heartbeat that tells a dead run from a slow one, and reads the
cancel flag as the fallback for a lost doorbell. Exactly one terminal state is written
per run, guarded in the database.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache

from channels.consumer import AsyncConsumer
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from chat import runs, store
from chat.agent import events as ev
from chat.agent.builtin_tools import default_registry
from chat.agent.hooks import HookRegistry
from chat.agent.loop import AgentLoop, Decision, LoopConfig, LoopOutcome
from chat.agent.registry import ToolRegistry
from chat.agent.subagent import DELEGATE
from chat.agent.workspace import Workspace
from chat.core.messages import ChatMessage
from chat.dispatch import DirectDispatch
from chat.keeper import KeptRun, keeper
from chat.llm.types import USER_MESSAGES, ErrorCategory, ProviderError, Usage
from chat.models import ChatSession, ChatToolGrant, QueuedInput, Run, ToolApproval
from chat.providers import ResolvedModel, UnknownModel, resolve_model

logger = logging.getLogger(__name__)

WATCH_INTERVAL = 0.5
STALE_AFTER = timedelta(seconds=15)  # the default of settings.LYCEUM_RUN_STALE_SECONDS
SWEEP_INTERVAL = 5.0
CLAIM_EXTRA_RUNS = 20  # runs a worker takes along with the one it was handed

_tasks: dict[str, asyncio.Task] = {}
_hosts: dict[str, runs.DjangoRunHost] = {}  # runs executing in this process
_sweeper: asyncio.Task | None = None


# --- dispatch -----------------------------------------------------------------------------


async def dispatch(run_id: str | None, *, resume: bool = False) -> None:
    """Hand a run to whoever executes runs. Call only after the run row is committed."""
    if not run_id:
        return
    if settings.LYCEUM_RUNNER == "worker":
        await get_channel_layer().send(
            settings.LYCEUM_WORKER_CHANNEL,
            {"type": "run.execute", "run_id": str(run_id), "resume": resume},
        )
    else:
        start_local(str(run_id), resume=resume)
        ensure_sweeper()


def unclaimed_runs(limit: int) -> list[str]:
    """Runs handed to the workers that no process has claimed yet, oldest first."""
    waiting = Run.objects.filter(status=Run.Status.RUNNING, claimed=False).order_by("started_at")
    return [str(pk) for pk in waiting.values_list("pk", flat=True)[:limit]]


def start_local(run_id: str, *, resume: bool = False) -> asyncio.Task:
    task = _tasks.get(run_id)
    if task and not task.done():
        return task
    task = _background(execute_run(run_id, resume=resume))
    _tasks[run_id] = task
    task.add_done_callback(lambda _t: _tasks.pop(run_id, None))
    return task


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
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await keeper().stop()
    _tasks.clear()
    _hosts.clear()


def local_task(run_id: str) -> asyncio.Task | None:
    return _tasks.get(str(run_id))


def ensure_sweeper() -> None:
    global _sweeper
    if _sweeper is None or _sweeper.done():
        _sweeper = _background(sweep_forever())


def stale_after() -> timedelta:
    """How old a running run's heartbeat may get before the run counts as dead."""
    seconds = getattr(settings, "LYCEUM_RUN_STALE_SECONDS", None)
    return timedelta(seconds=seconds) if seconds else STALE_AFTER


async def sweep_forever() -> None:
    # A short stale window is pointless if sweeps are far apart: sweep at least twice in it.
    interval = min(SWEEP_INTERVAL, stale_after().total_seconds() / 2)
    while True:
        try:
            await sweep_once()
        except Exception:  # noqa: BLE001 - keep sweeping
            logger.exception("run sweeper failed")
        await asyncio.sleep(interval)


async def sweep_once() -> None:
    for run_id in await database_sync_to_async(runs.expire_approvals)():
        await dispatch(run_id, resume=True)
    await database_sync_to_async(recover_stale_runs)()
    for run_id in await database_sync_to_async(start_stranded_runs)():
        await dispatch(run_id)


def start_stranded_runs() -> list[str]:
    """Start runs for messages queued behind a run that ended without starting the next.

    A waiting run cancelled by the user ends outside any task, so nothing calls
    ``_start_next`` for it. Inputs already given to a run (``run`` set) are that
    run's, answered or not, and never start another.
    """
    chat_ids = set(
        QueuedInput.objects.filter(consumed=False, run__isnull=True)
        .exclude(chat__runs__status__in=runs.LIVE)
        .values_list("chat_id", flat=True)
    )
    started = []
    for chat in ChatSession.objects.filter(pk__in=chat_ids):
        run_id = runs.start_run_if_idle(chat)
        if run_id:
            started.append(run_id)
    return started


async def start_next_run(chat_id) -> None:
    """After a cancel: start the run for messages queued behind a cancelled waiting run."""
    chat = await ChatSession.objects.filter(pk=chat_id).afirst()
    if chat is not None:
        await _start_next(chat)


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


@lru_cache(maxsize=1)
def hook_registry() -> HookRegistry:
    return HookRegistry.from_dotted_paths(settings.LYCEUM_HOOKS)


def tools_for(agent) -> tuple[ToolRegistry, dict[str, str]]:
    registry = default_registry()
    names = [n for n in (agent.tools if agent else registry.names()) if n in registry]
    policies = dict(agent.tool_policies or {}) if agent else {}
    if agent is None or DELEGATE in (agent.tools or []):
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
    claimed = Run.objects.filter(pk=run_id, status=Run.Status.RUNNING, claimed=False).update(
        claimed=True, heartbeat_at=timezone.now()
    )
    if not claimed:
        return None
    run = Run.objects.select_related("chat", "chat__agent").get(pk=run_id)
    chat = run.chat
    tools, policies = tools_for(chat.agent)
    changes = {}
    resume_state = None
    if resume and run.pending_message:
        resume_state = (ChatMessage.from_dict(run.pending_message), runs.decisions_for(run))
        changes["pending_message"] = None
    if chat.model and chat.model != run.model:  # switched while the run waited
        changes["model"] = chat.model
    if changes:
        Run.objects.filter(pk=run.pk).update(**changes)
    return Prepared(
        run=run,
        chat=chat,
        context=store.load_context(chat.pk),
        resolved=resolve_model(chat.model or run.model),
        tools=tools,
        policies=policies,
        grants=set(ChatToolGrant.objects.filter(chat=chat).values_list("tool_name", flat=True)),
        max_rounds=chat.agent.max_rounds if chat.agent else 12,
        resume=resume_state,
    )


# --- executing ---------------------------------------------------------------------------------


async def execute_run(run_id: str, *, resume: bool = False) -> None:
    try:
        prepared = await database_sync_to_async(_prepare)(run_id, resume)
    except UnknownModel as exc:
        await database_sync_to_async(finish_failed_early)(run_id, str(exc))
        return
    if prepared is None:
        return
    host = runs.DjangoRunHost(prepared.run, prepared.context)
    _hosts[run_id] = host
    host.grants = prepared.grants
    agent = prepared.chat.agent
    host.agent_prompt = agent.system_prompt if agent else ""
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
        ),
        workspace=Workspace(settings.LYCEUM_WORKSPACE_ROOT / str(prepared.chat.pk)),
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
    try:
        outcome = await body
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():
            body.cancel()
            raise  # the process is shutting down; recovery marks the run interrupted
        # Only the watcher cancels the body; wait for its answer, since it may still be
        # leaving its group (a Redis round trip) when the body's cancellation lands here.
        reason = await _watcher_reason(watcher)
        await _end(host, loop, "guard" if reason == "guard" else "cancelled")
    except ProviderError as exc:
        await _end(host, loop, "failed", exc.category, exc.message)
    except Exception:
        logger.exception("run %s failed", run_id)
        await _end(host, loop, "failed", ErrorCategory.INTERNAL)
    else:
        if outcome.status == "completed":
            await _end(host, loop, "completed")
        else:
            await database_sync_to_async(cancel_if_requested)(run_id)
    finally:
        watcher.cancel()
        host.stop_pushing()
        keeper().release(run_id)
        _hosts.pop(run_id, None)
    await _start_next(prepared.chat)


async def _compact_only(loop: AgentLoop) -> LoopOutcome:
    """ "Compact now": the same compaction path as automatic, outside a reply."""
    if not await loop.compact_now():
        raise ProviderError(
            ErrorCategory.PROVIDER_ERROR, "The conversation could not be compacted right now."
        )
    return LoopOutcome("completed")


async def _watch(run_id: str, body: asyncio.Task, kept: KeptRun) -> str:
    """Cancel ``body`` on a cancel request or when the hang guard fires; say which.

    The cancel doorbell stops the run at once; the keeper's reading of the database
    flag (once per checkpoint interval, for all runs) is the fallback when it was lost.
    """
    layer = get_channel_layer()
    channel = await layer.new_channel()
    group = runs.run_control_group(run_id)
    await layer.group_add(group, channel)
    started = time.monotonic()
    try:
        while not body.done():
            try:
                message = await asyncio.wait_for(layer.receive(channel), WATCH_INTERVAL)
            except TimeoutError:
                message = None
            if (message and message.get("type") == "run.cancel") or kept.cancel_requested.is_set():
                body.cancel()
                return "cancel"
            if time.monotonic() - started > settings.LYCEUM_RUN_GUARD_SECONDS:
                body.cancel()
                return "guard"
        return "done"
    finally:
        await layer.group_discard(group, channel)


async def _watcher_reason(watcher: asyncio.Task) -> str:
    try:
        return await watcher
    except Exception:  # noqa: BLE001 - a broken doorbell still ends the run as cancelled
        logger.warning("run watcher failed", exc_info=True)
        return "cancel"


async def _end(host, loop: AgentLoop, how: str, category=None, message: str = "") -> None:
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
            message = "The reply took longer than the time limit and was stopped."
        category = ErrorCategory(category or ErrorCategory.PROVIDER_ERROR)
        message = message or USER_MESSAGES[category]
        event = ev.Error(category=str(category), message=message, partial_text=text)
        status = Run.Status.FAILED
    partial = runs.partial_message(text, reasoning, str(status)) if how != "completed" else None
    await database_sync_to_async(finish_run)(host, status, event, partial, usage)


def finish_run(host, status: str, event: ev.RunEvent, partial, usage) -> bool:
    """Write the one terminal state and event of a run. False if it had ended already."""
    run = host.run
    with transaction.atomic():
        updated = Run.objects.filter(pk=run.pk, status__in=runs.LIVE).update(
            status=status,
            finished_at=timezone.now(),
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            usage_estimated=usage.estimated,
            error_category=getattr(event, "category", ""),
            error_message=getattr(event, "message", ""),
            partial_text=getattr(event, "partial_text", ""),
            pending_message=None,
        )
        if not updated:
            return False
        # A run that ended before taking the message that started it (an early cancel)
        # must not leave it for _start_next to answer in a new run.
        QueuedInput.objects.filter(run=run.pk, consumed=False).update(consumed=True)
        # A run cancelled while it stored its approval request ends with it pending:
        # close it, so nobody can answer (or expire) it after the terminal event.
        ToolApproval.objects.filter(run=run.pk, status=ToolApproval.Status.PENDING).update(
            status=ToolApproval.Status.DENIED,
            reason="The reply ended before an answer.",
            decided_at=timezone.now(),
        )
        if partial is not None:
            host.channels.push_both(partial)
        rows = store.append_display_messages(run.chat_id, host.take_new_display())
        store.persist_context(run.chat_id, host.channels.context, host.persisted)
        rows += store.append_display(run.chat_id, [runs._stamp(event, run)])
        runs.ring(run.chat_id, rows)
    return True


def cancel_if_requested(run_id: str) -> None:
    """A cancel that arrived while the run was suspending ends it now.

    The watcher only sees cancels while the run executes; without this the cancel
    would be lost and the run would wait for an approval the user no longer wants.
    """
    with transaction.atomic():
        run = (
            Run.objects.select_for_update()
            .filter(pk=run_id, status=Run.Status.WAITING, cancel_requested=True)
            .first()
        )
        if run is not None:
            runs._finish_waiting_run_cancelled(run)


def finish_failed_early(run_id: str, message: str) -> None:
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return
    host = runs.DjangoRunHost(run, [])
    event = ev.Error(category=str(ErrorCategory.BAD_REQUEST), message=message)
    finish_run(host, Run.Status.FAILED, event, None, Usage())


async def _start_next(chat: ChatSession) -> None:
    """Messages sent while the run was finishing start the next run."""
    run_id = await database_sync_to_async(runs.start_run_if_idle)(chat)
    await dispatch(run_id)


# --- recovery ------------------------------------------------------------------------------------


def recover_stale_runs(*, everything: bool = False) -> list[str]:
    """Runs left running by a dead process become interrupted, keeping their checkpoint.

    ``everything`` is for start-up of the in-process runner, when no other process
    can be running them; otherwise only runs without a recent heartbeat count.
    """
    runs_to_recover = Run.objects.filter(status=Run.Status.RUNNING)
    if not everything:
        cutoff = timezone.now() - stale_after()
        runs_to_recover = runs_to_recover.filter(heartbeat_at__lt=cutoff) | runs_to_recover.filter(
            heartbeat_at__isnull=True, started_at__lt=cutoff
        )
    recovered = []
    for run in runs_to_recover.select_related("chat"):
        host = runs.DjangoRunHost(run, store.load_context(run.chat_id))
        text, reasoning = run.partial_text, run.partial_reasoning
        event = ev.Error(
            category=str(ErrorCategory.INTERRUPTED),
            message="The reply was interrupted because the server restarted. "
            "The text written so far is kept.",
            partial_text=text,
            status="interrupted",
        )
        partial = runs.partial_message(text, reasoning, str(Run.Status.INTERRUPTED))
        if finish_run(host, Run.Status.INTERRUPTED, event, partial, Usage()):
            recovered.append(str(run.pk))
    return recovered


# --- the worker consumer -----------------------------------------------------------------------


class RunWorkerConsumer(DirectDispatch, AsyncConsumer):
    """Receives runs on ``LYCEUM_WORKER_CHANNEL`` in ``manage.py runworker`` processes."""

    async def run_execute(self, message: dict) -> None:
        # Returns at once: the consumer handles one message at a time, runs go on as tasks.
        start_local(str(message["run_id"]), resume=bool(message.get("resume")))
        # A hundred sends at once otherwise waited for the channel layer to hand their
        # runs over one by one (several Redis round trips each, behind every stream this
        # worker already runs): the last started 20 s late. A run's own message, when
        # it comes, finds it claimed and does nothing.
        for run_id in await database_sync_to_async(unclaimed_runs)(CLAIM_EXTRA_RUNS):
            start_local(run_id, resume=True)  # resume: only if it waits with a decision
