"""The control channel: a stop() from another thread ends a control request in flight instead of pulling its socket
away (CI once saw "Socket operation on non-socket" when a Triton.stop() met serve()'s model load)."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from pyserve.core_process import ControlChannel
from pyserve.errors import ServerError
from pyserve.transport.protocol import Serving


def test_close_from_another_thread_fails_the_waiting_request() -> None:
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # takes the request and never answers
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    channel = ControlChannel(f"tcp://127.0.0.1:{port}", "the silent peer")
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            channel.request(Serving.build, timeout_s=30)
        except BaseException as exc:
            errors.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    try:
        assert silent.poll(5000), "the request never reached the peer"
        started = time.monotonic()
        channel.close()
        asking.join(5)
        assert not asking.is_alive()
        assert time.monotonic() - started < 2
        assert len(errors) == 1 and isinstance(errors[0], ServerError), errors
        assert "stopped" in str(errors[0])
        with pytest.raises(ServerError, match="closed"):
            channel.request(Serving.build, timeout_s=1)
    finally:
        silent.close(linger=0)
