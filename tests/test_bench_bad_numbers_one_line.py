"""A benchmark's count, size or ratio that cannot be (0 batches, -5 steps, a cache ratio of 1.5, a
rate of 0) is refused by its parser in one line naming the option, before any work: it used to be
a traceback from deep inside the run (torch.cat of no batches, a division by zero), or worse a run
that printed `nan samples/s` or a hit rate of a zero-sample batch as if measured."""
from __future__ import annotations

import importlib

import pytest

from embcache.bench.cli import COMMANDS

BAD = [
    ("cache", ["--batches", "0"]), ("cache", ["--batches", "-5"]), ("cache", ["--batch-size", "0"]),
    ("cache", ["--ratios", "1.5"]), ("cache", ["--ratios", "-0.1"]), ("cache", ["--scale", "0"]),
    ("cache", ["--burn-in", "1"]), ("cache", ["--warmup-ratio", "2"]), ("cache", ["--timing-steps", "0"]),
    ("cache", ["--dim", "0"]), ("cache", ["--day-batches", "-1"]),
    ("host", ["--steps", "0"]), ("host", ["--threads", "0"]), ("host", ["--ratios", "2"]),
    ("host", ["--scale", "-1"]), ("host", ["--prefetch-depth", "-1"]),
    ("kernels", ["--steps", "0"]), ("kernels", ["--batch-sizes", "0"]), ("kernels", ["--copy-mib", "0"]),
    ("projection", ["--gpus", "0"]), ("projection", ["--rate", "0"]), ("projection", ["--gpus-per-node", "0"]),
    ("projection", ["--nic-gbps", "0"]),
    ("loader", ["d", "--readers", "0"]), ("loader", ["d", "--batches", "0"]), ("loader", ["d", "--repeats", "0"]),
    ("tiers", ["--rows", "0"]), ("tiers", ["--cache-ratio", "0"]), ("tiers", ["--big-gib", "-1"]),
    ("tiers", ["--rounds", "0"]),
    ("scaling", ["--ranks", "0"]), ("scaling", ["--steps", "0"]), ("scaling", ["--repeats", "0"]),
    ("gpu", ["--steps", "0"]), ("gpu", ["--ratios", "0"]), ("gpu", ["--dims", "-16"]), ("gpu", ["--lr", "0"]),
    # face: --classes 0 was a RuntimeError, --repeats 0 an IndexError; dlrm: --steps 0 or --ratios 2 first
    # generated the whole 400k-row data set, then failed in a child
    ("face", ["--classes", "0"]), ("face", ["--classes", "1000", "-5"]), ("face", ["--repeats", "0"]),
    ("face", ["--batch-size", "0"]), ("face", ["--feat-dim", "0"]), ("face", ["--max-gib", "0"]),
    ("face", ["--threads", "0"]), ("face", ["--accuracy-classes", "-1"]), ("face", ["--accuracy-epochs", "0"]),
    ("dlrm", ["--steps", "0"]), ("dlrm", ["--ratios", "2"]), ("dlrm", ["--ratios", "0"]), ("dlrm", ["--rows", "0"]),
    ("dlrm", ["--scale", "0"]), ("dlrm", ["--batch-size", "-1"]), ("dlrm", ["--embedding-dim", "0"]),
    ("cf", ["--datasets", "no-such-set"]), ("cf", ["--ml-epochs", "0"]), ("cf", ["--synthetic-users", "0"]),
]


def _parser(command: str):
    return importlib.import_module(COMMANDS[command][0]).build_parser(f"embcache bench {command}")


@pytest.mark.parametrize("command,argv", BAD, ids=[f"{c} {' '.join(a)}" for c, a in BAD])
def test_refused_in_one_line_naming_the_option(command, argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        _parser(command).parse_args(argv)
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    option = next(a for a in argv if a.startswith("--"))
    assert last.startswith(f"embcache bench {command}: error: argument {option}"), last


@pytest.mark.parametrize("command,argv", [("cache", ["--burn-in", "0", "--day-batches", "0", "--warmup-ratio", "0"]),
                                          ("host", ["--warmup-steps", "0", "--prefetch-depth", "0"]),
                                          ("tiers", ["--big-gib", "0"]), ("gpu", ["--prefetch-depth", "0"]),
                                          ("projection", ["--dense-params", "0"])])
def test_the_documented_zeros_still_parse(command, argv):
    """0 where the help gives it a meaning (no burn-in, no drifting trace, no prefetch, skip part 2)."""
    _parser(command).parse_args(argv)


def test_tiers_fewer_steps_than_rounds_is_one_line(tmp_path, capsys):
    """`bench tiers --steps 1 --rounds 2` was a ZeroDivisionError after building both tables."""
    from embcache.cli import main

    assert main(["bench", "tiers", "--steps", "1", "--rounds", "2", "--rows", "3000", "--dim", "8",
                 "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["embcache bench tiers: error: --steps 1 is fewer than --rounds 2: part 1 splits its batches "
                   "into the rounds, each needs at least one"]
    assert not list(tmp_path.iterdir())
