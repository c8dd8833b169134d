"""The documentation holds together: a short README, links that resolve, code citing docs/.

README.md stays a front page (under 200 lines, the two commands a newcomer needs); the rest
lives in docs/. Every relative link in README.md, docs/*.md and scripts/**/*.md must name an
existing file, and a #fragment an existing heading of that Markdown file (GitHub's anchors); a
citation of docs/<file>.md in the code, configs, scripts or tests must name an existing file
and, where it quotes a section (docs/results.md, "Learning per update"), one of its headings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "scripts").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target "title")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)  # [label]: target
CITATION = re.compile(r"docs/([\w.-]+\.md)(?:#([\w-]+)|,\s*\"([^\"]+)\")?")


def prose(text: str) -> str:
    """Markdown without its fenced code blocks and inline code spans (links there are text)."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def headings(page: Path) -> list[str]:
    """The page's headings, as written (fenced code skipped; a heading may hold `code`)."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", page.read_text(), flags=re.M | re.S)
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: link markup and punctuation dropped, lower case, spaces
    to hyphens (letters, digits, '_' and '-' kept)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a page, duplicates numbered as GitHub numbers them (-1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(page):
        slug = anchor(heading)
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


def test_anchor_follows_github():
    assert anchor("nmt against CTranslate2") == "nmt-against-ctranslate2"
    assert anchor("cpu20: the best 20 minutes on 2 CPU cores") == \
        "cpu20-the-best-20-minutes-on-2-cpu-cores"
    assert anchor("The paper's post-norm learns") == "the-papers-post-norm-learns"
    assert anchor("nmt-train (`TrainConfig`)") == "nmt-train-trainconfig"


def test_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    assert "make demo" in text and "make test" in text
    assert "docs/results.md" in text  # where the measured results live


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    text = prose(page.read_text())
    broken = []
    for target in LINK.findall(text) + REFERENCE.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif fragment and (file.suffix != ".md" or fragment not in anchors(file)):
            broken.append(f"{target}: no heading #{fragment} in {file.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_code_cites_existing_docs():
    broken = []
    files = [p for d in ("nmt", "configs", "scripts", "tests") for p in (ROOT / d).rglob("*")
             if p.suffix in (".py", ".sh", ".yaml") and p != Path(__file__).resolve()]
    for file in files:
        text = " ".join(file.read_text(encoding="utf-8").split())  # citations across lines
        text = text.replace(" # ", " ")  # comments continued on the next line
        for name, fragment, section in CITATION.findall(text):
            doc = ROOT / "docs" / name
            where = f"{file.relative_to(ROOT)}: docs/{name}"
            if not doc.exists():
                broken.append(f"{where}: no such file")
            elif fragment and fragment not in anchors(doc):
                broken.append(f"{where}#{fragment}: no such heading")
            elif section and not any(h.lower().startswith(section.lower())
                                     for h in headings(doc)):
                broken.append(f"{where}, \"{section}\": no such heading")
    assert not broken, "; ".join(broken)


FILE_PATH = re.compile(r"\b((?:nmt|tests|scripts|configs|docs)/[\w./-]*\w)")
DOTTED = re.compile(r"\bnmt(?:\.\w+)+")
FILE_KINDS = {"json", "yaml", "md", "py", "pt", "txt", "model"}  # nmt.json: a file's name


def named(path: str) -> bool:
    """A file or folder of the repository, or the prefix of some (a corpus prefix such as
    scripts/data/debian-po/en-de/train names train.en.xz and train.de.xz)."""
    where = ROOT / path
    return where.exists() or any(where.parent.glob(where.name + "*"))


def resolves(dotted: str) -> bool:
    """An importable nmt module, or an attribute path inside one (nmt.decoding.core.Decoding)."""
    import importlib

    parts = dotted.split(".")
    if parts[-1] in FILE_KINDS:
        return True
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_and_module_path_named_exists(page):
    """Paths (nmt/serve/batcher.py, scripts/bench_serve.py) and dotted names
    (nmt.decoding.stepping.step_loop) in a page name what the repository holds."""
    text = page.read_text("utf-8")
    missing = sorted({p for p in FILE_PATH.findall(text) if not named(p)}
                     | {d for d in DOTTED.findall(text) if not resolves(d)})
    assert not missing, missing


def headline(label: str) -> str:
    """The figures of docs/results.md's summary row whose first cell starts with `label`."""
    for line in (ROOT / "docs" / "results.md").read_text("utf-8").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and cells[0].startswith(label):
            return cells[1]
    raise AssertionError(f"docs/results.md has no row {label!r}")


def test_the_readmes_figures_are_the_results_summarys():
    """The README's BLEU, the fairseq comparison, the training speed and the demo's score are
    the figures of docs/results.md's summary table (the shipped recipe's, not an older one's)."""
    readme = " ".join((ROOT / "README.md").read_text("utf-8").split())
    shipped = re.search(r"test BLEU ([\d.]+)", headline("20 minutes of the shipped `cpu20`"))
    said = re.search(r"the shipped recipe reaches ([\d.]+) test BLEU", readme)
    assert said and said.group(1) == shipped.group(1)
    before = re.search(r"test BLEU ([\d.]+) .*fairseq[^:]*: ([\d.]+)",
                       headline("20 minutes of training on the full corpus"))
    said = re.search(r"nmt reached ([\d.]+) where fairseq.*? reached ([\d.]+)", readme)
    assert said and said.groups() == before.groups()
    speed = [float(x) for x in re.findall(r"([\d.]+)x", headline("training speed against"))]
    assert f"{min(speed):.2f}-{max(speed):.2f}x as fast as" in readme
    demo = re.search(r"test BLEU ([\d.]+)", headline("demo:")).group(1)
    assert f"nmt-translate: BLEU = {demo} " in readme


def section(doc: str, heading: str) -> str:
    """The text of a page's section, from its heading to the next heading of its level."""
    level = heading.split(" ")[0]
    start = doc.index(heading + "\n")
    end = doc.find("\n" + level + " ", start + len(heading))
    return doc[start:end if end >= 0 else len(doc)]


@pytest.mark.parametrize("label", ["nmt-serve, 32 one-sentence clients",
                                   "nmt-serve, 128 one-sentence clients"])
def test_the_summarys_serving_figures_are_measured_in_their_section(label):
    """Every figure with a decimal point or a % in a serving row of docs/results.md's summary
    is one that the section "Serving throughput" measured (the summary cannot drift from it)."""
    doc = (ROOT / "docs" / "results.md").read_text("utf-8")
    measured = section(doc, "## Serving throughput")
    figures = re.findall(r"\d+\.\d+|\d+%", headline(label))
    assert figures and [f for f in figures if f not in measured] == []


def layout_files() -> list[str]:
    """The files design.md's layout names under nmt/, as paths from the repository root: an
    entry at two spaces is nmt/'s, at four the package's above it (`pkg/` at two spaces);
    `pkg/file` names a package's file directly; continuation lines (deeper) name none."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = text.split("## Layout\n", 1)[1].split("```\n", 2)[1]
    names, package = [], ""
    for line in block.splitlines():
        indent, first = len(line) - len(line.lstrip(" ")), (line.split() or [""])[0]
        if indent == 0 and first != "nmt/" and names:
            break  # configs/, scripts/, ...: outside the package
        if indent == 2:
            package = first if first.endswith("/") else ""
            if not package:
                names.append(f"nmt/{first}")
        elif indent == 4 and package:
            names.append(f"nmt/{package}{first}")
    return names


def test_the_layout_names_every_file_of_the_package_and_only_files_that_exist():
    """design.md's layout has a line for every file under nmt/ (sources, and the page, the
    scripts and the operator's C++ beside them), and every file it names exists."""
    named = layout_files()
    assert len(named) == len(set(named))  # one line each
    files = {str(p.relative_to(ROOT)) for p in (ROOT / "nmt").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert sorted(files - set(named)) == []  # every file has its line
    assert sorted(set(named) - files) == []  # every line names a file
