"""The cached venv of a pip-requirement environment: pdcheck linked in, and the torch step shared
with scripts/setup-venv.sh (one list of CUDA-built packages)."""

from __future__ import annotations

from pathlib import Path

from pdcheck.serving import venvs

REPO = Path(__file__).resolve().parents[3]


def test_pdcheck_and_its_vllm_plugin_are_linked_into_the_venv(tmp_path):
    """Only pdcheck goes on the venv's path (a .pth naming a folder with a link to the package),
    with the plugin's entry point, so the venv's servers load pdcheck's plugin."""
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    link_dir = venvs.link_pdcheck(tmp_path / "venv" / "bin" / "python")
    assert (site / "pdcheck-link.pth").read_text().strip() == str(link_dir)
    assert sorted(p.name for p in link_dir.iterdir()) == [
        "pdcheck",
        "pdcheck-0+environment.dist-info",
    ]
    assert (link_dir / "pdcheck").resolve() == Path(venvs.__file__).resolve().parents[1]
    entry_points = (link_dir / "pdcheck-0+environment.dist-info" / "entry_points.txt").read_text()
    assert "[vllm.general_plugins]" in entry_points
    assert "pdcheck = pdcheck.vllm_plugin:register" in entry_points
    # Relinking (every sweep does) is idempotent.
    assert venvs.link_pdcheck(tmp_path / "venv" / "bin" / "python") == link_dir


def test_setup_script_removes_the_cuda_packages_through_the_one_list(monkeypatch):
    script = (REPO / "scripts" / "setup-venv.sh").read_text()
    assert "-m pdcheck.serving.venvs remove-cuda-packages" in script
    assert 'pip" uninstall' not in script and "pip uninstall" not in script
    removed: list[tuple[str, ...]] = []
    monkeypatch.setattr(venvs, "_pip", lambda python, *args: removed.append((python, *args)))
    assert venvs.main(["remove-cuda-packages", "/v/bin/python"]) == 0
    assert removed == [("/v/bin/python", "uninstall", "-y", *venvs.CUDA_BUILT_PACKAGES)]
    assert venvs.main(["nonsense"]) == 3
