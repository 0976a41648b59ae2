"""Choosing the Ray backend and its settings, and refusing it cleanly: no cluster needed."""

from __future__ import annotations

import sys

import pytest

from pdcheck.cli import main
from pdcheck.config.schema import RaySettings
from pdcheck.errors import ConfigError
from pdcheck.sweep.backends import BackendChoice, ray_settings


def test_the_file_section_or_the_option_selects_ray_and_options_override_the_file():
    """No `ray` section and no option: local. `--backend ray` alone: the defaults. The file's
    section selects Ray; `--ray-*` options override its values; `--backend local` wins."""
    file = RaySettings(address="10.0.0.1:6379", placement="same-node")
    assert ray_settings(None, BackendChoice()) is None
    assert ray_settings(None, BackendChoice("ray")) == RaySettings()
    assert ray_settings(file, BackendChoice()) == file
    assert ray_settings(file, BackendChoice(ray_placement="cross-node")) == RaySettings(
        address="10.0.0.1:6379", placement="cross-node"
    )
    assert ray_settings(None, BackendChoice(ray_address="auto")) == RaySettings(address="auto")
    assert ray_settings(file, BackendChoice("local")) is None
    with pytest.raises(ConfigError, match="--backend ray"):
        ray_settings(None, BackendChoice("local", ray_address="auto"))


def test_backend_ray_without_ray_installed_says_what_to_install_and_exits_3(
    monkeypatch, tmp_path, capsys
):
    """Without Ray, `--backend ray` exits 3 naming the extra to install, and writes nothing."""
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    out = tmp_path / "run"
    assert main(["sweep", "cpu-smoke", "--backend", "ray", "--out", str(out)]) == 3
    assert "pip install 'pdcheck[ray]'" in capsys.readouterr().err
    assert not out.exists()
