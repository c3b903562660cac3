"""A small file system that a test may fill to the last byte (a full disk).

Used through the ``small_disk`` fixture of ``tests/conftest.py``: a 2 MB tmpfs mounted for the test
(root only; the test is skipped otherwise) and unmounted afterwards. :meth:`SmallDisk.fill` writes a
file until the file system refuses another byte; :meth:`SmallDisk.free` removes it.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["SmallDisk"]


class SmallDisk:
    """A mounted tmpfs of a few megabytes at :attr:`path`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler"

    @classmethod
    def mount(cls, where: Path, size: str = "2m") -> Iterator[SmallDisk]:
        """Mount a tmpfs of ``size`` at ``where`` (skip the test when it cannot), yield it, unmount it."""
        where.mkdir()
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
            check=False,
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
        try:
            yield cls(where)
        finally:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)

    def fill(self) -> None:
        """Write :attr:`filler` until not one more byte fits: every later write that needs a new
        block of the file system fails with ``ENOSPC``."""
        with open(self.filler, "ab", buffering=0) as out:
            for size in (65536, 4096, 512, 1):
                with contextlib.suppress(OSError):
                    while True:
                        out.write(b"\0" * size)

    def free(self) -> None:
        """Remove :attr:`filler`: the space is back."""
        self.filler.unlink(missing_ok=True)
