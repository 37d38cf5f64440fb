"""The documentation holds together: README.md and docs/*.md link only to files (and headings)
that exist, and every command they show names a real `embcache` sub-command or Makefile target.

Each checker is a plain function of the text, and each has a test feeding it a broken link
or an unknown command, so a checker that stopped finding anything would fail too.
"""
from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

from embcache.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...
COMMAND_LANGS = {"bash", "sh", "shell", "console", "shell-session"}


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
    _, blocks = split_fences(text)
    out = []
    for lang, body in blocks:
        if lang not in COMMAND_LANGS and not (
                lang == "" and any(line.lstrip().startswith("embcache ") for line in body)):
            continue
        pending = ""
        for line in body:
            line = line.rstrip()
            if lang in ("console", "shell-session"):
                if not line.lstrip().startswith("$ "):
                    continue  # program output
                line = line.lstrip()[2:]
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            out.append((pending + line).strip())
            pending = ""
    return [line for line in out if line and not line.startswith("#")]


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # unbalanced quotes: words up to a comment
        return line.split("#", 1)[0].split()


def makefile_targets(makefile: Path = ROOT / "Makefile") -> set[str]:
    targets = set()
    for line in makefile.read_text().split("\n"):
        m = re.match(r"^([A-Za-z0-9_][A-Za-z0-9_.\- ]*?)\s*:(?!=)", line)
        if m:
            targets.update(m.group(1).split())
    return targets


def _subparsers(parser: argparse.ArgumentParser):
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def embcache_command_error(args: list[str], commands=COMMANDS, prog: str = "embcache") -> str | None:
    """None when `args` (what follows `embcache`) names a registered command and, where the
    command has actions (`embcache dlrm train`, `embcache bench cache`, `embcache cache plan`),
    one of them; else the message. Modules are loaded as `embcache.cli` loads them: their
    parsers only, no torch."""
    if not args:
        return None
    name, rest = args[0], args[1:]
    if name.startswith("-"):
        return None if name in ("-h", "--help", "--version") else f"{prog}: unknown option {name!r}"
    if name not in commands:
        return f"{prog}: unknown command {name!r} (choose from {', '.join(sorted(commands))})"
    module = importlib.import_module(commands[name][0])
    if hasattr(module, "COMMANDS"):  # a group, dispatched again
        return embcache_command_error(rest, module.COMMANDS, f"{prog} {name}")
    parser, prog = module.build_parser(f"{prog} {name}"), f"{prog} {name}"
    while (sub := _subparsers(parser)) is not None and rest and not rest[0].startswith("-"):
        if rest[0] not in sub.choices:
            return f"{prog}: unknown action {rest[0]!r} (choose from {', '.join(sorted(sub.choices))})"
        parser, prog, rest = sub.choices[rest[0]], f"{prog} {rest[0]}", rest[1:]
    return None


def command_error(line: str, targets: set[str] | None = None) -> str | None:
    """None when a shell line's `embcache ...` (also `python -m embcache ...`, `torchrun ...
    -m embcache ...`, `.venv/bin/embcache ...`) names real sub-commands and its `make ...`
    names Makefile targets; other programs are not checked."""
    words = _words(line)
    if not words:
        return None
    if words[0] == "make":
        targets = makefile_targets() if targets is None else targets
        for word in words[1:]:
            if not word.startswith("-") and "=" not in word and word not in targets:
                return f"make: no target {word!r} in the Makefile (targets: {', '.join(sorted(targets))})"
        return None
    if words[0] == "embcache" or words[0].endswith("/embcache"):
        return embcache_command_error(words[1:])
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == "embcache":
            return embcache_command_error(words[i + 2:])
    return None


# ---------------------------------------------------------------- the documentation itself

def test_every_relative_link_resolves():
    errors = [e for f in DOC_FILES for e in link_errors(f)]
    assert not errors, "\n".join(errors)


def test_every_command_names_a_real_subcommand_or_make_target():
    targets = makefile_targets()
    errors = []
    for f in DOC_FILES:
        for line in command_lines(f.read_text()):
            err = command_error(line, targets)
            if err:
                errors.append(f"{f.relative_to(ROOT)}: {line}\n    {err}")
    assert not errors, "\n".join(errors)


def test_the_checks_see_the_documentation():
    """The checkers find what is there: the docs pages, their links and their commands."""
    assert len(DOC_FILES) >= 10
    all_links = [t for f in DOC_FILES for t in links(f.read_text())]
    assert "docs/cache.md" in all_links and "cache.md#cache-benchmark" in all_links
    assert any(t.endswith(".png") for t in all_links)
    lines = [line for f in DOC_FILES for line in command_lines(f.read_text())]
    assert any(line.startswith("make run") for line in lines)
    assert any(line.startswith("embcache dlrm train") for line in lines)
    assert any(line.startswith("embcache bench cache") for line in lines)
    assert any("-m embcache dlrm train" in line for line in lines)  # torchrun


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
    targets = {"run", "test", "bench"}
    errors = [command_error(line, targets) for line in lines]
    assert errors[0] is None and errors[2] is None
    assert "unknown action 'trian'" in errors[1]
    assert "no target 'runn'" in errors[3]
    assert "embcache bench: unknown command 'cahce'" in errors[4]
    assert "embcache: unknown command 'dlrmm'" in errors[5]
    # the real registry and parsers, every level
    assert embcache_command_error(["cache", "plan", "DIR", "--json"]) is None
    assert embcache_command_error(["data", "prepare", "avazu"]) is None
    assert embcache_command_error(["--help"]) is None
    assert "unknown action" in embcache_command_error(["data", "prepar"])
    assert "unknown command 'plna'" in embcache_command_error(["cache", "plna"])
    assert command_error("python -m embcache bench gpuu") is not None
    assert command_error("python -m pytest -m cuda tests") is None  # not embcache: not checked
    assert {"install", "run", "test", "bench", "clean"} <= makefile_targets()
