"""The code blocks of the markdown documentation: found with their line numbers, parsed, run.

- A ```python block runs. The python blocks of one document share one namespace and run in
  order, in a working directory of their own.
- Before a python block, the `embcache ...` commands shown earlier in the same document that
  make the files it names run as subprocesses (`python -m embcache ...`, in document order):
  a command makes the paths after its `--out`, `--save` and `--checkpoint-dir`, and a python
  block names a path as a string literal ("runs/dlrm-export"). A command that runs brings in
  the earlier commands that make its own inputs (`dlrm export runs/dlrm` the `dlrm train
  --checkpoint-dir runs/dlrm` before it), so what a reader would have to run first runs first.
- Every `embcache` command line (run or not) is parsed by its sub-command's own argparse
  parser: a renamed flag or a lost choice fails. A placeholder (`...`, `<file>`, `DIR`) fails
  too: a line in the docs is one a reader can paste.
- A block whose fence is preceded by the line `<!-- doc-test: parse-only (REASON) -->` is
  parsed (compiled, or its commands parsed) but never run; the reason is the skip reason.
  For what cannot run here at all: a GPU, several processes, the network, hours.
"""
from __future__ import annotations

import ast
import contextlib
import importlib
import io
import linecache
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from embcache.cli import COMMANDS

COMMAND_LANGS = {"bash", "sh", "shell", "console", "shell-session"}
TEXT_LANGS = {"", "text"}  # shown, not run: program output, a file tree
KNOWN_LANGS = COMMAND_LANGS | TEXT_LANGS | {"python"}
OUTPUT_FLAGS = ("--out", "--save", "--checkpoint-dir")  # what a command makes
COMMAND_TIMEOUT_S = 600

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
_MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
_PARSE_ONLY = re.compile(r"^parse-only \((.+)\)$")
_PLACEHOLDER = re.compile(r"\.\.\.|^<[^<>]*>$|^[A-Z][A-Z0-9_]*$")


class DocBlockError(AssertionError):
    """A block of the documentation that does not parse or does not run; the message
    names the document and line."""


@dataclass
class Block:
    doc: str                 # the document, as messages name it (docs/export.md)
    lang: str
    line: int                # the line of the block's first body line, 1-based
    lines: list[str]
    parse_only: str | None   # the marker's reason, or None: the block runs

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass(eq=False)
class Command:
    block: Block
    line: int                # where the command starts
    text: str                # continuation lines joined, console prompt removed
    words: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.block.doc}:{self.line}"

    @property
    def args(self) -> list[str] | None:
        """What follows `embcache` on an `embcache` line (also `.venv/bin/embcache`, `python -m
        embcache`, `torchrun ... -m embcache`); None for other programs."""
        return embcache_args(self.words)

    @property
    def runnable(self) -> bool:
        """An `embcache` command this process can run as it is written (not torchrun's)."""
        w = self.words
        return self.args is not None and not self.block.parse_only and (
            w[0] == "embcache" or w[0].endswith("/embcache") or (w[0].split("/")[-1].startswith("python")))


# ---------------------------------------------------------------- finding blocks

def fenced_blocks(text: str, doc: str = "<text>") -> list[Block]:
    """Every fenced block of a markdown text, with the line it starts on and the reason of
    its `<!-- doc-test: parse-only (REASON) -->` marker (the line before the fence)."""
    blocks, fence, start, lang, body, reason = [], None, 0, "", [], None
    previous = ""
    for number, line in enumerate(text.split("\n"), 1):
        m = _FENCE.match(line)
        if fence is None and m:
            fence, lang, body, start = m.group(1), m.group(2).lower(), [], number + 1
            marker = _MARKER.match(previous)
            reason = None
            if marker:
                parse_only = _PARSE_ONLY.match(marker.group(1))
                reason = parse_only.group(1).strip() if parse_only else None
        elif fence is not None and line.strip().startswith(fence[0] * len(fence)) \
                and not line.strip().strip(fence[0]):
            blocks.append(Block(doc, lang, start, body, reason))
            fence = None
        elif fence is not None:
            body.append(line)
        previous = line
    return blocks


def marker_errors(text: str, doc: str = "<text>") -> list[str]:
    """One message per `doc-test` marker that is not `<!-- doc-test: parse-only (REASON) -->`
    on the line right before a fence."""
    lines = text.split("\n")
    errors = []
    for i, line in enumerate(lines):
        if "doc-test" not in line:
            continue
        m = _MARKER.match(line)
        where = f"{doc}:{i + 1}"
        if not m or not _PARSE_ONLY.match(m.group(1)):
            errors.append(f"{where}: a doc-test marker reads `<!-- doc-test: parse-only (the reason) -->`, "
                          f"got {line.strip()!r}")
        elif i + 1 >= len(lines) or not _FENCE.match(lines[i + 1]):
            errors.append(f"{where}: a doc-test marker goes on the line right before a block's fence")
    return errors


def language_errors(blocks: list[Block]) -> list[str]:
    """One message per block in a language the checks neither run nor parse (```py, ```pycon)."""
    return [f"{b.where}: a ```{b.lang} block: use ```python, ```bash, or an unlabelled block for output"
            for b in blocks if b.lang not in KNOWN_LANGS]


def shell_commands(blocks: list[Block]) -> list[Command]:
    """The command lines of the shell blocks (```bash, ```sh, ```console, or an unlabelled
    block with a line starting with `embcache `), continuation lines joined, console
    prompts removed, comment lines left out."""
    out = []
    for block in blocks:
        lang, body = block.lang, block.lines
        if lang not in COMMAND_LANGS and not (
                lang == "" and any(line.lstrip().startswith("embcache ") for line in body)):
            continue
        pending, first = "", None
        for number, line in enumerate(body, block.line):
            line = line.rstrip()
            if lang in ("console", "shell-session"):
                if not line.lstrip().startswith("$ "):
                    continue  # program output
                line = line.lstrip()[2:]
            first = number if first is None else first
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            text = (pending + line).strip()
            if text and not text.startswith("#"):
                out.append(Command(block, first, text, words(text)))
            pending, first = "", None
    return out


def words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # unbalanced quotes: words up to a comment
        return line.split("#", 1)[0].split()


def embcache_args(words: list[str]) -> list[str] | None:
    if not words:
        return None
    if words[0] == "embcache" or words[0].endswith("/embcache"):
        return words[1:]
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == "embcache":
            return words[i + 2:]
    return None


# ---------------------------------------------------------------- parsing commands

def parse_error(args: list[str], commands=COMMANDS, prog: str = "embcache") -> str | None:
    """None when `args` (what follows `embcache`) parses with the real parsers: the
    registered command (a group such as `bench` dispatched again, as `embcache.cli` does),
    then its module's `build_parser` parses the rest: actions, flags, their values and
    choices. Else argparse's message (or the dispatcher's, for an unknown command)."""
    if not args:
        return None
    name, rest = args[0], args[1:]
    if name.startswith("-"):
        return None if name in ("-h", "--help", "--version") else f"{prog}: unknown option {name!r}"
    if name not in commands:
        return f"{prog}: unknown command {name!r} (choose from {', '.join(sorted(commands))})"
    module = importlib.import_module(commands[name][0])
    if hasattr(module, "COMMANDS"):  # a group, dispatched again
        return parse_error(rest, module.COMMANDS, f"{prog} {name}")
    parser = module.build_parser(f"{prog} {name}")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parsed = parser.parse_args(rest)
    except SystemExit as stop:
        if stop.code in (0, None):
            return None  # --help
        lines = err.getvalue().strip().split("\n")
        return lines[-1] if lines and lines[-1] else f"{prog} {name}: exit {stop.code}"
    if not hasattr(parsed, "func"):  # `embcache dlrm` alone: the command prints its help and fails
        return f"{prog} {name}: no action given"
    return None


def placeholder(words: list[str]) -> str | None:
    """The first word that stands for something to fill in (`...`, `<file>`, `DIR`), or None.
    Environment assignments (`SMALL=1`) and flags are not placeholders."""
    for word in words:
        if "=" in word or word.startswith("-"):
            continue
        if _PLACEHOLDER.search(word):
            return word
    return None


def command_problem(command: Command) -> str | None:
    """None when the line has no placeholder and, for `embcache`, parses."""
    word = placeholder(command.words)
    if word is not None:
        return f"{word!r} is a placeholder: show a command a reader can run as written"
    args = command.args
    return None if args is None else parse_error(args)


# ---------------------------------------------------------------- what runs before a block

def _norm(path: str) -> str:
    return os.path.normpath(path.split(":", 1)[1] if path.startswith("mmap:") else path)


def _same_tree(a: str, b: str) -> bool:
    a, b = _norm(a), _norm(b)
    return a == b or a.startswith(b + os.sep) or b.startswith(a + os.sep)


def outputs(args: list[str]) -> list[str]:
    """The paths a command makes: the values of --out, --save, --checkpoint-dir."""
    out = []
    for i, word in enumerate(args):
        flag, eq, value = word.partition("=")
        if flag in OUTPUT_FLAGS:
            if eq:
                out.append(value)
            elif i + 1 < len(args):
                out.append(args[i + 1])
    return out


def inputs(args: list[str]) -> list[str]:
    """Every other word of a command that is not a flag: the paths it may read."""
    made = outputs(args)
    out = []
    for word in args:
        value = word.partition("=")[2] if word.startswith("--") else word
        if value and not value.startswith("-") and value not in made:
            out.append(value)
    return out


def string_literals(source: str) -> set[str]:
    """The string constants of python source (none where it does not parse: compiling it says why)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def plan(blocks: list[Block]) -> list[tuple[str, Block | Command]]:
    """The steps of a document in order: ("run", command) for each command a later python
    block needs, ("exec", block) for a python block that runs, ("compile", block) for a
    marked one. Commands nothing needs are left out (they are parsed, not run)."""
    steps: list[tuple[str, Block | Command]] = []
    pending: list[Command] = []
    for block in blocks:
        if block.lang != "python":
            pending += [c for c in shell_commands([block]) if c.runnable]
            continue
        if block.parse_only:
            steps.append(("compile", block))
            continue
        wanted = string_literals("\n".join(block.lines))
        chosen = []
        for command in reversed(pending):  # later commands first: what they read, earlier ones make
            if any(_same_tree(o, w) for o in outputs(command.args) for w in wanted):
                chosen.append(command)
                wanted |= set(inputs(command.args))
        for command in reversed(chosen):
            steps.append(("run", command))
            pending.remove(command)
        steps.append(("exec", block))
    return steps


# ---------------------------------------------------------------- running

def run_command(command: Command, cwd: Path) -> str:
    """Runs an `embcache` line as `python -m embcache ARGS` in `cwd`; its output, or
    DocBlockError naming the line with the end of its output."""
    argv = [sys.executable, "-m", "embcache", *command.args]
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise DocBlockError(f"{command.where}: `{command.text}` ran past {COMMAND_TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = (done.stdout[-1500:] + "\n" + done.stderr[-3000:]).strip()
        raise DocBlockError(f"{command.where}: `{command.text}` exited {done.returncode}:\n{tail}")
    return done.stdout


def compile_block(block: Block, text: str | None = None):
    """The block as a code object whose line numbers are the document's (a traceback shows
    the markdown's own lines); a syntax error is DocBlockError naming the line."""
    filename = block.doc
    if text is not None:
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    source = "\n" * (block.line - 1) + "\n".join(block.lines) + "\n"
    try:
        return compile(source, filename, "exec")
    except SyntaxError as err:
        raise DocBlockError(f"{block.doc}:{err.lineno}: the python block does not compile: {err.msg}") from None


def run_document(text: str, doc: str, workdir: Path, log: list[str] | None = None) -> dict:
    """Runs a document's python blocks (and the commands they need first) in `workdir`, in
    one namespace; returns the namespace. Every command line is parsed first. `log` gets
    one line per step."""
    blocks = fenced_blocks(text, doc)
    problems = marker_errors(text, doc) + [f"{c.where}: {c.text}\n    {p}" for c in shell_commands(blocks)
                                           if (p := command_problem(c))]
    if problems:
        raise DocBlockError("\n".join(problems))
    code = {id(b): compile_block(b, text) for b in blocks if b.lang == "python"}  # every block, before any runs
    log = [] if log is None else log
    namespace: dict = {"__name__": "__main__"}  # as a reader runs it
    here = os.getcwd()
    os.chdir(workdir)
    try:
        for step, item in plan(blocks):
            if step == "run":
                log.append(f"run  {item.where}: {item.text}")
                run_command(item, workdir)
                continue
            if step == "compile":
                log.append(f"parse-only {item.where} ({item.parse_only})")
                continue
            log.append(f"exec {item.where}")
            try:
                exec(code[id(item)], namespace)
            except Exception as err:
                raise DocBlockError(f"{item.where}: the python block failed: {type(err).__name__}: {err}") from err
    finally:
        os.chdir(here)
    return namespace
