"""pdcheck: accuracy and race regression suite for vLLM prefill/decode disaggregated serving."""

import json
from importlib import metadata


def _installed_version() -> str:
    """The installed distribution's version (from the git tag at build time), plus the commit when
    pip installed it from a git URL: a tagged release says nothing about a branch tip otherwise."""
    try:
        dist = metadata.distribution("pdcheck")
    except metadata.PackageNotFoundError:
        return "0+unknown"
    version = dist.version
    try:
        direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return version
    commit = (direct_url.get("vcs_info") or {}).get("commit_id")
    return f"{version} (git {commit[:12]})" if commit else version


__version__ = _installed_version()

__all__ = ["__version__"]
