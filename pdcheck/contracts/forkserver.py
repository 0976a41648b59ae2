"""The messages between a launcher and the vLLM fork server, on the fork server's Unix socket.

A launcher (`python -m pdcheck._vllm.launch` with `PDCHECK_VLLM_FORKSERVER` set) sends one
`ForkRequest`, its standard streams beside the first bytes. The fork server answers `Refused`
(it cannot start servers: vLLM did not import), or `Forked` with the server's pid, then
`Exited` with the server's exit code once it has exited. Each message is length-prefixed JSON.
"""

from __future__ import annotations

import msgspec


class ForkRequest(msgspec.Struct, frozen=True, tag=True):
    """One launcher's server: what vLLM's `main()` runs and where, and the group it joins."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    pgid: int


class Refused(msgspec.Struct, frozen=True, tag=True):
    """The fork server cannot start servers; `error` says why (vLLM's import traceback)."""

    error: str


class Forked(msgspec.Struct, frozen=True, tag=True):
    pid: int


class Exited(msgspec.Struct, frozen=True, tag=True):
    """The server has exited: `code` is a shell's exit code (128 + the signal that ended it)."""

    code: int


Reply = Refused | Forked | Exited

# What each side reads: the fork server a request, a launcher the replies.
REQUESTS = msgspec.json.Decoder(ForkRequest)
REPLIES = msgspec.json.Decoder(Reply)
