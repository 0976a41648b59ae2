"""The slow tier: no vLLM, but real child processes, signals or model builds, seconds per test.

Every test here is marked `slow` (tests/conftest.py), so `make test-fast` leaves it out and
`make test` runs it. The sweep tests here use the fake servers of tests/unit/sweep.
"""

from tests.unit.sweep.conftest import gold_by_question, servers, sweep_file

__all__ = ["gold_by_question", "servers", "sweep_file"]
