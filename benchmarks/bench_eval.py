"""Speed bar of issue 4: pdcheck's eval runner against lm-eval and against a bare aiohttp loop.

All three ask the same GSM8K questions (5-shot prompts) of one instant fake OpenAI server on
127.0.0.1, which runs in its own process so that it does not share the client's GIL:

- floor: a minimal aiohttp loop, a semaphore of N, the same prompts built per request, nothing
  recorded or scored; the bar's floor is the plain one (asyncio, the json module), and two more
  show what pdcheck's event loop (uvloop) and JSON codec (msgspec) give on their own, so that
  pdcheck's own per-question cost is read against a floor on the same stack;
- pdcheck: `run_eval` (prompts, scoring, records appended to a JSONL file, summary);
- lm-eval: `local-completions` with the same num_concurrent, through pdcheck's lm-eval engine.

Bars: pdcheck at least 3x lm-eval's questions/s, and its wall time within 25% of the floor's.
It also measures the peak memory of a 10k-question run in a fresh process.

    .venv/bin/python benchmarks/bench_eval.py [--questions 1319] [--concurrency 64] [--repeats 3]

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import msgspec
import uvloop

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdcheck.config import EvalSettings  # noqa: E402
from pdcheck.evals import load_task, run_eval  # noqa: E402
from pdcheck.evals.dataset import TaskData  # noqa: E402
from pdcheck.evals.prompts import PromptBuilder, PromptOptions  # noqa: E402

DEFAULT_GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
_SERVER_CODE = (
    "import sys\n"
    "from tests.fakes.openai_server import FakeOpenAIServer\n"
    "server = FakeOpenAIServer().start()\n"
    "print(server.port, flush=True)\n"
    "sys.stdin.read()\n"
)
_JSON = {"Content-Type": "application/json"}


def start_fake_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER_CODE],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None  # stdout=PIPE
    port = proc.stdout.readline().strip()
    return proc, f"http://127.0.0.1:{port}"


async def floor_loop(
    url: str, builder: PromptBuilder, indices: range, concurrency: int, *, msgspec_json: bool
) -> float:
    """The least a client can do: build each body, N in flight, post, read JSON, keep the text."""
    semaphore = asyncio.Semaphore(concurrency)
    texts: dict[int, str] = {}
    encode, decode = msgspec.json.encode, msgspec.json.decode

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int) -> None:
            async with semaphore:
                body = builder.body(builder.prompt(i), model="fake")
                async with session.post(f"{url}/v1/completions", json=body) as resp:
                    texts[i] = (await resp.json())["choices"][0]["text"]

        async def one_msgspec(i: int) -> None:
            async with semaphore:
                body = encode(builder.body(builder.prompt(i), model="fake"))
                async with session.post(f"{url}/v1/completions", data=body, headers=_JSON) as resp:
                    texts[i] = decode(await resp.read())["choices"][0]["text"]

        ask = one_msgspec if msgspec_json else one
        start = time.perf_counter()
        await asyncio.gather(*(ask(i) for i in indices))
        return time.perf_counter() - start


def time_floor(
    url: str,
    task: TaskData,
    settings: EvalSettings,
    concurrency: int,
    *,
    run=asyncio.run,
    msgspec_json: bool = False,
) -> float:
    builder = PromptBuilder(task, PromptOptions.from_settings(settings))
    indices = task.indices(limit=settings.limit, offset=settings.offset)
    return run(floor_loop(url, builder, indices, concurrency, msgspec_json=msgspec_json))


def time_floor_uvloop(url: str, task: TaskData, settings: EvalSettings, concurrency: int) -> float:
    """The floor on the event loop pdcheck's runner uses, so the loop's own speed-up is shown apart."""
    return time_floor(url, task, settings, concurrency, run=uvloop.run)


def time_floor_same_stack(
    url: str, task: TaskData, settings: EvalSettings, concurrency: int
) -> float:
    """The floor on pdcheck's loop and JSON codec: what is left over it is pdcheck's own bookkeeping."""
    return time_floor(url, task, settings, concurrency, run=uvloop.run, msgspec_json=True)


def time_pdcheck(url: str, task: TaskData, settings: EvalSettings, concurrency: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        run_eval(
            url,
            task,
            settings=settings,
            concurrency=concurrency,
            out_path=Path(tmp) / "r.jsonl",
            model="fake",
        )
        return time.perf_counter() - start


def time_lmeval(url: str, task: TaskData, settings: EvalSettings, concurrency: int) -> float:
    import lm_eval  # noqa: F401  imported before timing: the bar is about running, not importing

    lm_settings = settings.model_copy(update={"engine": "lm-eval", "style": "lm-eval"})
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        run_eval(
            url,
            task,
            settings=lm_settings,
            concurrency=concurrency,
            out_path=Path(tmp) / "r.jsonl",
            model="fake",
        )
        return time.perf_counter() - start


def _peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM), which `_reset_peak_rss` restarts from the current RSS."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak_rss() -> None:
    # ru_maxrss survives fork+exec (it would report the parent's peak); clear_refs "5" resets VmHWM.
    Path("/proc/self/clear_refs").write_text("5")


def memory_child(url: str, dataset: str, questions: int, concurrency: int) -> dict:
    """Run in a fresh process: peak RSS of a `questions`-question run (GSM8K test repeated)."""
    _reset_peak_rss()
    task = load_task(EvalSettings(dataset=dataset))
    reps = -(-questions // len(task.test))
    big = replace(task, test=(task.test * reps)[:questions])
    before = _peak_rss_mib()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        run_eval(
            url,
            big,
            settings=EvalSettings(),
            concurrency=concurrency,
            out_path=Path(tmp) / "r.jsonl",
            model="fake",
        )
        wall = time.perf_counter() - start
    after = _peak_rss_mib()
    return {
        "questions": questions,
        "peak_rss_mib": round(after, 1),
        "rss_growth_mib": round(after - before, 1),
        "wall_s": round(wall, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--questions", type=int, default=1319)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-questions", type=int, default=10_000)
    parser.add_argument(
        "--dataset", default=os.environ.get("PDCHECK_GSM8K_DIR", str(DEFAULT_GSM8K))
    )
    parser.add_argument("--skip-lmeval", action="store_true")
    parser.add_argument("--memory-child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        print(
            json.dumps(
                memory_child(
                    args.memory_child, args.dataset, args.memory_questions, args.concurrency
                )
            )
        )
        return 0

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    task = load_task(EvalSettings(dataset=args.dataset))
    settings = EvalSettings(dataset=args.dataset, limit=args.questions)
    server, url = start_fake_server()
    try:
        runners = {
            "floor": time_floor,
            "pdcheck": time_pdcheck,
            "floor_uvloop": time_floor_uvloop,
            "floor_same_stack": time_floor_same_stack,
        }
        walls: dict[str, list[float]] = {name: [] for name in runners}
        cpus: dict[str, list[float]] = {name: [] for name in runners}
        for fn in runners.values():  # warm the server's and each client's code paths
            fn(url, task, settings, args.concurrency)
        for _ in range(args.repeats):  # interleaved, so machine noise hits all alike
            for name, fn in runners.items():
                cpu_start = time.process_time()
                walls[name].append(fn(url, task, settings, args.concurrency))
                cpus[name].append(time.process_time() - cpu_start)
        mem_out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--memory-child",
                url,
                "--dataset",
                args.dataset,
                "--memory-questions",
                str(args.memory_questions),
                "--concurrency",
                str(args.concurrency),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        memory = json.loads(mem_out.stdout.strip().splitlines()[-1])
        lmeval = None if args.skip_lmeval else time_lmeval(url, task, settings, args.concurrency)
    finally:
        assert server.stdin is not None  # stdin=PIPE
        server.stdin.close()
        server.terminate()
        server.wait(10)

    n = args.questions
    wall = {name: statistics.median(values) for name, values in walls.items()}
    cpu = {name: statistics.median(values) for name, values in cpus.items()}
    pdcheck_s = wall["pdcheck"]
    result = {
        "bench": "eval",
        "questions": n,
        "concurrency": args.concurrency,
        "floor_s": round(wall["floor"], 4),
        "pdcheck_s": round(pdcheck_s, 4),
        "lmeval_s": None if lmeval is None else round(lmeval, 3),
        "pdcheck_qps": round(n / pdcheck_s, 1),
        "lmeval_qps": None if lmeval is None else round(n / lmeval, 1),
        "pdcheck_over_floor": round(pdcheck_s / wall["floor"], 3),
        "floor_uvloop_s": round(wall["floor_uvloop"], 4),
        "pdcheck_over_floor_uvloop": round(pdcheck_s / wall["floor_uvloop"], 3),
        "floor_same_stack_s": round(wall["floor_same_stack"], 4),
        "pdcheck_over_floor_same_stack": round(pdcheck_s / wall["floor_same_stack"], 3),
        # The client's own CPU: less exposed than wall time to other load on a shared machine.
        "cpu_s": {name: round(value, 4) for name, value in cpu.items()},
        "pdcheck_cpu_over_same_stack_us": round(
            (cpu["pdcheck"] - cpu["floor_same_stack"]) / n * 1e6, 1
        ),
        "pdcheck_speedup_vs_lmeval": None if lmeval is None else round(lmeval / pdcheck_s, 1),
        "memory": memory,
        # The machine is shared: the 1-minute load average when the runs ended, to read the ratio by.
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    result["bar_floor_ok"] = result["pdcheck_over_floor"] <= 1.25
    result["bar_lmeval_ok"] = None if lmeval is None else result["pdcheck_speedup_vs_lmeval"] >= 3
    print(
        f"{n} questions at concurrency {args.concurrency} (median of {args.repeats}; client CPU in brackets):"
    )
    rows = (
        ("floor: bare aiohttp loop", "floor", "the bar: pdcheck <= 1.25x it"),
        ("floor on uvloop", "floor_uvloop", "pdcheck's loop"),
        ("floor on uvloop + msgspec", "floor_same_stack", "pdcheck's loop and JSON codec"),
        ("pdcheck runner", "pdcheck", ""),
    )
    for label, name, why in rows:
        ratio = "" if name == "pdcheck" else f"pdcheck = {pdcheck_s / wall[name]:.2f}x it ({why})"
        print(
            f"  {label:27s} {wall[name]:7.3f} s [{cpu[name]:.3f} s] {n / wall[name]:7.0f} q/s  {ratio}"
        )
    print(
        f"  pdcheck's client CPU over the same-stack floor: {result['pdcheck_cpu_over_same_stack_us']} us a question "
        f"(scoring, records, request ids); load average {result['loadavg_1m']}"
    )
    if lmeval is not None:
        print(
            f"  lm-eval local-completions   {lmeval:7.3f} s  {n / lmeval:7.1f} q/s  pdcheck is {result['pdcheck_speedup_vs_lmeval']}x faster (bar >= 3)"
        )
    print(
        f"  memory, {memory['questions']} questions: peak RSS {memory['peak_rss_mib']:.0f} MiB "
        f"(+{memory['rss_growth_mib']:.0f} MiB during the run), {memory['wall_s']:.2f} s"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
