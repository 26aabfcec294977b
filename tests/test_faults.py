"""Fault injection: the saver behind a loopback proxy that fails, resets and holds requests.

Every scenario runs a real LangGraph graph (tests/fault_graph.py: a plan/act loop with
an interrupt every second turn, resumed with ``Command(resume=...)``) on a few threads
through :class:`faults.FaultProxy`, in both index modes, on ``invoke`` and ``ainvoke``.
An invoke that raises stops its thread there (the thread may be one step behind); what
it raised is counted by type. Then, with a fresh saver talking to the store directly:

* lost: an invoke returned, but no stored checkpoint of its thread holds its state. Must be 0.
* dangling: a ``list()`` item that does not read back by id with ``get_tuple``, or a
  thread whose ``list``/``get_state_history`` raises. Must be 0.
* partial: a stored checkpoint whose values InMemorySaver never had running the same
  steps (the failed one included), or a thread that completed but whose state differs
  from InMemorySaver's. Must be 0.

Exceptions that are not ``S3SaverError`` (raw botocore errors) are counted and shown,
not failed on: the retry policy that maps them is being added to the library.
``pytest -m faults -s`` runs the longer variants (more threads and turns, 5 seeds).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from botocore.config import Config
from langgraph.checkpoint.memory import InMemorySaver

from conftest import make_saver, seaweedfs_saver
from fault_graph import INTERRUPT, build, plain, resume_input, run_steps, step_input
from faults import BODY_KINDS, DDB_KINDS, NET_KINDS, S3_KINDS, FaultProxy, Req, object_puts_and_commits
from s3_saver import S3Saver, S3SaverError

HERE = Path(__file__).parent
TIMEOUTS = Config(read_timeout=1, connect_timeout=1)
SHORT = {"threads": 1, "turns": 2}  # the default run: botocore's backoff (up to 1-2 s a retry) sets its length
LONG = {"threads": 4, "turns": 6}
SEEDS_LONG = [11, 23, 37, 41, 59]
ROWS: list[dict[str, Any]] = []


# -- fixtures ------------------------------------------------------------------------------
@pytest.fixture
def moto_proxy(endpoint: str):
    """A FaultProxy in front of the (reset) moto server, faults off until configured."""
    with FaultProxy(endpoint) as proxy:
        yield proxy


@pytest.fixture
def seaweedfs_proxy(seaweedfs_bucket):
    """(proxy, bucket): a FaultProxy in front of SeaweedFS and a fresh bucket there."""
    endpoint, bucket = seaweedfs_bucket
    with FaultProxy(endpoint) as proxy:
        yield proxy, bucket


@pytest.fixture(scope="module", autouse=True)
def _table():
    yield
    if ROWS:
        print_table(ROWS)


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = ["mode", "driver", "kind", "rate", "requests", "faults", "ok", "failed", "raw", "exceptions", "lost",
            "dangling", "partial"]
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    out = ["", " | ".join(c.ljust(w) for c, w in zip(cols, widths)), "-+-".join("-" * w for w in widths)]
    out += [" | ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    print("\n".join(out))


# -- the reference: InMemorySaver, same steps ----------------------------------------------
@dataclass
class Reference:
    results: list[dict]  # plain result of step i
    allowed: list[list[dict]]  # values of every checkpoint after step i (i included)
    final: tuple[dict, tuple]  # (values, next) after the last step


@cache
def reference(turns: int, interrupts: bool = True) -> Reference:
    graph = build(InMemorySaver(), interrupts=interrupts)
    cfg = {"configurable": {"thread_id": "ref"}}
    results: list[dict] = []
    allowed: list[list[dict]] = []

    def record(step: int, result: Any) -> None:
        results.append(plain(result))
        allowed.append([s.values for s in graph.get_state_history(cfg)])

    run_steps(graph, "ref", turns, record)
    state = graph.get_state(cfg)
    return Reference(results, allowed, (state.values, tuple(state.next)))


# -- running a scenario ----------------------------------------------------------------------
@dataclass
class ThreadRun:
    thread_id: str
    returned: list[tuple[int, dict]] = field(default_factory=list)
    failed: BaseException | None = None


def _steps(turns: int):
    """(step, kind, turn) in order; the resume of a turn is taken only if its input interrupted."""
    for turn in range(turns):
        yield "input", turn
        yield "resume", turn


def _inputs(run: ThreadRun, turns: int):
    """What to send next, the same for both drivers; read lazily, after each result is recorded."""
    for kind, turn in _steps(turns):
        if kind == "resume" and not (run.returned and run.returned[-1][1].get(INTERRUPT)):
            continue
        yield step_input(turn) if kind == "input" else resume_input(turn)


def run_sync(graph: Any, runs: list[ThreadRun], turns: int, workers: int) -> None:
    def one(run: ThreadRun) -> None:
        cfg = {"configurable": {"thread_id": run.thread_id}}
        try:
            for step, arg in enumerate(_inputs(run, turns)):
                run.returned.append((step, plain(graph.invoke(arg, cfg))))
        except Exception as exc:  # noqa: BLE001 - counted by type
            run.failed = exc

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, runs))


def run_async(saver: S3Saver, graph: Any, runs: list[ThreadRun], turns: int) -> None:
    async def one(run: ThreadRun) -> None:
        cfg = {"configurable": {"thread_id": run.thread_id}}
        try:
            for step, arg in enumerate(_inputs(run, turns)):
                run.returned.append((step, plain(await graph.ainvoke(arg, cfg))))
        except Exception as exc:  # noqa: BLE001
            run.failed = exc

    async def main() -> None:
        try:
            await asyncio.gather(*(one(r) for r in runs))
        finally:
            await saver.aclose()

    asyncio.run(main())


@dataclass
class Checked:
    lost: int = 0
    dangling: int = 0
    partial: int = 0
    notes: list[str] = field(default_factory=list)


def check(fresh: S3Saver, runs: list[ThreadRun], ref: Reference | None, *, interrupts: bool = True) -> Checked:
    """Read every thread back with a fresh saver (no faults) and count what is wrong."""
    out = Checked()
    graph = build(fresh, interrupts=interrupts)
    for thread_id in sorted({r.thread_id for r in runs}):
        cfg = {"configurable": {"thread_id": thread_id}}
        try:
            items = list(fresh.list(cfg))
            for item in items:
                back = fresh.get_tuple(item.config)
                if back is None or back.checkpoint["id"] != item.checkpoint["id"]:
                    out.dangling += 1
                    out.notes.append(f"{thread_id}: {item.checkpoint['id']} listed, not read back")
                # A checkpoint whose parent cannot be read lost its parent (issue 21, item 6:
                # a commit answered 200 and gone afterwards is seen only this way).
                if item.parent_config is not None and fresh.get_tuple(item.parent_config) is None:
                    out.lost += 1
                    out.notes.append(f"{thread_id}: {item.checkpoint['id']}'s parent is not readable")
            history = [s.values for s in graph.get_state_history(cfg)]
            state = graph.get_state(cfg)
        except Exception as exc:  # noqa: BLE001
            out.dangling += 1
            out.notes.append(f"{thread_id}: read failed: {type(exc).__name__}: {exc}")
            continue
        if len(history) != len(items):
            out.dangling += 1
            out.notes.append(f"{thread_id}: list {len(items)} vs history {len(history)}")
        for run in (r for r in runs if r.thread_id == thread_id):
            for step, result in run.returned:
                values = {k: v for k, v in result.items() if k != INTERRUPT}
                if values not in history:
                    out.lost += 1
                    out.notes.append(f"{thread_id}: step {step} returned but no checkpoint holds it")
                if ref is not None and result != ref.results[step]:
                    out.partial += 1
                    out.notes.append(f"{thread_id}: step {step} returned {result}, reference {ref.results[step]}")
            if ref is None:
                continue
            if run.failed is None:
                if (state.values, tuple(state.next)) != ref.final:
                    out.partial += 1
                    out.notes.append(f"{thread_id}: final {state.values}/{state.next} != {ref.final}")
                allowed = ref.allowed[-1]
            else:
                allowed = ref.allowed[min(len(run.returned), len(ref.allowed) - 1)] + [{}]
            for values in history:
                if values not in allowed:
                    out.partial += 1
                    out.notes.append(f"{thread_id}: stored state {values} never existed in the reference")
    return out


def exceptions(runs: list[ThreadRun]) -> tuple[Counter, int]:
    seen: Counter[str] = Counter()
    raw = 0
    for r in runs:
        if r.failed is not None:
            seen[type(r.failed).__name__] += 1
            raw += not isinstance(r.failed, S3SaverError)
    return seen, raw


def scenario(
    proxy: FaultProxy,
    through: Any,  # () -> saver through the proxy
    direct: Any,  # () -> saver straight to the store
    *,
    mode: str,
    driver: str,
    kind: str,
    rate: float,
    seed: int,
    threads: int,
    turns: int,
    one_thread: bool = False,
    label: str | None = None,
) -> dict[str, Any]:
    interrupts = not one_thread
    ref = None if one_thread else reference(turns, interrupts)
    tag = f"{mode}-{driver}-{label or kind}-{rate}-{seed}"
    runs = [ThreadRun("shared-" + tag if one_thread else f"{tag}-t{i}") for i in range(threads)]
    saver = through()
    graph = build(saver, interrupts=interrupts)
    proxy.reset_counts()
    proxy.configure(seed=seed, enabled=True)
    try:
        if driver == "sync":
            run_sync(graph, runs, turns, workers=threads)
        else:
            run_async(saver, graph, runs, turns)
    finally:
        proxy.configure(enabled=False)
        saver.close()
    requests, faults = proxy.requests, proxy.total_faults
    fresh = direct()
    try:
        checked = check(fresh, runs, ref, interrupts=interrupts)
    finally:
        fresh.close()
    seen, raw = exceptions(runs)
    ok = sum(len(r.returned) for r in runs)
    row = {
        "mode": mode, "driver": driver, "kind": label or kind, "rate": f"{rate:.0%}", "requests": requests,
        "faults": faults, "ok": ok, "failed": sum(r.failed is not None for r in runs), "raw": raw,
        "exceptions": ",".join(f"{k}:{v}" for k, v in sorted(seen.items())) or "-",
        "lost": checked.lost, "dangling": checked.dangling, "partial": checked.partial,
        "notes": checked.notes,
    }
    ROWS.append(row)
    return row


def assert_clean(row: dict[str, Any]) -> None:
    assert (row["lost"], row["dangling"], row["partial"]) == (0, 0, 0), "\n".join(row["notes"][:20])


def moto_savers(endpoint: str, proxy: FaultProxy, mode: str):
    setup = make_saver(endpoint, mode)
    setup.setup()
    setup.close()
    return (lambda: make_saver(proxy.url, mode, client_config=TIMEOUTS)), (lambda: make_saver(endpoint, mode))


# -- scenarios: each fault kind at 5 % and 20 % ---------------------------------------------
MODE_KINDS = [
    (mode, kind)
    for mode in ("dynamodb", "manifest")
    for kind in (*S3_KINDS, *(DDB_KINDS if mode == "dynamodb" else ()), *NET_KINDS, *BODY_KINDS)
]
KIND_CASES = [pytest.param(m, d, k, id=f"{m}-{d}-{k}") for m, k in MODE_KINDS for d in ("sync", "async")]
# The default run (kept near 90 s: botocore's retry backoff, not the saver, sets the pace)
# takes four cases; -m faults runs every (mode, driver, kind), 5 seeds, more threads/turns.
KIND_CASES_DEFAULT = [
    pytest.param(m, d, k, id=f"{m}-{d}-{k}")
    for m, d, k in [("dynamodb", "sync", "ddb_throttle"), ("dynamodb", "async", "s3_503"),
                    ("manifest", "sync", "reset_after"), ("manifest", "async", "reset_before")]
]


def _kinds(endpoint, proxy, mode, driver, kind, seeds, size):
    through, direct = moto_savers(endpoint, proxy, mode)
    proxy.configure(kinds=[kind])
    rows = []
    for seed in seeds:
        for rate in (0.05, 0.20):
            proxy.configure(rate=rate)
            rows.append(scenario(proxy, through, direct, mode=mode, driver=driver, kind=kind, rate=rate, seed=seed,
                                 **size))
    for row in rows:
        assert_clean(row)


@pytest.mark.parametrize(("mode", "driver", "kind"), KIND_CASES_DEFAULT)
def test_fault_kind(endpoint, moto_proxy, mode, driver, kind):
    size = {"threads": 1, "turns": 1} if kind == "hold" else SHORT
    _kinds(endpoint, moto_proxy, mode, driver, kind, [7], size)


@pytest.mark.faults
@pytest.mark.parametrize(("mode", "driver", "kind"), KIND_CASES)
def test_fault_kind_long(endpoint, moto_proxy, mode, driver, kind):
    _kinds(endpoint, moto_proxy, mode, driver, kind, SEEDS_LONG, LONG)


# -- reset after every write: applied, answered by a reset ---------------------------------
def _reset_after_writes(proxy, through, direct, mode, driver, seed, size, label="reset_after_writes"):
    # Every first attempt of every object PUT and index write (PutItem, manifest CAS) is
    # applied by the store and then answered with a reset; the SDK's retry gets through.
    proxy.configure(kinds=["reset_after"], rate=1.0, operations=object_puts_and_commits, max_faults=400)
    proxy.first_attempt_only = True
    return scenario(proxy, through, direct, mode=mode, driver=driver, kind="reset_after", rate=1.0, seed=seed,
                    label=label, **size)


@pytest.mark.parametrize(("mode", "driver"), [("dynamodb", "sync"), ("manifest", "async")])
def test_reset_after_every_write(endpoint, moto_proxy, mode, driver):
    through, direct = moto_savers(endpoint, moto_proxy, mode)
    assert_clean(_reset_after_writes(moto_proxy, through, direct, mode, driver, 3, SHORT))


@pytest.mark.parametrize("driver", ["sync"])
def test_reset_after_every_write_seaweedfs(seaweedfs_proxy, driver):
    _seaweedfs(seaweedfs_proxy, driver, SHORT)


def _seaweedfs(seaweedfs_proxy, driver, size):
    proxy, bucket = seaweedfs_proxy
    upstream = f"http://127.0.0.1:{proxy.upstream_port}"
    setup = seaweedfs_saver(upstream, bucket)
    setup.setup()
    setup.close()
    row = _reset_after_writes(
        proxy,
        lambda: seaweedfs_saver(proxy.url, bucket, client_config=TIMEOUTS),
        lambda: seaweedfs_saver(upstream, bucket),
        "manifest/seaweedfs", driver, 3, size,
    )
    assert_clean(row)


@pytest.mark.faults
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_reset_after_every_write_seaweedfs_long(seaweedfs_proxy, driver):
    _seaweedfs(seaweedfs_proxy, driver, LONG)


@pytest.mark.faults
@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("mode", ["dynamodb", "manifest"])
@pytest.mark.parametrize("seed", SEEDS_LONG)
def test_reset_after_every_write_long(endpoint, moto_proxy, mode, driver, seed):
    through, direct = moto_savers(endpoint, moto_proxy, mode)
    assert_clean(_reset_after_writes(moto_proxy, through, direct, mode, driver, seed, LONG))


# -- 8 concurrent writers on one thread, 20 % faults ---------------------------------------
MIX = {
    "dynamodb": ["s3_500", "s3_503", "ddb_throttle", "ddb_500", "reset_before", "reset_after", "reset_mid_body"],
    "manifest": ["s3_500", "s3_503", "reset_before", "reset_after", "reset_mid_body"],
}


def _one_thread(endpoint, proxy, mode, driver, seed, turns):
    through, direct = moto_savers(endpoint, proxy, mode)
    proxy.configure(kinds=MIX[mode], rate=0.20)
    row = scenario(proxy, through, direct, mode=mode, driver=driver, kind="mix", rate=0.20, seed=seed,
                   threads=8, turns=turns, one_thread=True, label="mix/8 writers 1 thread")
    assert_clean(row)


@pytest.mark.parametrize(("mode", "driver"), [("dynamodb", "async"), ("manifest", "sync")])
def test_eight_writers_one_thread(endpoint, moto_proxy, mode, driver):
    _one_thread(endpoint, moto_proxy, mode, driver, 5, 1)


@pytest.mark.faults
@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("mode", ["dynamodb", "manifest"])
@pytest.mark.parametrize("seed", SEEDS_LONG)
def test_eight_writers_one_thread_long(endpoint, moto_proxy, mode, driver, seed):
    _one_thread(endpoint, moto_proxy, mode, driver, seed, 5)


# -- kill -9 of a writing subprocess ---------------------------------------------------------
def _kill(endpoint, proxy, mode, where, seed, turns=4):
    """The child runs the graph through the proxy; on its N-th object PUT (or index write)
    the proxy lets the store apply it and holds the answer; the test kills the child -9."""
    setup = make_saver(endpoint, mode)
    setup.setup()
    setup.close()
    n = random.Random(seed).randint(6, 30)
    seen = [0]
    lock = threading.Lock()

    def pause(req: Req) -> bool:
        if not (req.is_object_put if where == "object" else req.is_commit):
            return False
        with lock:
            seen[0] += 1
            return seen[0] == n

    proxy.configure(enabled=False, pause_when=pause)
    thread_id = f"killed-{mode}-{where}-{seed}"
    env = dict(os.environ, PYTHONPATH=str(HERE))
    child = subprocess.Popen(
        [sys.executable, str(HERE / "fault_graph.py"), mode, proxy.url, thread_id, str(turns)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
    )
    try:
        paused = proxy.paused.wait(60)
        if paused:
            os.kill(child.pid, signal.SIGKILL)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        proxy.release.set()
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    if not paused:
        assert lines and lines[-1].get("done"), err[-2000:]
    run = ThreadRun(thread_id, [(d["step"], d["values"]) for d in lines if "step" in d])
    run.failed = None if (lines and lines[-1].get("done")) else ProcessLookupError("killed")
    fresh = make_saver(endpoint, mode)
    try:
        checked = check(fresh, [run], reference(turns))
    finally:
        fresh.close()
    row = {
        "mode": mode, "driver": "subprocess", "kind": f"kill -9 at {where} #{n}", "rate": "-",
        "requests": proxy.requests, "faults": int(paused), "ok": len(run.returned),
        "failed": int(run.failed is not None), "raw": 0, "exceptions": "SIGKILL" if paused else "-",
        "lost": checked.lost, "dangling": checked.dangling, "partial": checked.partial, "notes": checked.notes,
    }
    ROWS.append(row)
    assert_clean(row)


@pytest.mark.parametrize(("mode", "where"), [("dynamodb", "object"), ("manifest", "commit")])
def test_kill_between_object_and_commit(endpoint, moto_proxy, mode, where):
    _kill(endpoint, moto_proxy, mode, where, seed=1)


@pytest.mark.faults
@pytest.mark.parametrize("where", ["object", "commit"])
@pytest.mark.parametrize("mode", ["dynamodb", "manifest"])
@pytest.mark.parametrize("seed", SEEDS_LONG)
def test_kill_between_object_and_commit_long(endpoint, moto_proxy, mode, where, seed):
    _kill(endpoint, moto_proxy, mode, where, seed=seed)
