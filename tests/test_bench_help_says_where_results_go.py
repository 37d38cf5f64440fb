"""Every `embcache bench` command under embcache/bench/ says in --help where its JSON lands and
what --name changes (projection, scaling, tiers printed `--out OUT` and `--name NAME` with no
word), so a user can point a trial run away from the checkout's bench/results/."""
from __future__ import annotations

import argparse
import importlib

import pytest

from embcache.bench.cli import COMMANDS
from embcache.paths import results_dir

OURS = sorted(name for name, (module, _) in COMMANDS.items() if module.startswith("embcache.bench."))


def _options(command: str) -> dict[str, argparse.Action]:
    parser = importlib.import_module(COMMANDS[command][0]).build_parser(f"embcache bench {command}")
    return {opt: action for action in parser._actions for opt in action.option_strings}


@pytest.mark.parametrize("command", OURS)
def test_out_and_name_are_explained(command):
    options = _options(command)
    out, name = options["--out"], options["--name"]
    assert out.default == str(results_dir())
    assert out.help and "results directory" in out.help and str(results_dir()) in out.help, out.help
    assert name.help and ".json" in name.help and name.default in name.help, name.help
