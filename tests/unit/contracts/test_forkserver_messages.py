"""The fork server's messages: one typed definition, framed the same way by both ends of the socket."""

from __future__ import annotations

import os
import socket

import pytest

from pdcheck._vllm.forkserver import recv_message, send_message
from pdcheck.contracts.forkserver import (
    REPLIES,
    REQUESTS,
    Exited,
    Forked,
    ForkRequest,
    Refused,
)


def test_a_request_and_its_replies_arrive_as_sent_with_the_streams():
    """What a launcher sends (argv, env, folder, group and three streams) is what the fork server
    reads, and each reply reads back as its own type, in order; end of stream is None."""
    launcher, server = socket.socketpair()
    r, w = os.pipe()
    request = ForkRequest(argv=["serve", "m"], env={"A": "1"}, cwd="/tmp", pgid=42)
    try:
        send_message(launcher, request, fds=[r, w, r])
        got, fds = recv_message(server, REQUESTS, max_fds=3)
        assert got == request and len(fds) == 3
        for fd in fds:
            os.close(fd)
        replies = [Refused("no vLLM"), Forked(7), Exited(137)]
        for reply in replies:
            send_message(server, reply)
        assert [recv_message(launcher, REPLIES)[0] for _ in replies] == replies
        server.close()
        assert recv_message(launcher, REPLIES) == (None, [])
    finally:
        launcher.close()
        server.close()
        os.close(r)
        os.close(w)


def test_a_message_of_another_shape_is_a_value_error():
    """A reply where a request belongs (or garbage) raises ValueError, which the fork server
    treats as one launcher's fault, never as the end of its loop."""
    launcher, server = socket.socketpair()
    try:
        send_message(launcher, Forked(1))
        with pytest.raises(ValueError):
            recv_message(server, REQUESTS)
    finally:
        launcher.close()
        server.close()
