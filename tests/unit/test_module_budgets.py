"""The package's shape, as tests: one concept, one module. Every module has a line budget and
a one-line responsibility; a module past its budget by more than 15 % (or past 800 lines) has
grown a second job: split it by responsibility, or raise its budget here and say why in the
commit. A new module is added to the table with its job."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "graphflow_durable"

#: The ceiling no module passes, whatever its budget.
CEILING = 800
#: How far past its budget a module may grow before this test asks for a decision.
SLACK = 1.15

#: module (relative to the package) -> (line budget, its one responsibility).
BUDGETS: dict[str, tuple[int, str]] = {
    "__init__.py": (
        130,
        "graphflow-durable: durable execution for AutoGen's GraphFlow.",
    ),  # 100 -> 130: exports
    "_agentstate/decoder.py": (
        150,
        "Agent-state rows read back: each node's current state folded from its latest rows.",
    ),
    "_agentstate/encoder.py": (
        200,
        "Agent states written as splices of their JSON text, with whole snapshots often enough t...",
    ),
    "_agentstate/jsondelta.py": (100, "Deltas between JSON values, for agent states that grow every turn."),
    "_turncalls.py": (  # new: one attempt's records and identities, out of recorded.py (the wrappers)
        360,
        "One attempt of a durable turn's recorded calls: records read and checked, identities, failures.",
    ),
    "_wrapping.py": (  # new: the pass-through the recording and rate-limiting wrappers shared
        60,
        "What a model client that wraps another answers as the wrapped one: the base of...",
    ),
    "_toolerrors.py": (  # new: kept out of recorded.py, which holds the replay
        80,
        "The exceptions a workbench's tools raise, seen before the workbench makes error results of them.",
    ),
    "_agentstate/textdelta.py": (
        200,
        "Text splices with message references, for agent states that grow every turn.",
    ),
    "_integrity/checks.py": (
        350,
        "The checks that need the graph: the saved scheduler, buffers and bookkeeping against th...",
    ),
    "_integrity/codes.py": (
        150,
        "The finding codes of the integrity checks, and the :class:`Finding` value.",
    ),
    "_integrity/derive.py": (
        200,
        "What a saved state should hold, derived from its message thread and the graph.",
    ),
    "_integrity/read.py": (
        300,
        "Reading a saved team state for the integrity checks: shape, versions, messages.",
    ),
    "_model/buffers.py": (
        100,
        "The participant buffer rule: what each participant has heard since it last spoke.",
    ),
    "_model/codec.py": (250, "Canonical JSON in and out: the only place where stored bytes are made."),
    # 250 -> 325: each node's durable back-off (retry_at), end_due; 325 -> 375: the runs a turn's
    # crashes shared (crash_with), to tell a crash loop's turn from its bystanders
    "_model/cursor.py": (
        375,
        "The manager's position in a run: scheduler state plus what resuming needs beyond it.",
    ),
    "_model/exported.py": (  # 150 -> 175: a supplied answer's rule (Store.supply_output)
        175,
        "What the store does with a run's content that needs AutoGen: an import's checks, a supplied answer.",
    ),
    "_model/graphid.py": (
        150,
        "Graph identity: a canonical description of a team's graph and its fingerprint.",
    ),
    "_model/history.py": (  # 200 -> 250: a supplied step in words
        250,
        "A run's history read from its step log: the steps in words, the thread filtered, and th...",
    ),
    "_model/human.py": (
        250,
        "Human input in a durable run: how a node asks (:class:`HumanInput`) and what is stored...",
    ),
    "_model/records.py": (
        # 250 -> 320: the node_failed marker (NodeFailure) and the in-flight turn counts;
        # 320 -> 420: the recorded calls' values (CallRecord, CallSummary)
        420,
        "The store's value objects: what a commit takes and what a load returns (JSON values, no...",
    ),
    "_model/restore.py": (150, "From a run's stored log to the team's state at the store's head."),
    "_model/runid.py": (50, "What a run id may be: the one rule, shared by the flow and the work queue."),
    "_model/task.py": (
        50,
        "What identifies a task, so that re-running a script with the same task is recognised.",
    ),
    "_runtime/commits.py": (
        290,  # 260 -> 290: a cancel read by a commit's head move stops the next dispatch (or is reported)
        "The write path of a run session: its transitions handed to the store's writer, and thei...",
    ),
    "_runtime/config.py": (
        200,
        "The declarative side of DurableGraphFlow: its component config and loading saved states.",
    ),
    "_runtime/container.py": (
        300,  # 200 -> 300: a turn's attempt under its node's retry / timeout policies (issue 25)
        "The durable participant container (a turn, its attempts under the node's policies), and ...",
    ),
    "_runtime/gate.py": (
        250,
        "Human input in a durable run: the input functions of ``UserProxyAgent`` participants, i...",
    ),
    # 450 -> 650: a failed attempt's retry, the run's failure, crash loops; 650 -> 750: the durable
    # back-off (a pool worker releases the run for it, a resume waits out what is left); 750 -> 800:
    # a turn whose crashes another run's turn shared is released to be driven alone
    "_runtime/manager.py": (
        800,
        "The durable GraphFlow manager: commits every transition; retries a failed attempt.",
    ),
    "_runtime/offloop.py": (  # new: the pool worker's store calls, off its event loop
        60,
        "A blocking store call made off the event loop, in a thread the loop never waits for.",
    ),
    "_runtime/runlease.py": (300, "The run's lease as one driver holds it, and the run's key."),
    "_runtime/session.py": (
        665,
        "One team's hold on its stored run: the run session.",
    ),  # 625: always-resume tear-down; 640: _bound's field-by-field fast path; 665: whom a run died with
    "_runtime/stops.py": (
        300,
        "When a round ends, and why a run stops dispatching (the run's control, its log filters).",
    ),
    # new: OpenTelemetry traces and metrics of runs; 350: a pool's, content; 500: the turn's
    # invoke_agent span opened here (its error's type without its text), tracing errors contained
    "_runtime/telemetry.py": (  # 500 -> 560: the queues' and rate limits' instruments beside the run's
        560,
        "What a durable run records for OpenTelemetry, through ``opentelemetry-api`` only: one s...",
    ),
    "_runtime/team.py": (
        300,  # 230 -> 250: the wind-down after an interrupt moved here from flow.py; 300: rate limits
        "The GraphFlow team as the runtime reaches into it, and the team and its stored run.",
    ),
    "_storage/admin.py": (  # 500 -> 650: supply (an operator's answer for a failed node)
        650,
        "Operations on runs from outside their driver: cancel, retry, supply, delete, prune, stats, runs show.",
    ),
    "_storage/calls.py": (
        300,
        "Recorded model and tool calls (schema version 12): :class:`CallRecords`, held by a stor...",
    ),
    "_storage/checksum.py": (
        250,  # 200 -> 250: the call records' checksum (call_sum)
        "Row checksums (schema version 6): what a commit stores beside each step, message and ag...",
    ),
    "_storage/document.py": (
        550,
        "A run's export document (``Store.export_run`` / ``Store.import_run``; ``runs export`` /...",
    ),
    "_storage/deaths.py": (100, "Which process each run died with, and which other runs died with it."),
    "_storage/claimable.py": (  # new: the claim's statements, out of workqueue.py (flow control grew it)
        250,
        "The statements of the worker-pool claim: which runs and submissions are claimable, in what order.",
    ),
    "_storage/flowcontrol.py": (  # new: named queues, their settings and the caps a claim enforces
        475,
        "Flow control for the worker pool: named queues, their settings, and what a claim may take under them.",
    ),
    "_storage/driver.py": (
        450,
        "The runtime's way into the store: one private driver object (commits, new runs, leases).",
    ),
    "_storage/engine.py": (
        500,
        "Engine set-up per backend: SQLite pragmas, PostgreSQL connections that give up on a silent server.",
    ),
    "_storage/lease.py": (
        400,
        "A run's lease: its rules, and the one takeover path the driver and the queue share; renew, release.",
    ),
    "_storage/follow.py": (
        350,
        "Follow a run's thread as it grows, from any process: what :meth:`Store.follow` iterates.",
    ),
    "_storage/migrations.py": (  # 550 -> 700: append-only, each migration a frozen copy of its tables (15: flow control, 16: rate limits)
        760,  # 700 -> 760: 18, key check values and the sealed-run marker
        "Versioned schema migrations: an append-only tuple of ``(version, description, function)``.",
    ),
    "_storage/reading.py": (
        300,
        "A run read back for a resume, every row checked against its checksum; and the store-wid...",
    ),
    "_storage/requests.py": (
        400,
        "Requests for human input (schema version 8): :class:`InputRequests`, held by a store as...",
    ),
    "_storage/schema.py": (
        360,  # 200 -> 250: the call records' table; 300: the queue settings, recent starts and rate limits; 360: key checks
        "SQLAlchemy Core tables: the single source of the schema the store reads and writes.",
    ),
    "_storage/statements.py": (
        550,  # 500 -> 550: the commit's multi-row INSERTs (RowsInsert)
        "The store's SQL statements, built once at import; a run's row read by id (``not_found``, ``run_row``).",
    ),
    "_storage/transfer.py": (  # 350 -> 440: sealed rows opened and sealed again for a new run id
        440,
        "A run's rows copied as they are: a cut and its fork, and to and from an export document.",
    ),
    "_storage/urls.py": (
        450,
        "Store URLs: the package's options in the query, the driver's options, and the URL to wr...",
    ),
    # 600 -> 650: the queue's depth and when an item became claimable; 650 -> 700: runs a worker
    # must drive alone (isolate, the claim's alone)
    "_storage/workqueue.py": (
        700,
        "The worker-pool queue: ``store.queue``, its value objects and the statements of its claim.",
    ),
    "_storage/writer.py": (
        550,
        "The commit hot path: a writer thread per store that commits in groups, and what each writes.",
    ),
    "_version.py": (
        50,
        "The package version: a module of its own, so every layer can read it without importing...",
    ),
    "cli/_common.py": (  # 450 -> 540: the store opened with the keys of the environment
        540,
        "What the command-line shells share: the Click pieces, the ``MODULE:ATTR`` importer and...",
    ),
    "cli/_inspect.py": (  # 150 -> 100: its rows moved to views.py, shared with the console's API
        100,
        "``graphflow-durable runs list`` and ``runs verify``: what they print, for :mod:`.runs`.",
    ),
    "cli/manage.py": (  # 300 -> 375: runs supply; the next retry time in runs show
        375,
        "``graphflow-durable runs show|cancel|retry|supply|delete|prune|stats``: looking at and managin...",
    ),
    "cli/queues.py": (
        150,
        "``graphflow-durable queues set|list|clear``: the named queues and their settings.",
    ),
    "cli/repair.py": (350, "``graphflow-repair``: check a saved GraphFlow team state, and repair it."),
    # 450 -> 525: the check command (the pre-deploy check), its team keys; 600: submit's and the
    # worker's queue options (--queue, --priority, --partition, --at)
    "cli/runs.py": (
        600,
        "``graphflow-durable``: list and verify runs, submit runs, and run a worker of a worker...",
    ),
    "cli/timeline.py": (  # 250 -> 300: runs follow; -> 340: it says once when the driver is gone
        340,
        "``graphflow-durable runs history | transcript | follow | export | import | fork``, for ...",
    ),
    "crypto.py": (  # new: encryption at rest, the codec and its keys
        260,
        "Encryption at rest: the codec a store seals its content columns with, and its keys.",
    ),
    "_storage/rekey.py": (  # new: runs rekey and verify --decrypt, the sealed rows swept
        400,
        "Sealed rows swept outside their driver: re-sealed under another key, sealed in place, opened.",
    ),
    "_storage/sealedexport.py": (  # new: a sealed export (version 3) opened for an import
        180,
        "A sealed run's export document (version 3) opened for an import, its checksums checked.",
    ),
    "cli/keys.py": (  # new
        120,
        "``graphflow-durable runs rekey`` and the sealing half of ``runs verify``, for :mod:`.runs`.",
    ),
    "_storage/keychecks.py": (  # new: the key check values, read and kept on a key's first seal
        60,
        "The key check values a store keeps (``graphflow_key_checks``): read, and kept the first time.",
    ),
    "_storage/sealing.py": (  # new: the codec applied to content columns, bound to their place
        # 170 -> 260: SEALED (the sealed columns and their positions), keys kept on first seal;
        # 260 -> 290: the refusal of a key not held, shared by the readers and `openable` (drivers)
        290,
        "Sealed columns: how a content value is stored under the store's codec, and opened again.",
    ),
    "context.py": (100, "What a running agent can know about its own execution: run, node, step, attempt."),
    "errors.py": (600, "The exception tree of graphflow-durable."),
    # 600 -> 700: attach_stream (a run watched from any process); 750: telemetry; 800: the
    # always-resume test mode (one call of run_stream resumed after each answer)
    "flow.py": (
        800,
        "DurableGraphFlow: a drop-in GraphFlow whose runs survive crashes.",
    ),
    "integrity.py": (300, "Validate and repair saved GraphFlow team states -- pure functions, no I/O."),
    "pytest_plugin.py": (  # new: the pytest11 plugin around testing.crash_matrix
        200,
        "The pytest plugin (entry point ``pytest11``): a user's graph proved crash-safe in their own tests.",
    ),
    "ratelimit.py": (
        500,
        "Model-provider rate limits shared by every process: :class:`RateLimit` and :func:`rate_limited`.",
    ),
    "_storage/ratelimits.py": (
        250,
        "Model-provider rate limits shared by every process (schema version 16): :class:`RateBudgets`,...",
    ),
    "recorded.py": (
        700,
        "Recorded model and tool calls: a turn that runs again replays the calls it already made.",
    ),
    "retry.py": (
        700,
        "Per-node retry and timeout policies: the values, which errors are worth a retry, how lo...",
    ),
    "scheduler.py": (450, "GraphFlow's scheduling rules as pure functions over a plain, serialisable state."),
    "views.py": (  # new: the CLI's --json rows and the console's API, built once
        225,
        "What the command line's ``--json`` and the console's API show of runs: one builder each.",
    ),
    "_storage/listing.py": (  # new: the console's keyset-paginated runs list and its inbox
        175,
        "Runs a page at a time, newest first (keyset), and the open requests for human input of every run.",
    ),
    "ui/app.py": (  # new: the run console
        475,
        "The console's routes: the pages, the actions, the JSON API and the export.",
    ),
    "ui/guard.py": (  # new
        200,
        "The console's security: token and login, session and CSRF, same-origin POSTs, headers.",
    ),
    "ui/live.py": (  # new; 430: one shared reader per run, fanned out to bounded queues per stream
        430,
        "Live updates of a run's page: Server-Sent Events from Store.follow, one reader per run.",
    ),
    "cli/console.py": (  # new
        200,
        "``graphflow-durable ui``: the console served by uvicorn, its first line, its signals.",
    ),
    "store.py": (800, "The run store: the only code that runs SQL. It knows nothing of AutoGen beyond JSON."),
    "preflight.py": (
        250,
        "The pre-deploy check: stored runs loaded against the current code, with no agent started.",
    ),
    # 700 -> 790: answers for a waiting person (human_input="wait"), the crashed team's tasks ended
    # unheard; near the ceiling: its next job (e.g. the subprocess child) goes in a module of its own
    "testing.py": (
        790,
        "The crash kit: prove that a user's own team survives a crash at any point (see docs/cra...",
    ),
    "ui/_layout.py": (  # new (the console); 350: back edges and layer-skipping edges routed around nodes
        350,
        "The run's graph drawn as SVG: nodes in layers coloured by state, edges with their conditions.",
    ),
    "ui/pictures.py": (  # new (the console)
        500,
        "The run page's pictures: each node's state, the graph with those states, the attempts' timeline.",
    ),
    "worker.py": (  # 650 -> 700: the pool's metrics (queue depth, claim latency)
        700,
        "A worker that claims runs from a store and drives them to completion; run several for a...",
    ),
}

#: Public modules allowed a private folder of the same name: the folder holds pipeline stages.
TWINS_ALLOWED = {"integrity"}


def _modules() -> dict[str, int]:
    return {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" or path.parent == PACKAGE
    }


def test_every_module_has_a_budget_and_a_responsibility_and_no_budget_is_stale() -> None:
    modules = _modules()
    assert len(modules) > 40  # the package was found: the check is not vacuous
    assert sorted(set(modules) - set(BUDGETS)) == [], "add these modules to BUDGETS with their job"
    assert sorted(set(BUDGETS) - set(modules)) == [], "these modules are gone: drop them from BUDGETS"
    assert all(job and budget <= CEILING for budget, job in BUDGETS.values())


def test_no_module_is_past_its_budget_by_more_than_the_slack_nor_past_the_ceiling() -> None:
    over = {
        name: (lines, BUDGETS[name][0])
        for name, lines in _modules().items()
        if name in BUDGETS and (lines > BUDGETS[name][0] * SLACK or lines > CEILING)
    }
    assert over == {}, "module: (lines, budget)"


def test_no_module_name_stands_in_two_subpackages() -> None:
    seen: dict[str, list[str]] = {}
    for name in _modules():
        if name != "__init__.py":
            seen.setdefault(Path(name).name, []).append(name)
    assert {base: places for base, places in seen.items() if len(places) > 1} == {}


def test_a_public_module_has_a_private_twin_folder_only_for_pipeline_stages() -> None:
    twins = {
        path.stem
        for path in PACKAGE.glob("*.py")
        if (PACKAGE / f"_{path.stem}").is_dir() and any((PACKAGE / f"_{path.stem}").glob("*.py"))
    }
    assert twins == TWINS_ALLOWED


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else parts[0]


def test_no_import_cycle_inside_any_subpackage_type_checking_imports_counted() -> None:
    import grimp  # import-linter's own graph builder

    graph = grimp.build_graph("graphflow_durable", exclude_type_checking_imports=False)
    inside = {
        module: sorted(
            imported
            for imported in graph.find_modules_directly_imported_by(module)
            if imported.startswith("graphflow_durable.")
            and _subpackage(imported) == _subpackage(module)
            and imported != _subpackage(module)  # a subpackage's own __init__ is not a sibling
        )
        for module in graph.modules
        if module.startswith("graphflow_durable.")
    }
    assert len(inside) > 40  # the package's modules were found: the check is not vacuous
    cycles = []
    for start in inside:  # a module that can reach itself through its own subpackage's imports
        seen, todo = set(), list(inside[start])
        while todo:
            module = todo.pop()
            if module == start:
                cycles.append(start)
                break
            if module not in seen:
                seen.add(module)
                todo.extend(inside.get(module, []))
    assert cycles == [], "modules on an import cycle inside their subpackage"


def test_the_architecture_map_names_every_module() -> None:
    doc = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = doc.index("## The map")
    the_map = doc[start : doc.index("\n## ", start + 1)]
    missing = [name for name in _modules() if name != "__init__.py" and Path(name).name not in the_map]
    assert missing == [], "docs/architecture.md's map: add these modules with their job"
