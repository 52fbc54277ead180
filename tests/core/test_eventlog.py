"""Event log rules: safe cut, replay, sanitize / load repair, rebuilding channels."""

from __future__ import annotations

import json

from hypothesis import given, settings

from chat.core.channels import strip_agent_xml_tag
from chat.core.eventlog import (
    LoadedLog,
    clear_event,
    display_from_context,
    load,
    msg_event,
    rebuild_channels,
    repair_orphans,
    replay,
    restore_event,
    safe_cut,
    sanitize,
)
from chat.core.messages import (
    ChatMessage,
    Image,
    Role,
    ToolCall,
    assistant,
    system,
    tool_result,
    user,
)
from tests.core.strategies import (
    IMAGE_MARKER,
    LiveChatScript,
    LiveRun,
    as_stored,
    live_chats,
    run_live_chat,
)


def calls(*ids: str) -> list[ToolCall]:
    return [ToolCall(id=call_id, name="search", arguments="{}") for call_id in ids]


def request(*ids: str, text: str = "") -> ChatMessage:
    return assistant(text, tool_calls=calls(*ids))


def events_for(messages: list[ChatMessage]) -> list[dict]:
    return [as_stored(msg_event(m)) for m in messages]


# --- events ----------------------------------------------------------------------------


def test_msg_event_flattens_the_message_and_stamps_time():
    assert msg_event(user("hi"), timestamp_ms=5) == {
        "type": "msg",
        "role": "user",
        "content": "hi",
        "timestamp_ms": 5,
    }
    assert "timestamp_ms" not in msg_event(user("hi"))


def test_msg_event_never_carries_images():
    event = msg_event(user("see", images=[Image(base64=IMAGE_MARKER, media_type="image/png")]))
    assert "images" not in event
    assert IMAGE_MARKER not in json.dumps(event)


def test_restore_event_holds_unflattened_messages():
    assert restore_event([user("a"), tool_result("c", "r")]) == {
        "type": "restore",
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "tool", "content": "r", "tool_call_id": "c"},
        ],
    }
    assert clear_event() == {"type": "clear"}


# --- safe_cut --------------------------------------------------------------------------


def test_safe_cut_of_plain_messages_is_the_end():
    messages = [system("s"), user("a"), assistant("b"), user("c")]
    assert safe_cut(messages) == 4
    assert safe_cut([]) == 0


def test_safe_cut_leaves_an_open_group_at_the_tail():
    messages = [user("a"), request("x", "y"), tool_result("x", "rx")]
    assert safe_cut(messages) == 1
    assert safe_cut(messages[:2]) == 1


def test_safe_cut_includes_a_closed_group():
    messages = [user("a"), request("x"), tool_result("x", "r")]
    assert safe_cut(messages) == 3


def test_safe_cut_with_several_calls_waits_for_every_result():
    messages = [user("a"), request("x", "y", "z"), tool_result("z", ""), tool_result("x", "")]
    assert safe_cut(messages) == 1
    assert safe_cut([*messages, tool_result("y", "")]) == 5
    assert safe_cut([*messages, tool_result("y", ""), assistant("done")]) == 6


def test_safe_cut_does_not_pass_an_open_group_even_with_later_plain_messages():
    messages = [user("a"), request("x"), user("b"), assistant("c")]
    assert safe_cut(messages) == 1


def test_safe_cut_counts_results_not_ids():
    messages = [request("", ""), tool_result("", ""), tool_result("", "")]
    assert safe_cut(messages) == 3


def test_safe_cut_clamps_a_stray_result_to_zero_pending():
    # Without the clamp, pending -1 would swallow the next call and block "b" for ever.
    messages = [tool_result("orphan", ""), user("b"), request("x"), tool_result("x", "")]
    assert safe_cut(messages) == 4
    assert safe_cut(messages[:2]) == 2
    assert safe_cut(messages[:3]) == 2


def test_safe_cut_stray_results_inside_a_group_count_towards_it():
    # Count-based, as the reference: an extra result closes the group early.
    messages = [request("x"), tool_result("zzz", ""), tool_result("x", ""), user("a")]
    assert safe_cut(messages) == 4


def test_safe_cut_from_a_start_offset():
    messages = [request("x"), user("a"), assistant("b")]
    assert safe_cut(messages, 1) == 3
    assert safe_cut(messages, 3) == 3
    assert safe_cut(messages, 5) == 5
    assert safe_cut([user("a"), request("x")], 1) == 1


def test_safe_cut_assistant_with_empty_tool_calls_is_complete():
    assert safe_cut([user("a"), assistant(tool_calls=[])]) == 2
    assert safe_cut([request("x"), assistant(tool_calls=[])]) == 0


# --- replay ----------------------------------------------------------------------------


def test_replay_of_msg_clear_restore():
    events = [
        msg_event(user("a")),
        msg_event(assistant("b")),
        clear_event(),
        msg_event(user("c")),
        restore_event([user("r1"), assistant("r2")]),
        msg_event(user("d")),
    ]
    assert replay(events) == [user("r1"), assistant("r2"), user("d")]
    assert replay(events[:3]) == []
    assert replay([]) == []


def test_replay_ignores_unknown_event_types():
    events = [
        msg_event(user("a")),
        {"type": "metrics", "metrics": {"total_llm_calls": 1}},
        {"role": "user", "content": "no type"},
        msg_event(user("b")),
    ]
    assert replay(events) == [user("a"), user("b")]


def test_replay_restore_with_null_messages_empties():
    assert replay([msg_event(user("a")), {"type": "restore", "messages": None}]) == []


def test_replay_round_trips_every_kind_of_message():
    messages = [
        system("s"),
        user("u"),
        request("x", text="t"),
        tool_result("x", "r"),
        assistant("<Bob>hi</Bob>", sender_name="Bob", reasoning_content="hm"),
        assistant(tool_calls=[]),
    ]
    assert replay(events_for(messages)) == messages


# --- sanitize and load repair ----------------------------------------------------------


def test_sanitize_keeps_a_well_formed_list():
    messages = [user("a"), request("x", "y"), tool_result("y", ""), tool_result("x", "")]
    assert sanitize(messages) == messages


def test_sanitize_drops_orphan_results():
    messages = [user("a"), tool_result("nobody", "r"), assistant("b")]
    assert sanitize(messages) == [user("a"), assistant("b")]


def test_sanitize_removes_unanswered_calls_and_keeps_the_message_even_if_empty():
    messages = [request("x", "y", text="t"), tool_result("x", ""), request("z")]
    assert sanitize(messages) == [request("x", text="t"), tool_result("x", ""), assistant()]
    assert sanitize(messages)[2].tool_calls is None


def test_sanitize_drops_empty_ids_on_both_sides():
    messages = [request("", "x"), tool_result("", ""), tool_result("x", "")]
    assert sanitize(messages) == [request("x"), tool_result("x", "")]


def test_sanitize_pairs_by_id_in_any_order():
    messages = [tool_result("x", "early"), request("x")]
    assert sanitize(messages) == messages


def test_sanitize_leaves_empty_tool_calls_list_alone():
    assert sanitize([assistant(tool_calls=[])]) == [assistant(tool_calls=[])]


def test_sanitize_does_not_mutate_its_input():
    original = [request("x", "y"), tool_result("x", "")]
    snapshot = [m.copy() for m in original]
    sanitize(original)
    assert original == snapshot


def test_repair_differs_from_sanitize_on_blank_emptied_messages():
    messages = [user("a"), request("x"), request("y", text="keep me"), assistant("b")]
    assert sanitize(messages) == [user("a"), assistant(), assistant("keep me"), assistant("b")]
    repaired, changed = repair_orphans(messages)
    assert repaired == [user("a"), assistant("keep me"), assistant("b")]
    assert changed


def test_repair_treats_whitespace_as_blank_but_keeps_reasoning():
    messages = [
        request("x", text="  \n"),
        assistant("", tool_calls=calls("y"), reasoning_content="r"),
    ]
    repaired, _ = repair_orphans(messages)
    assert repaired == [assistant("", reasoning_content="r")]


def test_repair_reports_no_change_for_a_clean_list():
    messages = [user("a"), request("x"), tool_result("x", ""), assistant(tool_calls=[])]
    assert repair_orphans(messages) == (messages, False)


def test_load_repairs_and_reports_it():
    events = events_for([user("a"), request("x", "y"), tool_result("x", ""), tool_result("", "")])
    loaded = load(events)
    assert loaded.messages == [user("a"), request("x"), tool_result("x", "")]
    assert loaded.repaired
    repair = loaded.repair_event()
    assert repair is not None and repair["type"] == "restore"
    assert replay([*events, repair]) == loaded.messages
    again = load([*events, as_stored(repair)])
    assert again == LoadedLog(messages=loaded.messages, repaired=False)


def test_load_of_a_clean_log_is_not_repaired():
    events = events_for([user("a"), request("x"), tool_result("x", "")])
    loaded = load(events)
    assert not loaded.repaired
    assert loaded.repair_event() is None
    assert load([]) == LoadedLog(messages=[], repaired=False)


def test_load_drops_the_blank_message_that_lost_its_calls():
    loaded = load(events_for([user("a"), request("x")]))
    assert loaded == LoadedLog(messages=[user("a")], repaired=True)


# --- rebuilding channels ---------------------------------------------------------------


def test_rebuild_without_display_derives_it_from_context():
    context = [
        user("q"),
        assistant("<Bob>hi</Bob>", sender_name="Bob"),
        assistant("<Bob>unlabelled keeps tags</Bob>"),
        assistant("<Eve>other tag</Eve>", sender_name="Bob"),
        assistant("<Bob> spaced </Bob>", sender_name="Bob"),
    ]
    channels = rebuild_channels(context)
    assert channels.context == context
    assert [m.content for m in channels.display] == [
        "q",
        "hi",
        "<Bob>unlabelled keeps tags</Bob>",
        "<Eve>other tag</Eve>",
        " spaced ",
    ]
    assert [m.sender_name for m in channels.display] == [None, "Bob", None, "Bob", "Bob"]
    assert channels.held == []


def test_rebuild_with_an_empty_display_list_derives_it():
    context = [assistant("<Bob>hi</Bob>", sender_name="Bob")]
    assert [m.content for m in rebuild_channels(context, []).display] == ["hi"]


def test_rebuild_with_a_display_list_uses_it():
    context = [user("q"), assistant("<Bob>hi</Bob>", sender_name="Bob")]
    display = [
        user("q"),
        assistant("a draft", sender_name="Bob"),
        assistant("hi", sender_name="Bob"),
    ]
    channels = rebuild_channels(context, display)
    assert channels.display == display
    assert channels.context == context


def test_rebuilt_channels_are_independent_of_the_loaded_lists():
    context = [user("q")]
    channels = rebuild_channels(context)
    channels.push_both(user("next"))
    channels.display[0].content = "edited"
    assert context == [user("q")]


def test_display_from_context_copies():
    context = [user("q", extra={"run": "r"})]
    derived = display_from_context(context)
    derived[0].extra["seq"] = 1
    assert context[0].extra == {"run": "r"}


# --- properties over live chats --------------------------------------------------------


def tool_blocks_are_complete(messages: list[ChatMessage]) -> bool:
    """Every call message is directly followed by exactly its results, and no result
    stands anywhere else (labelled messages may follow the block)."""
    index = 0
    while index < len(messages):
        message = messages[index]
        if message.role == Role.TOOL:
            return False
        if message.is_tool_request:
            wanted = sorted(c.id for c in message.tool_calls or [])
            block = messages[index + 1 : index + 1 + len(wanted)]
            if [m.role for m in block] != [Role.TOOL] * len(wanted):
                return False
            if sorted(m.tool_call_id or "" for m in block) != wanted:
                return False
            index += len(wanted)
        index += 1
    return True


def pairs_by_id(messages: list[ChatMessage]) -> bool:
    """The load-time guarantee: non-empty ids, every call answered, every result asked."""
    requested = [c.id for m in messages if m.is_tool_request for c in m.tool_calls or []]
    answered = [m.tool_call_id for m in messages if m.role == Role.TOOL]
    return all(requested) and all(answered) and set(requested) == set(answered)


def is_stray(message: ChatMessage) -> bool:
    return (message.tool_call_id or "").startswith("orphan_")


def without_images(messages: list[ChatMessage]) -> list[ChatMessage]:
    return [m.copy(images=None) for m in messages]


SETTINGS = settings(max_examples=200, deadline=None)


@SETTINGS
@given(live_chats(orphans=False))
def test_persisted_log_has_no_split_tool_group(script: LiveChatScript):
    run = run_live_chat(script)
    assert tool_blocks_are_complete(replay(run.session_log))


@SETTINGS
@given(live_chats(all_results=True))
def test_stray_results_never_block_persistence_or_split_a_group(script: LiveChatScript):
    run = LiveRun()
    for push in script.pushes:
        if push.labelled:
            run.channels.push_labelled(push.message)
        else:
            run.channels.push_both(push.message)
        run.persist()
        if not run.channels.tool_group_open:
            assert run.persisted == len(run.channels.context)
    # Stray results are written as they come (load repairs them); groups stay whole.
    persisted = [m for m in replay(run.session_log) if not is_stray(m)]
    assert tool_blocks_are_complete(persisted)


@SETTINGS
@given(live_chats())
def test_loaded_log_pairs_every_call_and_result_even_with_orphans(script: LiveChatScript):
    run = run_live_chat(script)
    loaded = load(run.session_log)
    assert pairs_by_id(loaded.messages)
    assert tool_blocks_are_complete(loaded.messages)


@SETTINGS
@given(live_chats())
def test_log_replays_to_the_context_up_to_the_last_safe_cut(script: LiveChatScript):
    run = LiveRun()
    for push in script.pushes:
        if push.labelled:
            run.channels.push_labelled(push.message)
        else:
            run.channels.push_both(push.message)
        run.persist()
        context = run.channels.context
        assert run.persisted == safe_cut(context)
        assert replay(run.session_log) == without_images(context[: run.persisted])
    assert replay(run.display_log) == without_images(run.channels.display)


@SETTINGS
@given(live_chats())
def test_rebuild_is_idempotent(script: LiveChatScript):
    run = run_live_chat(script)
    loaded = load(run.session_log)
    log = list(run.session_log)
    if loaded.repaired:
        log.append(as_stored(loaded.repair_event()))
    assert load(log) == LoadedLog(messages=loaded.messages, repaired=False)

    channels = rebuild_channels(loaded.messages, replay(run.display_log))
    assert channels.context == loaded.messages
    assert safe_cut(channels.context) == len(channels.context)
    fresh_log = events_for(channels.context)
    assert load(fresh_log) == LoadedLog(messages=loaded.messages, repaired=False)
    again = rebuild_channels(load(fresh_log).messages, replay(events_for(channels.display)))
    assert again.context == channels.context
    assert again.display == channels.display
    derived = rebuild_channels(loaded.messages).display
    for shown, sent in zip(derived, loaded.messages, strict=True):
        assert shown == (sent if not sent.sender_name else shown)
        assert shown.sender_name == sent.sender_name


@SETTINGS
@given(live_chats())
def test_derived_display_matches_the_live_display_of_labelled_messages(script: LiveChatScript):
    run = run_live_chat(script)
    live = [(m.sender_name, m.content) for m in run.channels.display if m.sender_name]
    derived = display_from_context(run.channels.context + run.channels.held)
    assert [(m.sender_name, m.content) for m in derived if m.sender_name] == live
    for message in derived:
        if message.sender_name:
            assert strip_agent_xml_tag(message.sender_name, message.content) == message.content


@SETTINGS
@given(live_chats())
def test_images_never_reach_a_serialized_event(script: LiveChatScript):
    run = run_live_chat(script)
    loaded = load(run.session_log)
    events = [*run.session_log, *run.display_log, restore_event(loaded.messages)]
    for event in events:
        text = json.dumps(event)
        assert '"images"' not in text
        assert IMAGE_MARKER not in text
    assert all(m.images is None for m in replay(run.session_log) + replay(run.display_log))
