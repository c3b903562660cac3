"""Who reads a sealed run's content outside the store: ``runs transcript``, ``runs follow``,
``runs history --calls``, :func:`attach_stream` and OpenTelemetry's content capture, on SQLite and
PostgreSQL. A process holding the keys reads the real text; one without them gets one line naming
the key id (the CLI: exit 2), and never the stored ``gfd1:`` text as if it were the message."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import Iterator

import pytest
from autogen_agentchat.base import TaskResult
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agents import Scripted, chain, close_stores, durable, fail_once
from graphflow_durable import attach_stream
from graphflow_durable.cli.runs import EXIT_OK, EXIT_USAGE
from graphflow_durable.crypto import AESGCMCodec
from graphflow_durable.errors import StoreConfigError
from graphflow_durable.store import CallRecord, Store

from .test_cli_manage import cli, one_line_error

KEY = os.urandom(32)
TASK = "refund Jane Roe, IBAN DE89 3704 0044 0532 0130 00"
SAID = "the card ending 4242 was charged twice"
RESULT = '{"content": "account 7781 balance 12.00 EUR"}'


def codec() -> AESGCMCodec:
    return AESGCMCodec({"k1": KEY}, active="k1")


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    close_stores()


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's commands hold the key (``GRAPHFLOW_DURABLE_KEYS``)."""
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", "k1=" + base64.b64encode(KEY).decode())


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAPHFLOW_DURABLE_KEYS", raising=False)
    monkeypatch.delenv("GRAPHFLOW_DURABLE_ACTIVE_KEY", raising=False)


@pytest.fixture
def sealed(store_url: str) -> str:
    """Run ``r`` (A -> B, finished) written through the codec, with a recorded model call of A's turn."""
    with Store(store_url, codec=codec()) as store:
        a, b = Scripted("A", [SAID]), Scripted("B")
        asyncio.run(durable([a, b], chain(a, b), store, "r").run(task=TASK))
        record = CallRecord(
            run_id="r", turn_key="r/A/2", node="A", step=2, attempt=1, kind="model", name="gpt-test",
            ident="0", fingerprint="fp-0", outcome="live", result=RESULT, prompt_tokens=10,
            completion_tokens=2, created_at=time.time(),
        )  # fmt: skip
        store.calls.record(record, fencing_token=None)
    return store_url


def no_ciphertext(*outputs: list[str]) -> None:
    for lines in outputs:
        assert not [line for line in lines if "gfd1:" in line], lines


def test_transcript_with_the_keys_prints_the_text_and_without_names_the_key_in_one_line(
    sealed: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", "k1=" + base64.b64encode(KEY).decode())
    code, out, err = cli(capsys, sealed, "transcript", "r")
    assert (code, err) == (EXIT_OK, [])
    assert out[0] == f"[0] user: {TASK}" and SAID in out[1] and out[2].startswith("[2] B: B#1")
    code, out, err = cli(capsys, sealed, "transcript", "r", "--json")
    assert code == EXIT_OK and json.loads(out[0])["message"]["content"] == TASK
    no_ciphertext(out, err)

    monkeypatch.delenv("GRAPHFLOW_DURABLE_KEYS")
    for args in (["transcript", "r"], ["transcript", "r", "--json"], ["follow", "r"]):
        code, out, err = cli(capsys, sealed, *args)
        assert (code, out) == (EXIT_USAGE, []), args
        one_line_error(err, "'k1'", "GRAPHFLOW_DURABLE_KEYS")
        no_ciphertext(err)
        assert TASK not in err[0] and SAID not in err[0]


def test_follow_with_the_keys_prints_each_message_and_ends_with_the_round(
    sealed: str, capsys: pytest.CaptureFixture[str], keys: None
) -> None:
    code, out, err = cli(capsys, sealed, "follow", "r", "--after", "0")
    assert code == EXIT_OK, err
    assert len(out) == 2 and out[0].startswith("[1] A: ") and SAID in out[0]
    no_ciphertext(out, err)


def test_history_and_the_calls_list_show_no_ciphertext_with_or_without_the_keys(
    sealed: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step list and the call list show plain columns only (seqs, nodes, kinds, tokens): a
    store opened without the keys lists them too, and never prints a sealed value."""
    shown: dict[bool, list[list[str]]] = {}
    for held in (True, False):
        if held:
            monkeypatch.setenv("GRAPHFLOW_DURABLE_KEYS", "k1=" + base64.b64encode(KEY).decode())
        else:
            monkeypatch.delenv("GRAPHFLOW_DURABLE_KEYS")
        found = []
        for args in (["history", "r", "--calls"], ["history", "r", "--calls", "--json"], ["history", "r"]):
            code, out, err = cli(capsys, sealed, *args)
            no_ciphertext(out, err)
            assert not [line for line in out + err if TASK in line or "7781" in line]
            if code == EXIT_USAGE:  # refused as a whole: one line naming the key
                assert not held and out == []
                one_line_error(err, "'k1'")
            else:
                assert (code, err) == (EXIT_OK, []), (held, args)
            found.append(out)
        shown[held] = found
    calls = [json.loads(line) for line in shown[True][1]]
    assert [(c["node"], c["kind"], c["prompt_tokens"]) for c in calls] == [("A", "model", 10)]


async def test_attach_stream_with_the_keys_yields_the_text_and_without_raises_naming_the_key(
    sealed: str,
) -> None:
    with Store(sealed, codec=codec()) as store:
        seen = [m async for m in attach_stream(store, "r")]
    *messages, result = seen
    assert isinstance(result, TaskResult)
    assert messages[0].to_text() == TASK and SAID in messages[1].to_text()
    assert not [m for m in messages if "gfd1:" in m.to_text()]

    with Store(sealed) as keyless:
        with pytest.raises(StoreConfigError, match="'k1'") as raised:
            async for m in attach_stream(keyless, "r"):
                assert "gfd1:" not in m.to_text(), "a sealed value was yielded as a message"
        assert "\n" not in str(raised.value) and "gfd1:" not in str(raised.value)


async def test_content_capture_puts_the_text_on_the_spans_of_a_run_resumed_from_a_sealed_store(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spans carry what the agents saw and said (the opt-in), never the stored ciphertext:
    also on an attach whose agents' input was rebuilt from sealed rows."""
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    own = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(own))
    with Store(store_url, codec=codec()) as store:
        a, b = Scripted("A", [SAID], before=fail_once()), Scripted("B")
        with pytest.raises(RuntimeError):
            await durable([a, b], chain(a, b), store, "t", tracer_provider=provider).run(task=TASK)
        a, b = Scripted("A", [SAID]), Scripted("B")
        result = await durable([a, b], chain(a, b), store, "t", tracer_provider=provider).run()
    assert SAID in result.messages[1].to_text()
    values = [str(v) for s in own.get_finished_spans() for v in (s.attributes or {}).values()]
    assert not [v for v in values if "gfd1:" in v]
    outputs = [v for v in values if SAID in v]
    assert outputs, "the resumed turn's answer is on its span"
