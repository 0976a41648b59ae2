"""Server failures say the same three things whichever way the server failed, and keep exit 2."""

from __future__ import annotations

import pytest

from pdcheck.errors import ExitCode, ServerCrashed, ServerFailure, ServerStartTimeout


@pytest.mark.parametrize(
    ("error", "problem"),
    [
        (
            ServerCrashed("decode-0", -9, "OOM\nkilled", "/run/logs/decode-0.log"),
            "exited with code -9",
        ),
        (
            ServerStartTimeout("decode-0", 600, "OOM\nkilled", "/run/logs/decode-0.log"),
            "did not answer /health within 600 s",
        ),
    ],
)
def test_a_server_failure_names_the_role_the_log_and_its_tail(error, problem):
    assert isinstance(error, ServerFailure)
    assert error.exit_code == ExitCode.INFRA
    head, tail = str(error).split("\n--- last lines of its log ---\n")
    assert head.startswith(f"decode-0 {problem}")
    assert head.endswith("(log: /run/logs/decode-0.log)")
    assert tail == "OOM\nkilled"
    assert (error.role, error.log_tail, error.log_path) == (
        "decode-0",
        "OOM\nkilled",
        "/run/logs/decode-0.log",
    )


def test_without_a_log_the_message_is_one_line():
    assert str(ServerCrashed("baseline-0", 1)) == "baseline-0 exited with code 1"
    assert ServerCrashed("baseline-0", 1).returncode == 1
    assert ServerStartTimeout("baseline-0", 2.5).timeout_s == 2.5
