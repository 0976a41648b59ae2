"""`pdcheck eval` against a fake server: records, summary JSON, and exit codes 0, 2 and 3."""

from __future__ import annotations

import json

from aiohttp import web

from pdcheck.cli import main
from pdcheck.evals import read_records
from tests.fakes.openai_server import FakeOpenAIServer, echo_completion
from tests.unit.evals.conftest import make_task, write_folder


def test_eval_writes_records_and_summary(tmp_path, capsys):
    """A clean run exits 0, writes one record per question and the summary JSON, and prints the table."""
    data = write_folder(tmp_path / "data", make_task(n_test=6))
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    with FakeOpenAIServer() as server:
        code = main(
            [
                "eval",
                "--url",
                server.url,
                "--dataset",
                str(data),
                "--limit",
                "4",
                "--shots",
                "2",
                "--concurrency",
                "2",
                "--out",
                str(out),
                "--summary-out",
                str(summary),
            ]
        )
    assert code == 0
    assert [r.index for r in sorted(read_records(out), key=lambda r: r.index)] == [0, 1, 2, 3]
    saved = json.loads(summary.read_text())
    assert (saved["n"], saved["limit"], saved["concurrency"], saved["model"]) == (4, 4, 2, "fake")
    assert "accuracy" in capsys.readouterr().out


def test_failed_questions_exit_2(tmp_path, capsys):
    """Questions that failed make the command exit 2 and say how to retry them."""
    data = write_folder(tmp_path / "data", make_task(n_test=3))

    def flaky(body):
        return (
            echo_completion(body)
            if body["max_tokens"] == 1
            else web.Response(status=503, text="busy")
        )

    with FakeOpenAIServer(flaky) as server:
        code = main(
            [
                "eval",
                "--url",
                server.url,
                "--dataset",
                str(data),
                "--shots",
                "1",
                "--out",
                str(tmp_path / "r"),
            ]
        )
    assert code == 2
    assert "3 of 3 questions failed" in capsys.readouterr().err


def test_bad_options_exit_3_and_send_nothing(tmp_path):
    """Bad option values are refused with exit 3 before any request."""
    data = write_folder(tmp_path / "data", make_task())
    with FakeOpenAIServer() as server:
        base = ["eval", "--url", server.url, "--dataset", str(data), "--out", str(tmp_path / "r")]
        assert main([*base, "--chat-template-kwargs", "not json", "--style", "chat"]) == 3
        assert main([*base, "--chat-template-kwargs", '{"enable_thinking": false}']) == 3
        assert main([*base, "--engine", "lm-eval", "--style", "vllm"]) == 3
        assert main([*base, "--concurrency", "0"]) == 3
        assert main([*base, "--shots", "50"]) == 3
        assert server.requests == []


def test_missing_dataset_exits_2_with_how_to(tmp_path, capsys):
    """A dataset folder without the files is a DatasetError (exit 2) that says how to provide GSM8K."""
    code = main(
        [
            "eval",
            "--url",
            "http://127.0.0.1:9",
            "--dataset",
            str(tmp_path),
            "--out",
            str(tmp_path / "r"),
        ]
    )
    assert code == 2
    assert "test.jsonl" in capsys.readouterr().err
