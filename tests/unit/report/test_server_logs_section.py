"""Tracebacks in server logs are evidence the report names: the log, the line, the error.

The sample is what vLLM 0.32's API server printed when pdcheck signalled a server's whole
process group at once (its engine core died under it): the shutdown that issue 41 fixed.
"""

from __future__ import annotations

from pdcheck.report import render_markdown
from pdcheck.results import load_run
from pdcheck.results.server_logs import LogTraceback, find_tracebacks

from .conftest import CellPlan

ENGINE_DEAD_AT_SHUTDOWN = """\
(APIServer pid=5511) INFO 12-07 20:55:01 [core_client.py:777] [shutdown] MPClient: complete
(APIServer pid=5511) ERROR 12-07 20:55:01 [async_llm.py:906] AsyncLLM output_handler failed.
(APIServer pid=5511) ERROR 12-07 20:55:01 [async_llm.py:906] Traceback (most recent call last):
(APIServer pid=5511) ERROR 12-07 20:55:01 [async_llm.py:906]   File "vllm/v1/engine/async_llm.py", line 849, in output_handler
(APIServer pid=5511) ERROR 12-07 20:55:01 [async_llm.py:906]     outputs = await engine_core.get_output_async()
(APIServer pid=5511) ERROR 12-07 20:55:01 [async_llm.py:906]               ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(APIServer pid=5511) ERROR 12-07 20:55:01 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
(APIServer pid=5511) INFO 12-07 20:55:01 [launcher.py:279] [shutdown] API server: engine client stopped
INFO:     Shutting down
"""

CLEAN_STOP = """\
(APIServer pid=6567) INFO 12-07 20:55:41 [launcher.py:254] [shutdown] API server: shutdown triggered
(EngineCore pid=6797) INFO 12-07 20:55:41 [core.py:1499] [shutdown] EngineCore: exiting busy loop
INFO:     Application shutdown complete.
"""


def test_a_prefixed_traceback_is_found_with_the_error_that_ends_it():
    """vLLM's per-line prefixes are dropped; the error is the first unindented line after the frames."""
    assert find_tracebacks(ENGINE_DEAD_AT_SHUTDOWN, log="decode-0.log") == [
        LogTraceback(
            "decode-0.log",
            3,
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
            "See stack trace (above) for the root cause.",
        )
    ]
    assert find_tracebacks(CLEAN_STOP, log="decode-0.log") == []
    cut = 'Traceback (most recent call last):\n  File "x.py", line 1\n'
    assert find_tracebacks(cut, log="a.log") == [LogTraceback("a.log", 1, "")]


def _write_logs(root, logs: dict[str, str]) -> None:
    (cell_dir,) = (root / "cells").iterdir()
    (cell_dir / "logs").mkdir(exist_ok=True)
    for name, text in logs.items():
        (cell_dir / "logs" / name).write_text(text)


def test_the_report_names_each_log_with_a_traceback(make_run):
    root = make_run([CellPlan("fixes-on")], n=20)
    _write_logs(root, {"decode-0.log": ENGINE_DEAD_AT_SHUTDOWN, "prefill-0.log": CLEAN_STOP})
    text = render_markdown(load_run(root))
    assert "## Server logs" in text
    assert "1 traceback in the 2 server logs of the run" in text
    assert "`decode-0.log` line 3: vllm.v1.engine.exceptions.EngineDeadError" in text


def test_clean_logs_are_said_to_be_clean_and_no_logs_gives_no_section(make_run):
    root = make_run([CellPlan("fixes-on")], n=20)
    _write_logs(root, {"decode-0.log": CLEAN_STOP, "prefill-0.log": CLEAN_STOP})
    assert "No traceback in the 2 server logs of the run." in render_markdown(load_run(root))
    for log in (root / "cells").glob("*/logs/*.log"):
        log.unlink()
    assert "## Server logs" not in render_markdown(load_run(root))
