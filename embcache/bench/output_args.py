"""--out and --name, said alike by every benchmark's --help: where its JSON lands, so that a
trial run can be pointed away from the checkout's bench/results/. Light: no torch import."""
from __future__ import annotations

import argparse

from embcache.paths import results_dir


def add_output_arguments(p: argparse.ArgumentParser, name: str) -> None:
    out = results_dir()
    p.add_argument("--out", default=str(out), help=f"results directory (default: {out})")
    p.add_argument("--name", default=name, help=f"results file stem: writes <--out>/<--name>.json (default: {name})")
