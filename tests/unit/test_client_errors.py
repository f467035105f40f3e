"""Tests of pyserve.client.errors: a server's answer turned back into pyserve's error class."""

from __future__ import annotations

from pyserve.client.errors import server_error
from pyserve.errors import ModelNotReadyError, QueueFullError, WorkerDiedError


def test_the_kind_the_server_names_wins_over_the_status_and_the_words() -> None:
    assert type(server_error(503, "busy", kind="QueueFullError")) is QueueFullError
    assert type(server_error("INTERNAL", "gone", kind="WorkerDiedError")) is WorkerDiedError
    assert str(server_error(503, "busy", kind="QueueFullError")) == "busy"


def test_without_a_known_kind_the_status_and_words_decide_as_for_triton() -> None:
    assert type(server_error(503, "busy")) is ModelNotReadyError
    assert type(server_error(503, "busy", kind="NoSuchError")) is ModelNotReadyError
    assert type(server_error(503, "exceeds maximum queue size 4")) is QueueFullError
