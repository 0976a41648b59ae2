"""`check_serve_argvs` finds vLLM's serve parser wherever the vLLM release keeps it.

Each test builds a stand-in `vllm` package with only the parser module of one release's layout
and puts it first on the child python's path: no real vLLM is imported. (Moved from
tests/unit/serving: each check runs a child python.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pdcheck.errors import InfraError
from pdcheck.serving.argcheck import check_serve_argvs

_ARGPARSE_UTILS = "import argparse\nFlexibleArgumentParser = argparse.ArgumentParser\n"
_CLI_ARGS = """
def make_arg_parser(parser):
    parser.add_argument("model")
    parser.add_argument("--port", type=int)
    return parser


def validate_parsed_serve_args(args):
    if args.port == 1:
        raise ValueError("port 1 is reserved")
"""


def _fake_vllm(root: Path, parser_module: str | None) -> Path:
    """A `vllm` package under root whose serve parser lives in `parser_module` (None: nowhere)."""
    files = {
        "vllm/utils/argparse_utils.py": _ARGPARSE_UTILS,
        "vllm/entrypoints/launchers/run_batch.py": "",
    }
    if parser_module is not None:
        files[parser_module.replace(".", "/") + ".py"] = _CLI_ARGS
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in {p for rel in files for p in Path(rel).parents if p != Path(".")}:
        (root / package / "__init__.py").touch()
    return root


@pytest.mark.parametrize(
    "parser_module",
    [
        "vllm.entrypoints.common.cli_args",  # vLLM 0.33
        "vllm.entrypoints.launchers.cli_args",  # vLLM 0.32
        "vllm.entrypoints.openai.cli_args",  # before 0.32
    ],
)
def test_serve_parser_is_found_in_every_release_layout(tmp_path, monkeypatch, parser_module):
    """Good argv parses, a bad value and a failed validation are named, whichever module holds the parser."""
    monkeypatch.setenv("PYTHONPATH", str(_fake_vllm(tmp_path, parser_module)))
    argvs = [
        ["vllm", "serve", "m", "--port", "8000"],
        ["vllm", "serve", "m", "--port", "eighty"],
        ["vllm", "serve", "m", "--port", "1"],
    ]
    good, bad_value, invalid = check_serve_argvs(argvs, sys.executable)
    assert good == []
    assert len(bad_value) == 1 and "--port" in bad_value[0] and "'eighty'" in bad_value[0]
    assert invalid == ["ValueError: port 1 is reserved"]


def test_a_vllm_without_a_serve_parser_is_an_infra_error_naming_where_it_looked(
    tmp_path, monkeypatch
):
    """No known home holds make_arg_parser: the error lists the modules tried instead of a bare ImportError."""
    monkeypatch.setenv("PYTHONPATH", str(_fake_vllm(tmp_path, None)))
    with pytest.raises(
        InfraError,
        match=r"no vLLM module among vllm\.entrypoints\.common\.cli_args, .* has make_arg_parser",
    ):
        check_serve_argvs([["vllm", "serve", "m"]], sys.executable)
