"""Typed run events: one stream per run, the same for every transport.

Each event serialises to a JSON object with snake_case fields, a ``type`` naming
the event, and (once stored or pushed) the ``chat_id``, ``run_id`` and ``seq``
of the display channel. Every run ends with exactly one terminal event:
``complete``, ``cancelled`` or ``error``.

| type | fields |
| --- | --- |
| ``run_start`` | model |
| ``iteration_start`` | iteration, max_iterations |
| ``delta`` | text, speaker (a voice's name, in a run with several) |
| ``thinking_delta`` | text |
| ``retrying`` | attempt, max_attempts, delay, category, message |
| ``tool_start`` | call_id, name, input |
| ``tool_end`` | call_id, name, output, status (done / failed / denied / cancelled) |
| ``approval_required`` | call_id, name, input, expires_at |
| ``approval_decided`` | call_id, name, decision (approved / denied / expired), reason |
| ``hand_start`` | name, label, params |
| ``hand_end`` | name, label, result |
| ``subtask_status`` | task_id, description, status, detail |
| ``compacting`` | (none) |
| ``compacted`` | messages_before, summary |
| ``context_usage`` | tokens, context_window, measured (the provider's count after a reply) |
| ``input_taken`` | input_seq |
| ``artifact`` | artifact_id, version_id, version, path, kind, language, size, source |
| ``complete`` | input_tokens, output_tokens, usage_estimated, text |
| ``cancelled`` | partial_text |
| ``error`` | category, message, partial_text, status (failed / interrupted) |
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(kw_only=True)
class RunEvent:
    type: ClassVar[str] = ""
    terminal: ClassVar[bool] = False
    persisted: ClassVar[bool] = True  # stored in the display channel (deltas are not)

    chat_id: str = ""
    run_id: str = ""
    seq: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **dataclasses.asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)


@dataclass(kw_only=True)
class RunStart(RunEvent):
    type: ClassVar[str] = "run_start"
    model: str


@dataclass(kw_only=True)
class IterationStart(RunEvent):
    type: ClassVar[str] = "iteration_start"
    iteration: int
    max_iterations: int


@dataclass(kw_only=True)
class Delta(RunEvent):
    type: ClassVar[str] = "delta"
    persisted: ClassVar[bool] = False
    text: str
    speaker: str = ""  # in a run with several voices: whose reply the text belongs to


@dataclass(kw_only=True)
class ThinkingDelta(RunEvent):
    type: ClassVar[str] = "thinking_delta"
    persisted: ClassVar[bool] = False
    text: str


@dataclass(kw_only=True)
class RetryingEvent(RunEvent):
    type: ClassVar[str] = "retrying"
    attempt: int
    max_attempts: int
    delay: float
    category: str
    message: str


@dataclass(kw_only=True)
class ToolStart(RunEvent):
    type: ClassVar[str] = "tool_start"
    call_id: str
    name: str
    input: Any


@dataclass(kw_only=True)
class ToolEnd(RunEvent):
    type: ClassVar[str] = "tool_end"
    call_id: str
    name: str
    output: str
    status: str  # done | failed | denied


@dataclass(kw_only=True)
class ApprovalRequired(RunEvent):
    type: ClassVar[str] = "approval_required"
    call_id: str
    name: str
    input: Any
    expires_at: str


@dataclass(kw_only=True)
class ApprovalDecided(RunEvent):
    type: ClassVar[str] = "approval_decided"
    call_id: str
    name: str
    decision: str  # approved | denied | expired
    reason: str = ""


@dataclass(kw_only=True)
class HandStart(RunEvent):
    type: ClassVar[str] = "hand_start"
    name: str
    label: str
    params: Any


@dataclass(kw_only=True)
class HandEnd(RunEvent):
    type: ClassVar[str] = "hand_end"
    name: str
    label: str
    result: Any


@dataclass(kw_only=True)
class SubtaskStatus(RunEvent):
    type: ClassVar[str] = "subtask_status"
    task_id: str
    description: str
    status: str
    detail: str = ""


@dataclass(kw_only=True)
class Compacting(RunEvent):
    type: ClassVar[str] = "compacting"


@dataclass(kw_only=True)
class Compacted(RunEvent):
    type: ClassVar[str] = "compacted"
    messages_before: int
    summary: str


@dataclass(kw_only=True)
class ContextUsage(RunEvent):
    type: ClassVar[str] = "context_usage"
    tokens: int
    context_window: int
    # False: our estimate of the prompt, before a request. True: the provider's own
    # count (prompt plus reply) after it, which is what the next request starts from.
    measured: bool = False


@dataclass(kw_only=True)
class InputTaken(RunEvent):
    type: ClassVar[str] = "input_taken"
    input_seq: int


@dataclass(kw_only=True)
class ArtifactSaved(RunEvent):
    """A version of a chat's file was stored (a tool wrote it, or a reply's code block).

    Written by the Django side (``chat.artifacts``), in the run's display log; API
    followers get it like any other event of the run.
    """

    type: ClassVar[str] = "artifact"
    artifact_id: str
    version_id: str
    version: int
    path: str
    kind: str
    language: str = ""
    size: int = 0
    source: str = "file"


@dataclass(kw_only=True)
class Complete(RunEvent):
    type: ClassVar[str] = "complete"
    terminal: ClassVar[bool] = True
    input_tokens: int
    output_tokens: int
    usage_estimated: bool = False
    text: str = ""


@dataclass(kw_only=True)
class Cancelled(RunEvent):
    type: ClassVar[str] = "cancelled"
    terminal: ClassVar[bool] = True
    partial_text: str = ""


@dataclass(kw_only=True)
class Error(RunEvent):
    type: ClassVar[str] = "error"
    terminal: ClassVar[bool] = True
    category: str
    message: str
    partial_text: str = ""
    status: str = "failed"  # failed | interrupted


_EVENT_CLASSES: tuple[type[RunEvent], ...] = (
    RunStart,
    IterationStart,
    Delta,
    ThinkingDelta,
    RetryingEvent,
    ToolStart,
    ToolEnd,
    ApprovalRequired,
    ApprovalDecided,
    HandStart,
    HandEnd,
    SubtaskStatus,
    Compacting,
    Compacted,
    ContextUsage,
    InputTaken,
    ArtifactSaved,
    Complete,
    Cancelled,
    Error,
)
EVENT_TYPES: dict[str, type[RunEvent]] = {cls.type: cls for cls in _EVENT_CLASSES}
TERMINAL_TYPES = frozenset(name for name, cls in EVENT_TYPES.items() if cls.terminal)


def event_from_dict(data: dict[str, Any]) -> RunEvent:
    """Parse an event's JSON object; unknown types and fields raise ``ValueError``."""
    try:
        cls = EVENT_TYPES[data["type"]]
    except KeyError:
        raise ValueError(f"unknown run event type: {data.get('type')!r}") from None
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - fields - {"type"}
    if unknown:
        raise ValueError(f"unknown fields for {cls.type}: {sorted(unknown)}")
    return cls(**{k: v for k, v in data.items() if k != "type"})
