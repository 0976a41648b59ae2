"""Run at every interpreter start on the contract tier's PYTHONPATH (subprocesses vLLM starts too):
the contract platform's module finder goes in before anything imports vLLM, so the modules it
fixes up (Triton present, CUTLASS queries) are fixed whichever imports first."""

from pdcheck_contract_platform import install_finder

install_finder()
