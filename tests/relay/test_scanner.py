"""StreamScanner: the bytes pass unchanged, cut only at line ends; usage, [DONE], errors noted."""

from __future__ import annotations

import json
import random

from chat.relay.service import StreamScanner


def _event(obj: object, end: bytes = b"\n") -> bytes:
    return b"data: " + json.dumps(obj).encode() + end + end


def _stream(end: bytes = b"\n") -> bytes:
    chunks = [
        {"choices": [{"index": 0, "delta": {"content": f"w{i} "}}], "usage": None}
        for i in range(20)
    ]
    usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 20}}
    return (
        b"".join(_event(c, end) for c in chunks) + _event(usage, end) + b"data: [DONE]" + end + end
    )


def test_bytes_pass_unchanged_in_any_split():
    for end in (b"\n", b"\r\n"):
        body = _stream(end)
        rng = random.Random(1)
        for capture in (False, True):
            scanner, out, index = StreamScanner(capture_text=capture), [], 0
            while index < len(body):
                step = rng.randint(1, 40)
                out.append(scanner.feed(body[index : index + step]))
                index += step
            assert b"".join(out) == body
            assert scanner.done and scanner.usage == {"prompt_tokens": 7, "completion_tokens": 20}
            assert not scanner.malformed and not scanner.failed
            if capture:
                assert "".join(scanner.text) == "".join(f"w{i} " for i in range(20))


def test_null_usage_chunks_are_not_parsed(monkeypatch):
    import chat.relay.service as service

    parsed = []
    real = service.json.loads
    monkeypatch.setattr(service.json, "loads", lambda raw: parsed.append(raw) or real(raw))
    scanner = StreamScanner(capture_text=False)
    scanner.feed(_stream())
    assert len(parsed) == 1  # only the usage chunk


def test_a_malformed_line_stops_before_it():
    scanner = StreamScanner(capture_text=False)
    good = _event({"choices": []})
    out = scanner.feed(good + b'data: {"choices": [{"delta": {"content": "oops"\n\n')
    assert out == good and scanner.malformed


def test_errors_in_the_stream_are_noted():
    scanner = StreamScanner(capture_text=False)
    scanner.feed(_event({"error": {"message": "overloaded"}}))
    assert "overloaded" in scanner.failed
    other = StreamScanner(capture_text=False)
    other.feed(b'event: error\ndata: {"message": "x"}\n\n')
    assert other.failed
