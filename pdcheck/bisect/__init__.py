"""Bisect: find the vLLM commit that brought a PD race or accuracy regression back."""

from pdcheck.bisect.config import BisectConfig
from pdcheck.bisect.runner import BisectPlan, BisectResult, plan_bisect, run_bisect

__all__ = ["BisectConfig", "BisectPlan", "BisectResult", "plan_bisect", "run_bisect"]
