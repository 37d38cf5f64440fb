"""The documentation holds together and its code runs as written: README.md and docs/*.md
link only to files (and headings) that exist; every command they show parses with the real
`embcache` sub-command's parser (or names Makefile targets); every ```python block runs, after
the commands before it that make the files it reads (`tests/doc_blocks.py` says how), unless a
`<!-- doc-test: parse-only (reason) -->` line marks it.

Each checker is a plain function of the text, and each has a test feeding it a broken link,
an unknown command or flag, a placeholder, a failing block or a bad marker, so a checker that
stopped finding anything would fail too.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.doc_blocks import (Block, Command, DocBlockError, command_problem, compile_block, fenced_blocks,
                              language_errors, marker_errors, parse_error, placeholder, plan, run_document,
                              shell_commands, words)

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


# ---------------------------------------------------------------- markdown structure

def split_fences(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(prose lines, with fenced blocks blanked out; [(info string, block lines)])."""
    prose, blocks, fence, lang, body = [], [], None, "", []
    for line in text.split("\n"):
        m = _FENCE.match(line)
        if fence is None and m:
            fence, lang, body = m.group(1), m.group(2).lower(), []
            prose.append("")
        elif fence is not None and line.strip().startswith(fence[0] * len(fence)) \
                and not line.strip().strip(fence[0]):
            blocks.append((lang, body))
            fence = None
            prose.append("")
        elif fence is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append(line)
    return prose, blocks


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text without markup, lower case, characters
    other than letters, digits, '_', '-' and spaces dropped, spaces as '-'."""
    text = _INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a markdown text, GitHub's -1, -2 ... for repeats included."""
    seen: dict[str, int] = {}
    out = set()
    prose, _ = split_fences(text)
    for line in prose:
        m = _HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(text: str) -> list[str]:
    """The targets of inline links and images, and of reference definitions, outside code."""
    prose, _ = split_fences(text)
    out = []
    for line in prose:
        m = _REFERENCE.match(line)
        if m:
            out.append(m.group(1))
            continue
        out.extend(_LINK.findall(_INLINE_CODE.sub("", line)))
    return out


def link_errors(md_file: Path, text: str | None = None, root: Path = ROOT) -> list[str]:
    """One message per relative link of `md_file` (or of `text`, read as if it were that
    file) whose file does not exist in `root`, or whose #anchor names no heading of the
    .md file it points into. http(s), mailto and other schemes are not checked."""
    text = md_file.read_text() if text is None else text
    errors = []
    for target in links(text):
        if _EXTERNAL.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        dest = md_file if not path_part else (md_file.parent / path_part).resolve()
        where = f"{md_file.relative_to(root) if md_file.is_relative_to(root) else md_file}: ({target})"
        if not dest.is_relative_to(root.resolve()):
            errors.append(f"{where} leaves the repository")
        elif path_part and not dest.exists():
            errors.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md":
            dest_text = text if dest == md_file else dest.read_text()
            if anchor not in anchors(dest_text):
                errors.append(f"{where}: no heading #{anchor} in {dest.name}")
    return errors


# ---------------------------------------------------------------- commands

def command_lines(text: str) -> list[str]:
    """The command lines of a markdown text's shell blocks (```bash, ```sh, ```console, or an
    unlabelled block with a line starting with `embcache `), continuation lines joined,
    console prompts removed."""
    return [c.text for c in shell_commands(fenced_blocks(text))]


def makefile_targets(makefile: Path = ROOT / "Makefile") -> set[str]:
    targets = set()
    for line in makefile.read_text().split("\n"):
        m = re.match(r"^([A-Za-z0-9_][A-Za-z0-9_.\- ]*?)\s*:(?!=)", line)
        if m:
            targets.update(m.group(1).split())
    return targets


def command_error(line: str, targets: set[str] | None = None) -> str | None:
    """None when a shell line's `embcache ...` (also `python -m embcache ...`, `torchrun ...
    -m embcache ...`, `.venv/bin/embcache ...`) parses with the sub-command's own parser and
    holds no placeholder, and its `make ...` names Makefile targets; other programs are
    checked for placeholders only."""
    line_words = words(line)
    if not line_words:
        return None
    if line_words[0] == "make":
        targets = makefile_targets() if targets is None else targets
        for word in line_words[1:]:
            if not word.startswith("-") and "=" not in word and word not in targets:
                return f"make: no target {word!r} in the Makefile (targets: {', '.join(sorted(targets))})"
        return None
    return command_problem(Command(Block("<text>", "bash", 1, [line], None), 1, line, line_words))


# ---------------------------------------------------------------- the documentation itself

def _doc(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _blocks(path: Path):
    return fenced_blocks(path.read_text(), _doc(path))


RUN_DOCS = [f for f in DOC_FILES if any(b.lang == "python" and not b.parse_only for b in _blocks(f))]
MARKED = [b for f in DOC_FILES for b in _blocks(f) if b.parse_only]


def test_every_relative_link_resolves():
    errors = [e for f in DOC_FILES for e in link_errors(f)]
    assert not errors, "\n".join(errors)


def test_every_command_parses_or_names_a_make_target():
    targets = makefile_targets()
    errors = []
    for f in DOC_FILES:
        for line in command_lines(f.read_text()):
            err = command_error(line, targets)
            if err:
                errors.append(f"{f.relative_to(ROOT)}: {line}\n    {err}")
    assert not errors, "\n".join(errors)


def test_every_block_is_one_the_checks_know():
    """A block in another language (```py, ```pycon) would be neither run nor parsed; a
    malformed marker would leave its block running."""
    errors = [e for f in DOC_FILES for e in language_errors(_blocks(f))]
    errors += [e for f in DOC_FILES for e in marker_errors(f.read_text(), _doc(f))]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("doc", RUN_DOCS, ids=_doc)
def test_python_blocks_run(doc, tmp_path):
    """The document's python blocks, in order and in one namespace, in an empty directory,
    after the commands shown before them that make the files they read."""
    log: list[str] = []
    began = time.perf_counter()
    run_document(doc.read_text(), _doc(doc), tmp_path, log)
    print(f"{_doc(doc)}: {time.perf_counter() - began:.1f} s\n  " + "\n  ".join(log))
    assert any(line.startswith("exec ") for line in log)


@pytest.mark.parametrize("block", MARKED or [None], ids=lambda b: b.where if b else "none")
def test_parse_only_blocks_parse(block):
    """A marked block still compiles (python) or parses (its commands); then it is skipped
    with its marker's reason."""
    if block is None:
        return  # nothing is marked
    if block.lang == "python":
        compile_block(block)
    else:
        problems = [f"{c.where}: {p}" for c in shell_commands([block]) if (p := command_problem(c))]
        assert not problems, "\n".join(problems)
    pytest.skip(f"parse-only ({block.parse_only})")


def test_the_checks_see_the_documentation():
    """The checkers find what is there: the docs pages, their links, commands and blocks."""
    assert len(DOC_FILES) >= 10
    all_links = [t for f in DOC_FILES for t in links(f.read_text())]
    assert "docs/cache.md" in all_links and "cache.md#cache-benchmark" in all_links
    assert any(t.endswith(".png") for t in all_links)
    lines = [line for f in DOC_FILES for line in command_lines(f.read_text())]
    assert any(line.startswith("make run") for line in lines)
    assert any(line.startswith("embcache dlrm train") for line in lines)
    assert any(line.startswith("embcache bench cache") for line in lines)
    assert any("-m embcache dlrm train" in line for line in lines)  # torchrun
    assert {_doc(f) for f in RUN_DOCS} >= {"README.md", "docs/cache.md", "docs/export.md", "docs/heat.md",
                                          "docs/open-vocabularies.md"}
    assert len(MARKED) <= 3, [b.where for b in MARKED]  # markers are for what cannot run here at all
    # the export example runs the commands that make its export, from the data it reads
    steps = [(step, item.text if step == "run" else item.where)
             for step, item in plan(_blocks(ROOT / "docs" / "export.md"))]
    ran = [text for step, text in steps if step == "run"]
    assert [text.split()[:3] for text in ran] == [["embcache", "data", "synthetic"], ["embcache", "dlrm", "train"],
                                                  ["embcache", "dlrm", "export"], ["embcache", "dlrm", "export"]]
    assert steps[-1][0] == "exec"


def test_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert readme.count("\n") < 300
    assert "make run" in readme and "make test" in readme
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"


# ---------------------------------------------------------------- the checkers can fail

def test_github_slugs():
    assert github_slug("On a GPU: the device path") == "on-a-gpu-the-device-path"
    assert github_slug("The host's ceiling") == "the-hosts-ceiling"
    assert github_slug("HEAT: collaborative filtering on CPU cores") == "heat-collaborative-filtering-on-cpu-cores"
    assert github_slug("Face-head benchmark") == "face-head-benchmark"
    assert github_slug("`embcache cache plan` and [the model](x.md)") == "embcache-cache-plan-and-the-model"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n## B") == {"a", "a-1", "b"}


def test_link_checker_finds_broken_links(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## A section: here\n")
    (tmp_path / "pic.png").write_bytes(b"")
    page = tmp_path / "docs" / "page.md"
    good = ("# Page\n[o](other.md) [s](other.md#a-section-here) [self](#page) ![p](../pic.png)\n"
            "[web](https://example.com/nope.md) [mail](mailto:a@b.c) `[code](missing.md)`\n"
            "```\n[in a block](missing.md)\n```\n[ref]: other.md\n")
    assert link_errors(page, good, root=tmp_path) == []
    bad = ("# Page\n[gone](gone.md) [anchor](other.md#no-such-section) [self](#nowhere)\n"
           "![p](pic.png) [out](../../outside.md)\n[ref]: missing/\n")
    errors = link_errors(page, bad, root=tmp_path)
    assert len(errors) == 6, errors
    assert "(gone.md): no such file" in errors[0]
    assert "no heading #no-such-section in other.md" in errors[1]
    assert "no heading #nowhere in page.md" in errors[2]
    assert "(pic.png): no such file" in errors[3]  # relative to docs/, not the root
    assert "leaves the repository" in errors[4]
    assert "(missing/): no such file" in errors[5]


def test_command_checker_finds_unknown_commands():
    text = ("```bash\nembcache dlrm train --cache-ratio 0.005   # a comment\n"
            "torchrun --standalone --nproc-per-node 2 \\\n    -m embcache dlrm trian --resume\n"
            "# a comment line\nmake run RUN_ARGS=--overwrite\nmake runn\n```\n"
            "```console\n$ embcache bench cahce\nsome output\n```\n"
            "```\nembcache dlrmm train\n```\n"
            "```python\nembcache = 1\n```\n"
            "```\nembcache/cache/   not a command block unless a line starts with `embcache `\n```\n")
    lines = command_lines(text)
    assert lines == ["embcache dlrm train --cache-ratio 0.005   # a comment",
                     "torchrun --standalone --nproc-per-node 2      -m embcache dlrm trian --resume",
                     "make run RUN_ARGS=--overwrite", "make runn", "embcache bench cahce",
                     "embcache dlrmm train"]
    assert [c.line for c in shell_commands(fenced_blocks(text))] == [2, 3, 6, 7, 10, 14]
    targets = {"run", "test", "bench"}
    errors = [command_error(line, targets) for line in lines]
    assert errors[0] is None and errors[2] is None
    assert "invalid choice: 'trian'" in errors[1]
    assert "no target 'runn'" in errors[3]
    assert "embcache bench: unknown command 'cahce'" in errors[4]
    assert "embcache: unknown command 'dlrmm'" in errors[5]
    # the real registry and parsers, every level
    assert parse_error(["cache", "plan", "datasets/x", "--json"]) is None
    assert parse_error(["data", "prepare", "avazu", "--input", "train.csv", "--out", "datasets/avazu"]) is None
    assert parse_error(["--help"]) is None and parse_error(["dlrm", "train", "--help"]) is None
    assert "invalid choice: 'prepar'" in parse_error(["data", "prepar"])
    assert "unknown command 'plna'" in parse_error(["cache", "plna"])
    assert "no action given" in parse_error(["dlrm"])
    assert command_error("python -m embcache bench gpuu") is not None
    assert command_error("python -m pytest -m cuda tests") is None  # not embcache: not checked
    assert {"install", "run", "test", "bench", "clean"} <= makefile_targets()


def test_command_checker_finds_renamed_flags_and_placeholders():
    """A flag renamed or a choice gone fails, wherever the line is (torchrun's too); so does a
    value of the wrong type, a missing required argument, or a placeholder."""
    assert command_error("embcache dlrm train --data datasets/syn --max-steps 20 --eviction lru") is None
    assert "unrecognized arguments: --max-stepz 20" in command_error("embcache dlrm train --max-stepz 20")
    assert "invalid choice: 'lfuu'" in command_error(".venv/bin/embcache dlrm train --eviction lfuu")
    assert "'x' is not an integer" in command_error("embcache dlrm train --max-steps x")
    assert "unrecognized arguments: --nprocs 2" in command_error(
        "torchrun --standalone --nproc-per-node 2 -m embcache face train --nprocs 2")
    assert "required: --input" in command_error("embcache data prepare avazu --out datasets/avazu")
    assert "required: MODEL" in command_error("embcache cf recommend --users u1")
    assert "unrecognized arguments" in command_error("embcache bench cache --batchez 600")
    assert "'DIR' is a placeholder" in command_error("embcache cache plan DIR --json")
    assert "'<file>' is a placeholder" in command_error("embcache dlrm predict runs/x --input <file> --out s.csv")
    assert "'...' is a placeholder" in command_error("embcache cf recommend model.npz --users u1 ...")
    assert "placeholder" in command_error("bash bench/device_check.sh STEPS")  # any program
    assert placeholder(["SMALL=1", "bash", "bench/device_check.sh", "cuda"]) is None
    assert placeholder(["embcache", "cache", "plan", "x", "--device-memory", "24 GiB"]) is None


def test_markers_and_block_languages():
    text = ("# Page\n\n<!-- doc-test: parse-only (needs a CUDA GPU) -->\n```python\nx = 1\n```\n"
            "```python\ny = 2\n```\n<!-- doc-test: parse-only (torchrun: 2 processes) -->\n"
            "```bash\nembcache dlrm train --data datasets/syn --checkpoint-dir runs/x\n```\n")
    blocks = fenced_blocks(text, "page.md")
    assert [(b.lang, b.line, b.parse_only) for b in blocks] == [
        ("python", 5, "needs a CUDA GPU"), ("python", 8, None), ("bash", 12, "torchrun: 2 processes")]
    assert marker_errors(text, "page.md") == [] and language_errors(blocks) == []
    assert language_errors(fenced_blocks("```py\nx = 1\n```\n```pycon\n>>> 1\n```\n```text\nout\n```\n", "p.md")) == [
        "p.md:2: a ```py block: use ```python, ```bash, or an unlabelled block for output",
        "p.md:5: a ```pycon block: use ```python, ```bash, or an unlabelled block for output"]
    bad = ("<!-- doc-test: skip -->\n```python\nx = 1\n```\n"
           "<!-- doc-test: parse-only () -->\n```python\n```\n"
           "<!-- doc-test: parse-only (a reason) -->\n\n```python\n```\n")
    errors = marker_errors(bad, "page.md")
    assert len(errors) == 3, errors
    assert errors[0].startswith("page.md:1: a doc-test marker reads")
    assert errors[1].startswith("page.md:5: a doc-test marker reads")
    assert errors[2] == "page.md:8: a doc-test marker goes on the line right before a block's fence"
    # a marked python block is compiled, not run; a marked shell block is never run
    steps = [(s, i.where) for s, i in plan(blocks)]
    assert steps == [("compile", "page.md:5"), ("exec", "page.md:8")]


def test_plan_runs_what_a_block_reads_first():
    """The commands making a block's files and their inputs, in document order; no others."""
    text = ("```bash\n"
            "embcache data synthetic --out datasets/syn --rows 2000\n"         # 2: the export's data
            "embcache data synthetic --out datasets/other\n"                   # 3: nothing reads it
            "embcache dlrm train --data datasets/syn --checkpoint-dir runs/d\n"  # 4: the export reads runs/d
            "embcache bench cache\n"                                          # 5: makes nothing
            "torchrun --nproc-per-node 2 -m embcache dlrm train --checkpoint-dir runs/t\n"  # 6: never run
            "embcache dlrm export runs/d --out runs/e\n"                       # 7
            "```\n```python\nprint(open('runs/e/manifest.json').read())\n```\n"
            "```bash\nembcache dlrm export runs/d --out runs/e2\n```\n"
            "```python\nimport os\nos.listdir('runs/t')\n```\n")
    steps = [(s, i.where) for s, i in plan(fenced_blocks(text, "page.md"))]
    assert steps == [("run", "page.md:2"), ("run", "page.md:4"), ("run", "page.md:7"), ("exec", "page.md:10"),
                     ("exec", "page.md:16")]  # runs/e2 is not read; torchrun's runs/t is not made here


def test_a_failing_block_fails_naming_its_line(tmp_path):
    text = "# Page\n\n```python\nx = 1\n```\n\ntext\n\n```python\ny = x + 1\nz = undefined_name\n```\n"
    with pytest.raises(DocBlockError, match=r"page\.md:10: the python block failed: NameError") as caught:
        run_document(text, "page.md", tmp_path)
    # the traceback points at the markdown's own line
    assert caught.value.__cause__.__traceback__.tb_next.tb_lineno == 11
    with pytest.raises(DocBlockError, match=r"page\.md:5: the python block does not compile"):  # before x = 1 runs
        run_document("\n\n```python\nx = 1\nif x\n```\n", "page.md", tmp_path)
    # blocks share a namespace and run in the working directory given
    ns = run_document("```python\nopen('f.txt', 'w').write('a')\n```\n```python\nn = len(open('f.txt').read())\n```\n",
                      "page.md", tmp_path)
    assert ns["n"] == 1 and (tmp_path / "f.txt").exists()
    # every command line is parsed before anything runs
    with pytest.raises(DocBlockError, match="page.md:2: embcache data synthetic --outt x\n.*required: --out"):
        run_document("```bash\nembcache data synthetic --outt x\n```\n```python\nx = 1\n```\n", "page.md", tmp_path)
    with pytest.raises(DocBlockError, match="doc-test marker"):
        run_document("<!-- doc-test: parse-only -->\n```python\nx = 1\n```\n", "page.md", tmp_path)


def test_a_failing_command_fails_naming_its_line(tmp_path):
    """A command a block needs runs for real; its failure names the line and shows its error."""
    text = ("```bash\nembcache cf recommend model.npz --users u1 --out recs.csv\n```\n"
            "```python\nopen('recs.csv').read()\n```\n")
    with pytest.raises(DocBlockError, match=r"(?s)page\.md:2: `embcache cf recommend.*` exited 1:.*model\.npz"):
        run_document(text, "page.md", tmp_path)
