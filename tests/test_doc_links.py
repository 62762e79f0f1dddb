"""Every relative Markdown link in README.md and docs/*.md reaches an existing file, and
every `#anchor` an existing heading of that file (GitHub's slugs)."""

import pathlib
import re
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def _prose_lines(text):
    """The lines outside fenced code blocks, with their 1-based numbers."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading):
    """GitHub's anchor of a heading's text: inline markup dropped, lower case, anything
    but letters, digits, spaces, hyphens and underscores removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path):
    """The anchors of a Markdown file: each heading's slug, repeats numbered -1, -2, ..."""
    seen, found = {}, set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line))
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path):
    """(line, target) of every relative link of a page, code spans and blocks skipped."""
    previous = ""
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        line = _CODE_SPAN.sub("", line)
        targets = [m.group(1) for m in _LINK.finditer(line)]
        # A reference definition cannot interrupt a paragraph.
        reference = _REFERENCE.match(line)
        if reference and (not previous.strip() or _REFERENCE.match(previous)):
            targets.append(reference.group(1))
        previous = line
        for target in targets:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto:, ...
                continue
            yield number, target


def broken_links(page):
    """The links of `page` whose file or heading does not exist, as 'file:line: target'."""
    broken = []
    for number, target in links(page):
        file_part, _, anchor = target.partition("#")
        file = (page.parent / urllib.parse.unquote(file_part)).resolve() if file_part else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not file.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and file.suffix == ".md" and anchor.lower() not in anchors(file):
            broken.append(f"{where} (no heading #{anchor} in {file.name})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_slugs_follow_github():
    assert slug("The factorial at 20 seeds on held-out tasks") == (
        "the-factorial-at-20-seeds-on-held-out-tasks"
    )
    assert slug("SFT against DPO on the same logs (ETO, SDPO): 20 seeds") == (
        "sft-against-dpo-on-the-same-logs-eto-sdpo-20-seeds"
    )
    assert slug("`make_train` and [links](x.md)") == "make_train-and-links"
    assert slug("Rejection sampling -> SFT -> RL") == "rejection-sampling---sft---rl"


# A newcomer reads README in one sitting of the page, docs pages by topic.
LIMITS = {"README.md": 150, "docs/benchmarks.md": 250}
PAGE_LIMIT = 300
# Words about how the software was made, not what it does: history belongs in git.
PROCESS_WORDS = ("this stop", "no baseline rerun", "this session", "the issue asks",
                 "protocol issue", "seed brief", "the brief's", "sitting")  # fmt: skip


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_stay_short_and_describe_the_software(page):
    name = str(page.relative_to(ROOT))
    text = page.read_text()
    assert len(text.splitlines()) <= LIMITS.get(name, PAGE_LIMIT)
    assert [w for w in PROCESS_WORDS if w in text.lower()] == []
