"""Run AutoGen's own GraphFlow tests on plain GraphFlow and on DurableGraphFlow, and compare.

The tests come from the autogen-agentchat source distribution of the version under test,
downloaded from the package index at test time (never copied into this repository) and cached
under ``.cache/upstream/`` (git-ignored): ``sdist/`` holds the archive, ``autogen_agentchat-X/``
only its ``tests/`` folder, ``venv-X/`` a scratch virtualenv when X is not the installed version.

Each of :data:`UPSTREAM_TEST_FILES` runs twice with pytest, in subprocesses, under upstream's own
settings (not this repository's pytest configuration): once as is, once with ``-p _swap_plugin``
(``DurableGraphFlow`` swapped in, a fresh SQLite store per test). Per-test outcomes come from
``_outcomes_plugin`` as JSON. A test that passes on plain GraphFlow and not on DurableGraphFlow is
a regression unless :data:`allowlist.ALLOWED_REGRESSIONS` names it with a reason; an allow-list
entry that is not a regression any more is stale. Either fails the step.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ._outcomes_plugin import OUTCOMES_ENV
from ._swap_plugin import REPORT_ENV

UPSTREAM_DIST = "autogen-agentchat"
#: The upstream test files (paths inside the sdist) run on both classes. Add more here.
UPSTREAM_TEST_FILES: tuple[str, ...] = ("tests/test_group_chat_graph.py",)
#: Set to another autogen-agentchat version (e.g. ``0.7.4``) to test against it in a scratch venv.
VERSION_ENV = "GRAPHFLOW_UPSTREAM_VERSION"

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
#: The download cache; ``$GRAPHFLOW_UPSTREAM_CACHE`` moves it (e.g. to a CI cache directory).
CACHE = Path(os.environ.get("GRAPHFLOW_UPSTREAM_CACHE") or REPO / ".cache" / "upstream")
ALLOWLIST_FILE = "tests/upstream/allowlist.py"
RUN_TIMEOUT = 600.0  # seconds per pytest subprocess; the graph tests take ~10 s
_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z]+[0-9]*)?(\.post[0-9]+)?$")


class UpstreamUnavailable(RuntimeError):
    """The upstream sdist (or the packages of a scratch venv) could not be fetched from the index."""


@dataclass(frozen=True)
class Outcome:
    outcome: str  # passed | failed | error | skipped
    reason: str


@dataclass
class RunResult:
    label: str
    tests: dict[str, Outcome]
    collection_errors: list[str]
    exitstatus: int
    seconds: float
    swap_counts: dict[str, int] | None = None
    output_tail: str = ""

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.tests.values() if o.outcome == outcome)

    def line(self) -> str:
        parts = [f"{self.count('passed')} passed"]
        parts += [f"{self.count(kind)} {kind}" for kind in ("failed", "error", "skipped") if self.count(kind)]
        extra = f"{self.seconds:.1f} s"
        if self.swap_counts is not None:
            extra += (
                f"; {self.swap_counts.get('durable_instances', 0)} DurableGraphFlow teams built,"
                f" {self.swap_counts.get('store_files', 0)} test stores"
            )
        return f"{', '.join(parts)} ({extra})"


@dataclass
class Report:
    version: str
    files: Sequence[str]
    python: str
    plain: RunResult
    durable: RunResult
    regressions: list[tuple[str, str]] = field(default_factory=list)  # not allowed
    allowed: list[tuple[str, str]] = field(default_factory=list)  # regression, allow-listed
    stale: list[tuple[str, str]] = field(default_factory=list)  # allow-list entries to delete
    problems: list[str] = field(default_factory=list)  # the step itself did not work

    @property
    def ok(self) -> bool:
        return not (self.regressions or self.stale or self.problems)

    def summary(self) -> str:
        out = [
            f"upstream conformance: {UPSTREAM_DIST} {self.version}, {', '.join(self.files)} ({self.python})",
            f"  plain GraphFlow:  {self.plain.line()}",
            f"  DurableGraphFlow: {self.durable.line()}",
        ]
        not_compared = sorted(t for t, o in self.plain.tests.items() if o.outcome in ("failed", "error"))
        if not_compared:
            out.append(f"  failing on plain GraphFlow already, not compared ({len(not_compared)}):")
            out += [f"    {t}: {self.plain.tests[t].reason}" for t in not_compared]
        out.append(f"  regressions ({len(self.regressions)}):")
        out += [f"    {t}: {why}" for t, why in self.regressions]
        if self.allowed:
            out.append(f"  allowed by {ALLOWLIST_FILE} ({len(self.allowed)}):")
            out += [f"    {t}: {why}" for t, why in self.allowed]
        if self.stale:
            out.append(f"  stale entries in {ALLOWLIST_FILE}, delete them ({len(self.stale)}):")
            out += [f"    {t}: {why}" for t, why in self.stale]
        out += [f"  problem: {p}" for p in self.problems]
        if self.ok:
            out.append("RESULT: OK")
        else:
            counts = [f"{len(self.regressions)} regressions not in {ALLOWLIST_FILE}"]
            counts += [f"{len(self.stale)} stale allow-list entries"] if self.stale else []
            counts += [f"{len(self.problems)} problems"] if self.problems else []
            out.append(f"RESULT: FAIL ({', '.join(counts)})")
        return "\n".join(out)


def installed_version() -> str:
    return importlib.metadata.version(UPSTREAM_DIST)


def _check_version(version: str) -> str:
    if not _VERSION_RE.match(version):
        raise ValueError(f"not a release version of {UPSTREAM_DIST}: {version!r}")
    return version


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def fetch_sdist(version: str, cache: Path = CACHE) -> Path:
    """The sdist of ``autogen-agentchat==version``, from the cache or downloaded with pip."""
    sdist_dir = cache / "sdist"
    name = f"{UPSTREAM_DIST.replace('-', '_')}-{version}.tar.gz"
    target = sdist_dir / name
    if target.is_file():
        return target
    sdist_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=sdist_dir, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        cmd += ["--timeout", "30", "--retries", "2", f"{UPSTREAM_DIST}=={version}", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        found = list(Path(tmp).glob("*.tar.gz"))
        if proc.returncode != 0 or len(found) != 1:
            raise UpstreamUnavailable(
                f"could not download the {UPSTREAM_DIST}=={version} sdist from the package index"
                f" ({' '.join(cmd[1:])}: exit {proc.returncode}):\n{_tail(proc.stdout + proc.stderr)}"
            )
        found[0].replace(target)
    return target


def extract_tests(sdist: Path, version: str, cache: Path = CACHE) -> Path:
    """Extract only the sdist's ``tests/`` folder; returns the directory that holds it (the rootdir)."""
    root = cache / sdist.name.removesuffix(".tar.gz")
    if (root / "tests").is_dir():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".extract-"))
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            for member in tar.getmembers():
                parts = PurePosixPath(member.name).parts
                if len(parts) < 3 or parts[1] != "tests" or not member.isfile():
                    continue
                if PurePosixPath(member.name).is_absolute() or ".." in parts:
                    raise ValueError(f"unsafe path in {sdist.name}: {member.name}")
                source = tar.extractfile(member)
                if source is None:
                    continue
                dest = tmp.joinpath(*parts[1:])
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(source.read())
        if not (tmp / "tests").is_dir():
            raise ValueError(f"{sdist.name} has no tests/ folder")
        try:
            tmp.replace(root)
        except OSError:
            if not (root / "tests").is_dir():  # not a concurrent extraction that won
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _scratch_requirements(version: str) -> list[str]:
    """What a scratch venv needs: upstream at ``version``, the test tools, this package's other deps."""
    reqs = [f"{name}=={version}" for name in ("autogen-agentchat", "autogen-core", "autogen-ext")]
    reqs += ["pytest>=8", "pytest-asyncio>=0.24"]
    for req in importlib.metadata.requires("graphflow-durable") or []:
        if "extra ==" not in req and not req.lower().startswith("autogen"):
            reqs.append(req.split(";")[0].strip())
    # What our own resume tests need there too (the floor pass runs them): the dev extra's test tools.
    reqs += ["pytest-timeout>=2.2", "psycopg[binary]>=3.1,<4", "hypothesis>=6.100", "httpx>=0.27"]
    reqs += ["opentelemetry-sdk>=1.20"]
    return reqs


def floor_version() -> str:
    """The oldest autogen-agentchat this package declares it supports (its ``>=`` in pyproject)."""
    for req in importlib.metadata.requires("graphflow-durable") or []:
        if not req.startswith("autogen-agentchat"):
            continue
        found = re.search(r">=\s*([0-9][^,;\s]*)", req)
        if found:
            return found.group(1)
    raise RuntimeError("graphflow-durable declares no autogen-agentchat floor")


def scratch_python(version: str, cache: Path = CACHE) -> Path:
    """A venv under the cache with ``autogen-agentchat==version``; this package comes from ``src``."""
    venv = cache / f"venv-{version}"
    python = venv / "bin" / "python"
    ready = venv / ".ready"
    if ready.is_file() and python.exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    cmd = [str(python), "-m", "pip", "install", "-q", "--timeout", "30", "--retries", "2"]
    proc = subprocess.run(
        cmd + _scratch_requirements(version), capture_output=True, text=True, timeout=1200, check=False
    )
    if proc.returncode != 0:
        raise UpstreamUnavailable(
            f"could not install {UPSTREAM_DIST}=={version} in {venv}:\n{_tail(proc.stdout + proc.stderr)}"
        )
    ready.write_text(version, encoding="utf-8")
    return python


def _pytest_command(python: Path, root: Path, files: Sequence[str], durable: bool) -> list[str]:
    cmd = [str(python), "-m", "pytest", *files, "-q", "--color=no"]
    # Upstream's settings, not ours: no ini file (theirs sets only testpaths/minversion), their
    # asyncio mode (strict: the tests mark themselves), no cache written into the extracted tree.
    cmd += ["-c", os.devnull, "--rootdir", str(root), "--confcutdir", str(root), "-p", "no:cacheprovider"]
    cmd += ["-o", "asyncio_mode=strict", "-o", "asyncio_default_fixture_loop_scope=function"]
    cmd += ["-p", "_outcomes_plugin"]
    if durable:
        cmd += ["-p", "_swap_plugin"]
    return cmd


def _start(
    python: Path, root: Path, files: Sequence[str], durable: bool, work: Path, extra_path: Sequence[Path]
) -> tuple[subprocess.Popen[bytes], Path, Path, Path]:
    label = "durable" if durable else "plain"
    outcomes, swap, log = work / f"{label}.json", work / f"{label}-swap.json", work / f"{label}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GRAPHFLOW_DURABLE_"))}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), *map(str, extra_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env[OUTCOMES_ENV] = str(outcomes)
    if durable:
        env[REPORT_ENV] = str(swap)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            _pytest_command(python, root, files, durable),
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, outcomes, swap, log


def _collect(
    label: str, started: tuple[subprocess.Popen[bytes], Path, Path, Path], t0: float, durable: bool
) -> RunResult:
    proc, outcomes, swap, log = started
    try:
        proc.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    seconds = time.monotonic() - t0
    tail = _tail(log.read_text(encoding="utf-8", errors="replace"))
    if not outcomes.is_file():
        return RunResult(label, {}, [], proc.returncode, seconds, None, tail)
    data = json.loads(outcomes.read_text(encoding="utf-8"))
    tests = {t: Outcome(o["outcome"], o["reason"]) for t, o in data["tests"].items()}
    counts = json.loads(swap.read_text(encoding="utf-8")) if durable and swap.is_file() else None
    if durable and counts is None:
        counts = {}
    return RunResult(label, tests, data["collection_errors"], data["exitstatus"], seconds, counts, tail)


def compare(plain: RunResult, durable: RunResult, allowed: Mapping[str, str], report: Report) -> None:
    """Fill ``report`` with regressions, allowed ones, stale allow-list entries and problems."""
    for run in (plain, durable):
        if not run.tests or run.exitstatus not in (0, 1) or run.collection_errors:
            report.problems.append(
                f"the {run.label} run did not complete (pytest exit {run.exitstatus},"
                f" {len(run.tests)} tests recorded): {'; '.join(run.collection_errors)}\n{run.output_tail}"
            )
    if plain.tests and not plain.count("passed"):
        report.problems.append("no upstream test passed on plain GraphFlow: nothing was compared")
    if durable.swap_counts is not None and not durable.swap_counts.get("durable_instances"):
        report.problems.append(
            "the swap did not take effect: no DurableGraphFlow was built in the durable run"
        )
    elif durable.swap_counts is not None and not durable.swap_counts.get("store_files"):
        report.problems.append(
            "the per-test stores were not used: DurableGraphFlow teams were built but no test store "
            "file was created (does the flow still read $GRAPHFLOW_DURABLE_STORE?)"
        )
    report.problems += [
        f"allow-list entry without a reason: {t}" for t, why in allowed.items() if not why.strip()
    ]
    regressions: set[str] = set()
    for test in sorted(t for t, o in plain.tests.items() if o.outcome == "passed"):
        got = durable.tests.get(test)
        if got is not None and got.outcome == "passed":
            continue
        regressions.add(test)
        why = f"{got.outcome}: {got.reason}" if got else "not run in the durable run"
        if test in allowed:
            report.allowed.append((test, f"{why} [allowed: {allowed[test]}]"))
        else:
            report.regressions.append((test, why))
    for test in sorted(set(allowed) - regressions):
        if test not in plain.tests:
            why = "no such upstream test in this run"
        elif plain.tests[test].outcome != "passed":
            why = f"{plain.tests[test].outcome} on plain GraphFlow too, so not a regression"
        else:
            why = "passes with DurableGraphFlow now"
        report.stale.append((test, why))


def run_conformance(
    version: str | None = None,
    files: Sequence[str] = UPSTREAM_TEST_FILES,
    allowed: Mapping[str, str] | None = None,
    cache: Path = CACHE,
) -> Report:
    """Fetch, run both ways (in parallel) and compare. Raises :class:`UpstreamUnavailable`."""
    if allowed is None:
        from .allowlist import ALLOWED_REGRESSIONS

        allowed = ALLOWED_REGRESSIONS
    installed = installed_version()
    version = _check_version(version or installed)
    sdist = fetch_sdist(version, cache)
    root = extract_tests(sdist, version, cache)
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(f"not in the {UPSTREAM_DIST} {version} sdist: {', '.join(missing)}")
    if version == installed:
        python, extra_path = Path(sys.executable), []
    else:
        python, extra_path = scratch_python(version, cache), [REPO / "src"]
    with tempfile.TemporaryDirectory(prefix="gfd-upstream-run-") as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        plain_run = _start(python, root, files, False, work, extra_path)
        durable_run = _start(python, root, files, True, work, extra_path)
        plain = _collect("plain", plain_run, t0, durable=False)
        durable = _collect("durable", durable_run, t0, durable=True)
    report = Report(version, files, str(python), plain, durable)
    compare(plain, durable, allowed, report)
    return report
