"""`--help` of every command (every benchmark's too) answers without importing torch, torchrec
or numba (27 s under load, 3.6 s quiet, when it did), and shows every option's default."""
from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys

import pytest

from embcache.bench.cli import COMMANDS as BENCHES
from embcache.cli import COMMANDS

HELPS = [[], ["dlrm"], ["dlrm", "train"], ["dlrm", "evaluate"], ["dlrm", "export"], ["face"], ["face", "train"],
         ["face", "evaluate"], ["cf"], ["cf", "train"], ["cf", "evaluate"], ["data"], ["data", "synthetic"],
         ["data", "prepare", "criteo-kaggle"], ["data", "prepare", "ml-100k"], ["data", "info"], ["cache"],
         ["cache", "plan"], ["bench"], *(["bench", name] for name in BENCHES)]
HEAVY = ("torch", "torchrec", "numba", "fbgemm_gpu", "pyarrow")


def test_help_imports_neither_torch_nor_numba():
    code = f"""
import contextlib, io, json, sys
from embcache.cli import main
imported = {{}}
for argv in {HELPS!r}:
    before = set(sys.modules)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main([*argv, "--help"])
        except SystemExit:
            pass
    assert "usage:" in out.getvalue(), argv
    # what this help imported first (a heavy module an earlier one imported is that one's)
    imported[" ".join(argv)] = [m for m in {HEAVY!r} if m in sys.modules and m not in before]
print(json.dumps(imported))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert {k: v for k, v in imported.items() if v} == {}


def _parsers():
    """(command words, parser) of every action of dlrm, face, cf, data and cache."""
    def walk(parser, words):
        yield words, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, [*words, name])

    for name in ("dlrm", "face", "cf", "data", "cache"):
        module = importlib.import_module(COMMANDS[name][0])
        groups = ({f"{name} {k}": v[0] for k, v in module.COMMANDS.items()} if hasattr(module, "COMMANDS")
                  else {name: COMMANDS[name][0]})
        for words, path in groups.items():
            yield from walk(importlib.import_module(path).build_parser(f"embcache {words}"), words.split())


@pytest.mark.parametrize("words,parser", [pytest.param(w, p, id=" ".join(w)) for w, p in _parsers()])
def test_every_option_shows_its_default(words, parser):
    """Each option's help says its default, as "(default: X)" or in its own words; a flag
    (off unless given), a required option and a positional have none to say."""
    formatter = parser._get_formatter()
    missing = []
    for action in parser._actions:
        if (not action.option_strings or action.required or action.nargs == 0
                or isinstance(action, argparse._SubParsersAction)):
            continue
        if "default" not in formatter._format_action(action):
            missing.append(action.option_strings[-1])
    assert missing == []
    text = parser.format_help()
    assert "(default: None)" not in text and "(default: False)" not in text
