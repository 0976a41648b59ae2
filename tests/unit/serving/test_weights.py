"""Weights before timers: which hub models a sweep fetches, how much it says it will download, and
the clear errors (exit 3) for a model the Hub does not have or an offline model not cached.

No network: `huggingface_hub.snapshot_download` is replaced by a fake Hub that answers its dry
run from a file list and records the real downloads; the offline cases read a real
huggingface_hub cache laid out in a temporary folder.
"""

from __future__ import annotations

import huggingface_hub
import pytest

from pdcheck.cli import main
from pdcheck.errors import ConfigError, ExitCode
from pdcheck.serving.weights import describe_weights, fetch_weights, hub_models
from tests.fakes.hub import FILES, FakeHub
from tests.unit.serving.conftest import make_cell

QWEN = "Qwen/Qwen3-0.6B"


@pytest.fixture
def hub(monkeypatch):
    fake = FakeHub()
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake.snapshot_download)
    return fake


def _cell(path=QWEN, *, name="qwen", serve_args=(), env=None, model_env=None):
    return make_cell(
        model={"name": name, "path": path, "serve_args": list(serve_args), "env": model_env or {}},
        matrix={"env": [env or {}]},
    )


def test_fixture_models_and_local_paths_need_nothing(tmp_path):
    """Only hub ids are fetched: a fixture model or a local folder is never sent to the Hub."""
    cells = [_cell("fixture:tiny-llama"), _cell(str(tmp_path)), _cell("/models/m")]
    assert hub_models(cells, environ={}) == []


def test_each_model_is_fetched_once_with_where_its_servers_look_for_it(tmp_path):
    """Two cells of one model are one fetch naming both; --revision and --download-dir come from
    the serve args, the cache and the offline switch from the servers' environment (the cell's
    env over the inherited one, the model's env over both; HF_HUB_CACHE over HF_HOME/hub)."""
    one = _cell(name="a")
    two = _cell(name="b")
    pinned = _cell(
        name="c",
        serve_args=["--revision", "v2", "--download-dir", str(tmp_path / "dl")],
        env={"HF_HUB_CACHE": "/ignored-for-download-dir"},
    )
    offline = _cell(
        name="d", env={"HF_HUB_CACHE": str(tmp_path / "cell")}, model_env={"HF_HUB_OFFLINE": "1"}
    )
    models = hub_models([one, two, pinned, offline], environ={"HF_HOME": "/home"})
    assert [(m.names, m.revision, m.cache_dir, m.offline) for m in models] == [
        (("a", "b"), None, "/home/hub", False),
        (("c",), "v2", str(tmp_path / "dl"), False),
        (("d",), None, str(tmp_path / "cell"), True),
    ]


def test_the_size_said_is_what_vllm_reads_and_is_not_cached(hub):
    """vLLM reads the first weight format the repo has (safetensors before bin) and never
    original/: the size said counts those files and the tokenizer, not the ones cached, and the
    download asks for exactly those patterns, after every size was said."""
    said: list[str] = []
    fetch_weights([_cell(), _cell(name="again")], report=said.append, environ={})
    assert said[0] == (
        "weights: Qwen/Qwen3-0.6B (qwen, again): 1.51 GB to download (2 of 3 files not in the cache)"
    )
    assert said[1] == "weights: downloading 1.51 GB before any server starts"
    (download,) = hub.downloads
    assert download["allow_patterns"][0] == "*.safetensors"
    assert "*.bin" not in download["allow_patterns"]
    assert download["ignore_patterns"] == ["original/*"]
    assert said[-1] == "weights: Qwen/Qwen3-0.6B (qwen, again) fetched"


def test_a_cached_model_downloads_nothing(monkeypatch):
    """All files cached: the sweep says so and asks the Hub for nothing but the metadata."""
    fake = FakeHub(cached=FILES)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake.snapshot_download)
    said: list[str] = []
    fetch_weights([_cell()], report=said.append, environ={})
    assert said == [
        "weights: Qwen/Qwen3-0.6B (qwen): all 3 files in the cache, nothing to download"
    ]
    assert fake.downloads == []


def test_a_model_the_hub_does_not_have_is_a_config_error_naming_it(monkeypatch):
    """A repository the Hub does not have (or hides without a token): exit 3, naming the model
    and what to do, before anything downloads (the good model listed first is not fetched)."""
    fake = FakeHub(missing_repos={"nobody/nothing"})
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake.snapshot_download)
    cells = [_cell(), _cell("nobody/nothing", name="ghost")]
    with pytest.raises(
        ConfigError, match=r"nobody/nothing \(ghost\).*no repository.*hf auth login"
    ):
        fetch_weights(cells, environ={})
    assert fake.downloads == []


def _cache_with(root, repo_id, names):
    """A huggingface_hub cache holding `names` of `repo_id` at one commit, as hf lays it out."""
    folder = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = folder / "snapshots" / ("b" * 40)
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("b" * 40)
    for name in names:
        (snapshot / name).write_text("{}")
    return root


def test_offline_a_cached_model_needs_nothing_and_a_missing_one_is_refused(tmp_path, hub):
    """HF_HUB_OFFLINE in the servers' environment: the Hub is never asked; a model whose config
    and weights are in the cache passes (sizes not checked), one that is not is exit 3 naming it."""
    cache = _cache_with(tmp_path / "hub", QWEN, ["config.json", "model.safetensors"])
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    said: list[str] = []
    fetch_weights([_cell()], report=said.append, environ=env)
    assert said == [
        "weights: Qwen/Qwen3-0.6B (qwen): in the cache, nothing to download "
        "(HF_HUB_OFFLINE is set: sizes not checked)"
    ]
    with pytest.raises(ConfigError, match=r"other/model \(other\): not in the Hugging Face cache"):
        fetch_weights([_cell("other/model", name="other")], environ=env)
    assert hub.dry_runs == [] and hub.downloads == []


def test_dry_run_lines_say_the_size_or_the_offline_refusal(tmp_path, hub, monkeypatch):
    """What --dry-run prints: the size to download per model; offline, a model missing from the
    cache is said (a run here would exit 3) but is no problem of the sweep, so the dry run of a
    GPU sweep passes on a machine without its weights; nothing is downloaded either way."""
    lines, problems = describe_weights([_cell()])
    assert lines == ["Qwen/Qwen3-0.6B (qwen): 1.51 GB to download (2 of 3 files not in the cache)"]
    assert problems == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    lines, problems = describe_weights([_cell()])
    assert lines[0].startswith("a run here would stop (exit 3): model Qwen/Qwen3-0.6B (qwen)")
    assert problems == []
    assert hub.downloads == []


def test_an_offline_sweep_of_an_uncached_model_exits_3_before_anything_starts(
    tmp_path, monkeypatch, hub
):
    """`pdcheck sweep` with HF_HUB_OFFLINE and a model not in the cache: exit 3 naming the model,
    no run folder, no server started (the fetch comes before the backend and the run folder)."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        "name: offline\nmodels: [{name: qwen, path: Qwen/Qwen3-0.6B}]\n"
        "serving: {platform: gpu}\neval: {task: gsm8k-synth, limit: 5}\n"
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))

    def no_backend(*args, **kwargs):
        raise AssertionError("a server backend was made before the weights were checked")

    monkeypatch.setattr("pdcheck.sweep.run.make_backend", no_backend)
    out = tmp_path / "run"
    assert main(["sweep", str(sweep), "--out", str(out)]) == ExitCode.CONFIG
    assert not out.exists()
