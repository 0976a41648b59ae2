"""The attach options of `pytest --pdcheck-sweep`: servers the user runs, instead of pdcheck's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdcheck.serving.endpoints import Endpoints


def attached_endpoints(config: Any) -> Endpoints | None:
    """The attach options, checked by the same rules as `pdcheck sweep`'s (None: not attached)."""
    from pdcheck.serving.endpoints import AttachNames, attach_options

    return attach_options(
        baseline_url=config.getoption("pdcheck_baseline_url"),
        pd_url=config.getoption("pdcheck_pd_url"),
        decoder_metrics_urls=tuple(config.getoption("pdcheck_decoder_metrics_url") or ()),
        names=AttachNames(
            "--pdcheck-baseline-url", "--pdcheck-pd-url", "--pdcheck-decoder-metrics-url"
        ),
    )
