"""The layer contracts of pyproject.toml ([tool.importlinter], run by scripts/test.sh) hold on the
package, and a forbidden import makes them fail: they are a check that can fail, not decoration."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "graphflow_durable"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(source_root: Path, config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with ``config`` on the package found first under ``source_root``."""
    env = {**os.environ, "PYTHONPATH": str(source_root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_layer_contracts_hold_on_the_package() -> None:
    result = lint_imports(ROOT / "src", ROOT / "pyproject.toml", ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_autogen_import_in_the_storage_layer_breaks_the_contracts(tmp_path: Path) -> None:
    copy = tmp_path / "src" / "graphflow_durable"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    schema = copy / "_storage" / "schema.py"
    schema.write_text(schema.read_text(encoding="utf-8") + "\nimport autogen_agentchat\n", encoding="utf-8")
    config = tmp_path / "pyproject.toml"
    shutil.copyfile(ROOT / "pyproject.toml", config)

    result = lint_imports(tmp_path / "src", config, tmp_path)

    assert result.returncode != 0, result.stdout
    assert "Storage never imports AutoGen BROKEN" in result.stdout
    # The import exists only in the copy: the copy, not the installed package, was checked.
    assert "graphflow_durable._storage.schema -> autogen_agentchat" in result.stdout
