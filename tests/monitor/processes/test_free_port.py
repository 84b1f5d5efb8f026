"""``free_port`` keeps a preferred port whose last connection is in TIME_WAIT (a second quick demo)."""

from __future__ import annotations

import socket

import pytest

from hyperwatch.monitor.processes.children import free_port


def port_in_time_wait() -> int:
    """A port whose listener is closed and whose accepted connection the server side closed first,
    so the kernel keeps that connection in TIME_WAIT on the port, as after a stopped service."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = int(listener.getsockname()[1])
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server closes first: TIME_WAIT is on its side, the port's side
        client.recv(1)
        client.close()
    return port


def test_a_port_in_time_wait_is_free_for_the_service() -> None:
    port = port_in_time_wait()
    # the old test bind (no SO_REUSEADDR) calls it taken
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))
    assert free_port("127.0.0.1", port) == port


def test_a_port_someone_listens_on_is_not_free() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = int(listener.getsockname()[1])
        other = free_port("127.0.0.1", port)
        assert other != port and other > 0
