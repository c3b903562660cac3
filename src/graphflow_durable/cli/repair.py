"""``graphflow-repair``: check a saved GraphFlow team state, and repair it.

A thin shell over :func:`graphflow_durable.integrity.validate_state` and
:func:`~graphflow_durable.integrity.repair_state`. Data goes to stdout, diagnostics to stderr; the
bare command only reads. Run ``graphflow-repair --help`` (or ``python -m
graphflow_durable.cli.repair --help``) for the usage and exit codes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

import click
from autogen_agentchat.teams import DiGraph
from pydantic import ValidationError

from graphflow_durable.cli._common import (
    CliError,
    Command,
    exclusive,
    import_attribute,
    json_option,
    load_json,
    prepare_streams,
    require_value,
    run_command,
    write_atomically,
)
from graphflow_durable.errors import GraphMismatchError, StateFormatError, UnrepairableStateError
from graphflow_durable.integrity import RepairResult, ValidationReport, repair_state, validate_state

__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_UNREPAIRABLE", "EXIT_USAGE", "entry", "main"]

EXIT_OK = 0
"""The state is valid (check mode), or it was repaired (or would be, with --dry-run)."""
EXIT_INVALID = 1
"""Check mode found problems (errors or warnings)."""
EXIT_USAGE = 2
"""Usage error, or unreadable input: a missing/empty/non-JSON file, JSON nested more than 200 levels
deep, a wrong shape, another graph."""
EXIT_UNREPAIRABLE = 3
"""The state cannot be repaired without inventing progress."""

# Findings that mean "this is not a state this tool can read at all": a one-line error, exit 2.
_UNREADABLE = (
    "GFD001-not-a-team-state",
    "GFD003-version-unknown",
    "GFD004-manager-missing",
    "GFD005-not-a-graphflow-state",
    "GFD007-durable-format-unknown",
    "GFD010-different-graph",
)

EPILOG = """\
modes:
  (no writing option)  check only: print the findings; write nothing
  -o OUT.json          write the repaired state to OUT.json ('-' for stdout)
  --in-place           replace STATE.json atomically, keeping the original as STATE.json.bak
                       (refused if STATE.json.bak exists: a backup is never overwritten)
  --dry-run            show what repair would change (with or without -o/--in-place); write nothing
  repairing needs the graph: --graph FILE (a DiGraph dump, or a GraphFlow component dump as
  team.dump_component() writes it) or --team module:attribute (a GraphFlow/DurableGraphFlow, a
  DiGraph, or a zero-argument factory returning one -- needed when edges have callable conditions)

exit codes:
  0  valid (check mode), or repaired
  1  problems found (check mode)
  2  usage error or unreadable input (missing, empty, not JSON, nested more than 200 levels deep,
     wrong shape, a different graph)
  3  not repairable (the thread does not fit the graph, a participant's state is missing)

finding codes are documented in docs/repair.md.
"""


class _Fail(CliError):
    """A one-line error for stderr; unreadable input or a usage error unless another code is given."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message, code)


@click.command(
    "graphflow-repair",
    cls=Command,
    help="Check a team state saved by GraphFlow or DurableGraphFlow, and repair it.\n\n"
    "STATE.json: the saved team state (team.save_state() as JSON).",
    epilog=EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.argument("state", metavar="STATE.json")
@click.option("--graph", metavar="FILE", help="JSON: a DiGraph dump or a GraphFlow component dump")
@click.option("--team", metavar="MODULE:ATTR", help="an importable team, graph, or factory")
@json_option("print the report (and changes) as JSON")
@click.option("-o", "--output", metavar="OUT.json", help="write the repaired state here")
@click.option("--in-place", is_flag=True, help="replace STATE.json, keeping a .bak backup")
@click.option("--dry-run", is_flag=True, help="show what would change; write nothing")
@click.pass_context
def cli(ctx: click.Context, /, **params: Any) -> int:
    """The ``graphflow-repair`` command (Click); :func:`main` runs it."""
    exclusive(ctx, ("--graph", params["graph"]), ("--team", params["team"]))
    exclusive(ctx, ("-o/--output", params["output"]), ("--in-place", params["in_place"]))
    return _run(SimpleNamespace(**params))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit code (see the module's ``EXIT_*`` constants)."""
    return run_command("graphflow-repair", cli, argv, usage_code=EXIT_USAGE)


def entry() -> None:
    """Console-script entry point."""
    prepare_streams()
    sys.exit(main())


def _run(args: SimpleNamespace) -> int:
    require_value("STATE", args.state, "the path of a saved team state (JSON)")
    require_value("--graph", args.graph, "a JSON file holding the graph")
    require_value("--team", args.team, "MODULE:ATTR naming a team, a graph, or a factory")
    require_value("--output", args.output, "a file to write, or - for stdout")
    state_path = Path(args.state)
    state = _read_state(state_path)
    graph = _load_graph(args)
    repairing = bool(args.output or args.in_place or args.dry_run)
    if repairing and graph is None:
        raise _Fail("repairing needs the graph: give --graph FILE or --team MODULE:ATTR")
    if not repairing:
        report = validate_state(state, graph)
        _refuse_unreadable(state_path, report)
        _emit_report(state_path, report, args.json)
        return EXIT_OK if report.ok else EXIT_INVALID
    assert graph is not None
    try:
        result = repair_state(state, graph)
    except (StateFormatError, GraphMismatchError) as exc:
        raise _Fail(f"{state_path}: {exc}") from exc
    except UnrepairableStateError as exc:
        raise _Fail(f"{state_path}: not repairable: {exc}", EXIT_UNREPAIRABLE) from exc
    to_stdout = args.output == "-" and not args.dry_run
    written = None if args.dry_run else _write_result(state_path, args, result)
    _emit_repair(state_path, result, args, written, sys.stderr if to_stdout else sys.stdout)
    return EXIT_OK


# -- input ---------------------------------------------------------------------------------------


def _read_json(path: Path, what: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _Fail(f"{path}: no such file") from None
    except IsADirectoryError:
        raise _Fail(f"{path}: is a directory, not a {what} file") from None
    except UnicodeDecodeError:
        raise _Fail(f"{path}: not UTF-8 text, so not a {what} JSON file") from None
    except OSError as exc:
        raise _Fail(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not text.strip():
        raise _Fail(f"{path}: the file is empty, expected a {what} as JSON")
    try:
        return load_json(text, where=str(path), what=what)  # CliError (exit 2) when nested too deeply
    except json.JSONDecodeError as exc:
        raise _Fail(f"{path}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None


def _read_state(path: Path) -> Mapping[str, Any]:
    data = _read_json(path, "team state")
    if not isinstance(data, Mapping) or not isinstance(data.get("agent_states"), Mapping):
        raise _Fail(
            f"{path}: JSON of the wrong shape: expected a team state (an object with 'agent_states'), "
            "as team.save_state() returns"
        )
    return data


def _refuse_unreadable(path: Path, report: ValidationReport) -> None:
    for finding in report.findings:
        if finding.code in _UNREADABLE:
            where = f" at {finding.pointer}" if finding.pointer else ""
            raise _Fail(f"{path}: {finding.code}{where}: {finding.message}")


def _load_graph(args: SimpleNamespace) -> DiGraph | None:
    if args.graph:
        return _graph_from_file(Path(args.graph))
    if args.team:
        return _graph_from_team(args.team)
    return None


def _graph_from_file(path: Path) -> DiGraph:
    data = _read_json(path, "graph")
    candidates: list[Any] = [data]
    if isinstance(data, Mapping):
        config = data.get("config")
        if isinstance(config, Mapping) and "graph" in config:
            candidates = [config["graph"]]  # a GraphFlow component dump
        elif "graph" in data and "nodes" not in data:
            candidates = [data["graph"]]  # a GraphFlowConfig
    graph = candidates[0]
    if not isinstance(graph, Mapping) or "nodes" not in graph:
        raise _Fail(
            f"{path}: neither a DiGraph dump (an object with 'nodes') nor a GraphFlow component dump "
            "(team.dump_component())"
        )
    try:
        return DiGraph.model_validate(graph)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "/".join(str(p) for p in first.get("loc", ()))
        raise _Fail(f"{path}: not a valid DiGraph: {where}: {first.get('msg')}") from None


def _graph_from_team(spec: str) -> DiGraph:
    obj = import_attribute(spec, flag="--team", example="myproject.teams:build_team", code=EXIT_USAGE)
    graph = _graph_of(obj)
    if graph is None and callable(obj):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001 -- the user's factory: report it on one line
            raise _Fail(f"--team {spec!r}: the factory raised {type(exc).__name__}: {exc}") from None
        graph = _graph_of(obj)
    if graph is None:
        raise _Fail(f"--team {spec!r}: not a GraphFlow, a DiGraph, or a zero-argument factory returning one")
    return graph


def _graph_of(obj: Any) -> DiGraph | None:
    if isinstance(obj, DiGraph):
        return obj
    # GraphFlow keeps its graph in ``_graph`` (no public accessor in autogen-agentchat 0.7).
    for name in ("graph", "_graph"):
        value = getattr(obj, name, None)
        if isinstance(value, DiGraph):
            return value
    return None


# -- output --------------------------------------------------------------------------------------


def _dumps(state: Mapping[str, Any]) -> str:
    return json.dumps(state, indent=2, ensure_ascii=False) + "\n"


def _atomic_write(path: Path, text: str, *, exclusive: bool = False) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename."""
    if exclusive and path.exists():
        raise _Fail(f"{path}: the backup already exists; move it away first (a backup is never overwritten)")
    try:
        write_atomically(path, text)
    except OSError as exc:
        raise _Fail(f"{path}: cannot write: {exc.strerror or exc}") from None


def _write_result(state_path: Path, args: SimpleNamespace, result: RepairResult) -> str | None:
    text = _dumps(result.state)
    if args.output == "-":
        sys.stdout.write(text)
        return "-"
    if args.output:
        out = Path(args.output)
        if out.is_dir():
            raise _Fail(f"{out}: is a directory; give a file name for -o")
        _atomic_write(out, text)
        return str(out)
    if not result.changed:
        return None
    backup = state_path.with_name(state_path.name + ".bak")
    _atomic_write(backup, state_path.read_text(encoding="utf-8"), exclusive=True)
    _atomic_write(state_path, text)
    return str(state_path)


def _emit_report(path: Path, report: ValidationReport, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps({"file": str(path), **report.to_json()}, indent=2) + "\n")
        return
    sys.stdout.write(_format_report(path, report))


def _format_report(path: Path, report: ValidationReport) -> str:
    counts = {s: sum(f.severity == s for f in report.findings) for s in ("error", "warning", "info")}
    problems = counts["error"] + counts["warning"]
    notes = f", {counts['info']} note{'s' * (counts['info'] != 1)}" if counts["info"] else ""
    if problems:
        head = (
            f"{path}: {problems} problem{'s' * (problems != 1)} found "
            f"({counts['error']} error{'s' * (counts['error'] != 1)}, "
            f"{counts['warning']} warning{'s' * (counts['warning'] != 1)}){notes}"
        )
    else:
        head = f"{path}: valid{notes}"
    lines = [head]
    for f in report.findings:
        lines.append(f"  {f.severity:<8} {f.code}  at {f.pointer or '/'}")
        lines.append(f"           {f.message}")
    if report.skipped:
        lines.append("skipped (they need the graph: --graph or --team): " + ", ".join(report.skipped))
    return "\n".join(lines) + "\n"


def _emit_repair(
    path: Path, result: RepairResult, args: SimpleNamespace, written: str | None, out: TextIO
) -> None:
    if args.json:
        payload = {
            "file": str(path),
            "report": result.report.to_json(),
            "changes": [c.to_json() for c in result.changes],
            "written": written,
            "dry_run": bool(args.dry_run),
        }
        out.write(json.dumps(payload, indent=2) + "\n")
    else:
        out.write(_format_report(path, result.report))
        verb = "would change" if args.dry_run else "changed"
        if result.changes:
            out.write(f"repair {verb} {len(result.changes)} field{'s' * (len(result.changes) != 1)}:\n")
            for change in result.changes:
                out.write(f"  {change.pointer}\n    - {change.before}\n    + {change.after}\n")
        else:
            out.write("repair changes nothing: the state is already in the repaired form\n")
    if args.dry_run:
        sys.stderr.write("dry run: nothing written\n")
    elif written is None:
        sys.stderr.write(f"{path}: already repaired; nothing written\n")
    elif written != "-":
        sys.stderr.write(f"wrote {written}" + (f" (backup: {path}.bak)" if args.in_place else "") + "\n")


if __name__ == "__main__":
    entry()
