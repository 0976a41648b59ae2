"""A fake Hugging Face Hub for huggingface_hub.snapshot_download: answers its dry run from a file
list, records real downloads and cache lookups (`local_files_only`), and can be a repository it
does not have or an unreachable Hub.
No network; install with monkeypatch on `huggingface_hub.snapshot_download`."""

from __future__ import annotations

import httpx2
from huggingface_hub import DryRunFileInfo
from huggingface_hub.errors import DryRunError, LocalEntryNotFoundError, RepositoryNotFoundError

# A repository with both weight formats and an original/ folder, as many hub repos have.
FILES = {
    "config.json": 700,
    "tokenizer.json": 7_000_000,
    "model.safetensors": 1_500_000_000,
    "pytorch_model.bin": 1_500_000_000,
    "original/consolidated.00.pth": 1_500_000_000,
    "README.md": 4_000,
}


class FakeHub:
    """Answers snapshot_download's dry run from `files` ({name: size}, `cached` ones cached),
    fails it for `missing_repos` (as the Hub answers 404) or everything (not `reachable`), and
    records each real download's arguments."""

    def __init__(self, files=FILES, cached=("config.json",), missing_repos=(), reachable=True):
        self.files, self.cached, self.missing_repos = files, set(cached), set(missing_repos)
        self.reachable = reachable
        self.downloads: list[dict] = []
        self.dry_runs: list[dict] = []
        self.lookups: list[dict] = []

    def snapshot_download(self, repo_id, **kwargs):
        if kwargs.get("dry_run"):
            self.dry_runs.append({"repo_id": repo_id, **kwargs})
            if not self.reachable:
                raise DryRunError("cannot access") from ConnectionError("no network in tests")
            if repo_id in self.missing_repos:
                response = httpx2.Response(
                    404,
                    request=httpx2.Request("GET", f"https://huggingface.co/api/models/{repo_id}"),
                )
                raise DryRunError("cannot access") from RepositoryNotFoundError(
                    "not found", response=response
                )
            ignored = kwargs.get("ignore_patterns") or []
            return [
                DryRunFileInfo(
                    commit_hash="a" * 40,
                    file_size=size,
                    filename=name,
                    local_path=f"/cache/{name}",
                    is_cached=name in self.cached,
                    will_download=name not in self.cached,
                )
                for name, size in self.files.items()
                if not any(name.startswith(p.rstrip("*")) for p in ignored)
            ]
        if kwargs.get("local_files_only"):
            # A cache lookup (the plan's tokenizer in a dry run): nothing is downloaded.
            self.lookups.append({"repo_id": repo_id, **kwargs})
            if not self.cached:
                raise LocalEntryNotFoundError(f"{repo_id} is not in the cache")
            return "/cache/snapshot"
        self.downloads.append({"repo_id": repo_id, **kwargs})
        return "/cache/snapshot"
