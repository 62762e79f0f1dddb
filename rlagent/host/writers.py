"""Metric writers: one CSV of every (update, seed) row, and TensorBoard scalars."""

from __future__ import annotations

import csv
import gzip
import lzma
import math
import os
import sys
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TextIO

from rlagent import parallel

# How each compressed form of a file is opened (`open(path, mode)` alike).
COMPRESSED = {".xz": lzma.open, ".gz": gzip.open}


class MetricWriter:
    """Appends metric rows to `<workdir>/metrics.csv` and TensorBoard event files.

    Rows are dicts of scalars sharing one set of keys. `truncate(after_update)` drops rows
    past a checkpoint, so a resumed run writes the same file as an uninterrupted one.
    The folder is created by the first write (or by TensorBoard's writer): a writer that
    only reads, e.g. a report of a folder that holds nothing, leaves the disk as it was.
    In a multi-process run only process 0 writes (`parallel.is_primary`): the others'
    writers read the same file and leave it, and TensorBoard, alone.
    """

    def __init__(self, workdir: str, *, tensorboard: bool = True, filename: str = "metrics.csv"):
        self.path = os.path.join(workdir, filename)
        self._tb = None
        self._writes = parallel.is_primary()
        if tensorboard and self._writes:
            self._tb = _summary_writer(os.path.join(workdir, "tensorboard"))

    def read(self) -> list[dict[str, float]]:
        """The rows on disk; a last line cut short by a killed write is ignored. Without the
        file, its compressed form (a committed result's: `<filename>.xz`, or `.gz`) is read
        if present."""
        found = [p for p in (self.path, self.path + ".xz", self.path + ".gz") if os.path.exists(p)]
        if not found:
            return []
        opener = COMPRESSED.get(os.path.splitext(found[0])[1], open)
        with opener(found[0], "rt", newline="") as f:
            text = f.read()
        lines = text.splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines = lines[:-1]
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(lines)]

    def truncate(self, after_update: int) -> list[dict[str, float]]:
        """Keeps rows with `update <= after_update`; returns them.

        The file is replaced atomically, so a kill during the rewrite loses no row.
        """
        rows = [row for row in self.read() if row["update"] <= after_update]
        if not self._writes:
            return rows
        _make_folder(self.path)
        partial = self.path + ".tmp"
        with open(partial, "w", newline="") as f:
            _write_csv(f, rows, header=True)
        os.replace(partial, self.path)
        return rows

    def clear(self) -> None:
        """Starts the CSV afresh (TensorBoard events are append-only and stay)."""
        if self._writes and os.path.exists(self.path):
            os.remove(self.path)

    def write(self, rows: Iterable[Mapping[str, float]], *, tensorboard: bool = True) -> None:
        rows = list(rows)
        if not rows or not self._writes:
            return
        _make_folder(self.path)
        header = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        fields = None if header else self._header()
        with open(self.path, "a", newline="") as f:
            _write_csv(f, rows, header=header, fields=fields)
        if tensorboard and self._tb is not None:
            for row in rows:
                tag = f"{row.get('condition', 'run')}/seed{int(row['seed'])}"
                for key, value in row.items():
                    # NaN marks "not measured this update" (e.g. held-out evaluation).
                    numeric = isinstance(value, int | float) and math.isfinite(value)
                    if numeric and key not in ("update", "seed"):
                        self._tb.add_scalar(f"{tag}/{key}", value, int(row["update"]))
            self._tb.flush()

    def _header(self) -> list[str]:
        with open(self.path, newline="") as f:
            return next(csv.reader(f))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _make_folder(path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)


def _summary_writer(folder: str):
    """tensorboardX's `SummaryWriter`, its module imported without torch.

    tensorboardX imports torch at import time when it is installed, only so that it can
    take torch tensors; the rows here are floats. That import costs about 4 s in every
    process (every launcher, every test subprocess), so while tensorboardX loads, `import
    torch` fails as if torch were absent (tensorboardX's own fallback); a process that
    has already imported torch is left as it is.
    """
    block = "torch" not in sys.modules
    if block:
        sys.modules["torch"] = None  # `import torch` raises ImportError meanwhile.
    try:
        from tensorboardX import SummaryWriter
    finally:
        if block:
            del sys.modules["torch"]
    return SummaryWriter(folder)


def _write_csv(
    f: TextIO, rows: list[Mapping[str, float]], *, header: bool, fields: list[str] | None = None
) -> None:
    """Rows under `fields` (the file's header; default: the rows' keys in order), written by
    name: key order does not matter, a column a row lacks stays empty (NaN when read) and a
    key the header lacks is an error, never a shifted column."""
    if not rows:
        return
    fields = list(dict.fromkeys(key for row in rows for key in row)) if fields is None else fields
    extra = sorted({key for row in rows for key in row} - set(fields))
    if extra:
        raise ValueError(f"{getattr(f, 'name', 'metrics')}: columns {extra} are not in its header")
    writer = csv.DictWriter(f, fieldnames=fields)
    if header:
        writer.writeheader()
    writer.writerows(rows)


def _number(text: str) -> float | str:
    if text == "":  # a metric this row lacks (rows of runs that log different metrics)
        return float("nan")
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text else value
