"""Small pieces shared by command modules: the rich consoles (stdout for results, stderr for progress)."""

from __future__ import annotations

from rich.console import Console

console = Console()
err_console = Console(stderr=True)
