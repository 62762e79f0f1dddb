"""A run folder's results in the compact form docs/results keeps them in.

    python -m experiments.analyses.compact_results docs/results/<study>

Replaces every `metrics.csv` (and `<name>_metrics.csv`) under the folder by
`metrics.csv.xz` (xz: 20% smaller than gzip's best on these files), and rewrites an
existing `*metrics.csv.gz` or `.xz` the same way: every row,
every column a report or analysis reads; the trainer's diagnostics that none reads
(`DIAGNOSTICS`) left out; a number that is exactly a float32 (what the device computed)
written in float32's shortest form, others as they were. `MetricWriter.read` reads the
result (`metrics.csv.xz` beside a missing `metrics.csv`). Every other JSON file but the
run's provenance (which is never rewritten) is written without indentation, the same
values (`compact_json_file`); a JSON-lines log (`*.jsonl`) is gzipped beside
(`*.jsonl.gz`). Deterministic: the same input gives the same bytes.
"""

import csv
import gzip
import io
import json
import lzma
import math
import os
import sys

import numpy as np

from rlagent.host.writers import COMPRESSED

# Written every update by the trainer and the host loop, read by no report, summary or
# analysis (rlagent/analysis, experiments/studies, experiments/analyses).
DIAGNOSTICS = (
    "approx_kl", "clip_fraction", "grad_norm", "policy_loss", "value_loss", "kl_coef",
    "tokens", "train_return", "return_std", "turns_per_sec",
)  # fmt: skip


def float32_text(text: str) -> str:
    """`text` unchanged unless it is a finite float (a '.' or an 'e' in it) that float32
    holds exactly; then float32's shortest text, still a float ('.' or 'e')."""
    if "." not in text and "e" not in text:
        return text
    try:
        value = float(text)
    except ValueError:
        return text
    if not math.isfinite(value) or float(np.float32(value)) != value:
        return text
    if value == 0 or 1e-4 <= abs(value) < 1e16:
        return np.format_float_positional(np.float32(value), unique=True, trim="0")
    return np.format_float_scientific(np.float32(value), unique=True, trim="0")


def compact(text: str) -> str:
    """A metrics CSV's text in the compact form (header and rows, CRLF as written)."""
    rows = list(csv.reader(io.StringIO(text, newline="")))
    keep = [i for i, name in enumerate(rows[0]) if name not in DIAGNOSTICS]
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow([rows[0][i] for i in keep])
    for row in rows[1:]:
        writer.writerow([float32_text(row[i]) if i < len(row) else "" for i in keep])
    return out.getvalue()


def compact_file(path: str) -> str:
    """Writes `path`'s compact form (`path` a metrics CSV, plain or compressed) to
    `<path without its .gz / .xz>.xz`, removes `path` when that is another file; returns
    the written path."""
    stem, suffix = os.path.splitext(path)
    if suffix not in COMPRESSED:
        stem = path
    with COMPRESSED.get(suffix, open)(path, "rt", newline="") as f:
        text = compact(f.read())
    out = stem + ".xz"
    write_compressed(out, text.encode())
    if out != path:
        os.remove(path)
    return out


def write_compressed(out: str, data: bytes) -> None:
    """`data` compressed by `out`'s suffix (.xz: xz at its strongest preset; .gz: gzip
    level 9 without a timestamp), written atomically: the same input gives the same bytes."""
    with open(out + ".tmp", "wb") as raw:
        if out.endswith(".xz"):
            raw.write(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
        else:
            with gzip.GzipFile("", "wb", 9, raw, mtime=0) as f:
                f.write(data)
    os.replace(out + ".tmp", out)


def compact_json_file(path: str) -> bool:
    """Rewrites the JSON file `path` without indentation or spaces (the same values: floats
    round-trip exactly); True when its bytes changed."""
    with open(path) as f:
        text = f.read()
    out = json.dumps(json.loads(text), separators=(",", ":")) + "\n"
    if out == text:
        return False
    with open(path + ".tmp", "w") as f:
        f.write(out)
    os.replace(path + ".tmp", path)
    return True


def gzip_file(path: str) -> str:
    """`path` gzipped to `path.gz` (no timestamp: the same bytes every time), `path` removed."""
    with open(path, "rb") as f:
        write_compressed(path + ".gz", f.read())
    os.remove(path)
    return path + ".gz"


def main(folder: str) -> None:
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            path = os.path.join(root, name)
            if name.endswith(("metrics.csv", "metrics.csv.gz", "metrics.csv.xz")):
                print(compact_file(path))
            elif name.endswith(".jsonl"):
                print(gzip_file(path))
            elif name.endswith(".json") and "provenance" not in name:
                if compact_json_file(path):
                    print(path)


if __name__ == "__main__":
    main(sys.argv[1])
