"""docs/results holds only what the pages cite, and every docs/results path a page gives
exists.

Pages: README.md, docs/*.md and colab/*.ipynb. A mention is `docs/results/<path>` or, as
the pages in docs/ link it, `results/<path>`; in it `*` matches within one name, `{a,b}`
lists alternatives and `{1-4}` a range of numbers. A mention after `<commit>:` (`git show
0465868:docs/results/...`, a file in git history) is not one. Every mention must match a
file or folder. A file under docs/results is cited when

1. a mention names it; a glob names the data files it matches, never a figure: a figure
   (`*.png`) is cited by its own path written out;
2. a mentioned folder holds it, at any depth, and it is a data file: anything but a
   figure, a log (`*.log`, `log.txt`) or code (`*.py`). Logs and analysis code are not
   kept under docs/results: the analyses are modules of experiments/analyses/, and their
   commands on the pages name the folders they read (and write analysis.md into), so
   rule 2 covers what they read;
3. it is part of the record of a cited flat result `<name>_summary.md` (or `.json`):
   `<name>_summary.md`, `<name>_summary.json`, `<name>_provenance.json`,
   `<name>_metrics.csv.xz`.

Per-update metrics are kept as `metrics.csv.xz`, never as a plain metrics.csv (`python -m
experiments.analyses.compact_results <folder>`; `MetricWriter.read` reads either).
"""

import json
import lzma
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
MENTION = re.compile(r"(?<![\w/.-])(?<![0-9a-f]{7}:)(?:docs/)?results/([\w.*{},/-]*)")
RECORD = ("summary.md", "summary.json", "provenance.json", "metrics.csv.xz")


def _pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] + sorted(
        (ROOT / "colab").glob("*.ipynb")
    )


def _text(page: pathlib.Path) -> str:
    if page.suffix == ".ipynb":
        cells = json.loads(page.read_text())["cells"]
        return "\n".join("".join(cell["source"]) for cell in cells)
    return page.read_text()


def _expand(pattern: str) -> list[str]:
    """`{a,b}` and `{1-4}` expanded, innermost first."""
    found = re.search(r"\{([^{}]*)\}", pattern)
    if not found:
        return [pattern]
    span = re.fullmatch(r"(\d+)-(\d+)", found.group(1))
    options = (
        [str(i) for i in range(int(span.group(1)), int(span.group(2)) + 1)]
        if span
        else found.group(1).split(",")
    )
    head, tail = pattern[: found.start()], pattern[found.end() :]
    return [p for option in options for p in _expand(head + option + tail)]


def _matches(pattern: str, names) -> list[str]:
    regex = re.compile("".join("[^/]*" if c == "*" else re.escape(c) for c in pattern))
    return [name for name in names if regex.fullmatch(name)]


def _is_data(name: str) -> bool:
    return not name.endswith((".png", ".log", ".py")) and pathlib.PurePath(name).name != "log.txt"


def _files() -> list[str]:
    return sorted(str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*") if p.is_file())


def _mentions():
    """(page, mention as written, one expanded pattern) for every mention on the pages."""
    for page in _pages():
        for found in MENTION.finditer(_text(page)):
            written = found.group(1).rstrip(".,")
            for pattern in _expand(written):
                if pattern.rstrip("/"):
                    yield page.relative_to(ROOT), written, pattern.rstrip("/")


def _cited(files: list[str]) -> tuple[set[str], list[str]]:
    """The cited files (module docstring) and the mentions that resolve to nothing."""
    folders = {str(pathlib.PurePath(f).parents[i]) for f in files for i in range(f.count("/"))}
    cited, broken = set(), []
    for page, written, pattern in _mentions():
        named, held = _matches(pattern, files), _matches(pattern, folders)
        if "*" in pattern:
            named = [f for f in named if not f.endswith(".png")]
        if not named and not held:
            broken.append(f"{page}: results/{written}")
        cited.update(named)
        for folder in held:
            cited.update(f for f in files if f.startswith(folder + "/") and _is_data(f))
    for name in list(cited):
        for kind in ("summary.md", "summary.json"):
            if name.endswith("_" + kind):
                prefix = name[: -len(kind)]
                cited.update(f for f in files if f in {prefix + r for r in RECORD})
    return cited, broken


def test_every_results_path_on_a_page_exists():
    _, broken = _cited(_files())
    assert not broken, "docs/results paths the pages give that do not exist:\n" + "\n".join(broken)


def test_every_file_under_docs_results_is_cited_by_a_page():
    files = _files()
    cited, _ = _cited(files)
    uncited = [f for f in files if f not in cited]
    assert not uncited, (
        f"{len(uncited)} files under docs/results no page cites (module docstring; remove "
        "them, git history keeps them, or cite them):\n" + "\n".join(uncited)
    )


def test_metrics_are_kept_compressed():
    plain = [str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*metrics.csv")]
    assert not plain, (
        "per-update metrics under docs/results are kept as metrics.csv.xz (python -m "
        "experiments.analyses.compact_results <folder>):\n" + "\n".join(plain)
    )


def test_compact_results_keeps_every_row_and_the_read_columns(tmp_path):
    """Diagnostics no report reads are left out; a float32 value is written in float32's
    shortest form and read back as that float32; other text (ints, NaN, names, float64
    values) is kept as written; compacting twice changes nothing."""
    from experiments.analyses import compact_results
    from rlagent.host.writers import MetricWriter

    text = (
        "condition,update,seed,success,grad_norm,entropy,eval_sampled_success,rate\r\n"
        "outcome,1,0,0.5,9.27795696258545,0.6593049168586731,,0.1\r\n"
        "outcome,2,0,111.0,1.0,-0.0,nan,0.30000000000000004\r\n"
    )
    (tmp_path / "metrics.csv").write_text(text, newline="")
    out = compact_results.compact_file(str(tmp_path / "metrics.csv"))
    assert out == str(tmp_path / "metrics.csv.xz") and not (tmp_path / "metrics.csv").exists()
    rows = MetricWriter(str(tmp_path), tensorboard=False).read()
    assert [list(r) for r in rows] == [
        ["condition", "update", "seed", "success", "entropy", "eval_sampled_success", "rate"]
    ] * 2
    assert rows[0]["entropy"] == 0.6593049 and rows[1]["success"] == 111.0
    assert isinstance(rows[1]["update"], int) and rows[1]["rate"] == 0.30000000000000004
    assert rows[0]["eval_sampled_success"] != rows[0]["eval_sampled_success"]  # NaN
    before = (tmp_path / "metrics.csv.xz").read_bytes()
    compact_results.compact_file(out)
    assert (tmp_path / "metrics.csv.xz").read_bytes() == before
    # A gzipped CSV (an older committed form) is compacted into the .xz, the .gz removed.
    compact_results.write_compressed(str(tmp_path / "old_metrics.csv.gz"), text.encode())
    out = compact_results.compact_file(str(tmp_path / "old_metrics.csv.gz"))
    assert (
        out == str(tmp_path / "old_metrics.csv.xz")
        and not (tmp_path / "old_metrics.csv.gz").exists()
    )
    assert lzma.decompress((tmp_path / "old_metrics.csv.xz").read_bytes()) == lzma.decompress(
        before
    )
