"""Evaluation: GSM8K data, exact prompt styles, answer extraction, the async runner and its records."""

from pdcheck.evals.dataset import TaskData, load_task
from pdcheck.evals.records import QuestionRecord, TokenLogprobs, read_records
from pdcheck.evals.runner import EvalJob, arun_eval, run_eval
from pdcheck.evals.summary import EvalSummary

__all__ = [
    "EvalJob",
    "EvalSummary",
    "QuestionRecord",
    "TaskData",
    "TokenLogprobs",
    "arun_eval",
    "load_task",
    "read_records",
    "run_eval",
]
