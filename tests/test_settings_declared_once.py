"""Every trainer setting is declared once: its config field's `setting(...)` metadata holds
its help, type, bounds and choices, and the command-line flag is made from it
(`embcache.settings_fields`). These checks walk the real parsers, and each is shown to fail
on a deliberately broken small config."""
from __future__ import annotations

import argparse
import dataclasses
import importlib

import pytest

from embcache.arg_types import positive_float, positive_int
from embcache.cli import COMMANDS
from embcache.settings_fields import add_config_arguments, config_values, field_default, flag_dest, setting
from embcache.cf.config import CFTrainConfig
from embcache.dlrm.config import DLRMConfig
from embcache.face.config import FaceConfig

# the commands that build a config from their flags, and its class
BUILDS = {"dlrm train": DLRMConfig, "face train": FaceConfig, "cf train": CFTrainConfig}


def declaration_problems(parser: argparse.ArgumentParser, config_cls: type | None = None) -> list[str]:
    """What is declared twice or away from its field in `parser`: a flag made from a field
    whose help is missing, or whose default, type or choices are not the field's; and, where
    the command builds a `config_cls`, a flag setting one of its fields declared by hand."""
    problems = []
    for action in parser._actions:
        if getattr(action, "config_field", None) is None:
            continue
        cls, name, unset = action.config_field
        f = cls.__dataclass_fields__[name]
        md, option = f.metadata, action.option_strings[-1]
        if not md.get("help") or "{" in (action.help or ""):
            problems.append(f"{option}: {cls.__name__}.{name} has no help of its own")
        default = field_default(f)
        if unset:
            expected = None
        elif isinstance(default, bool):
            expected = False  # a flag: on when given (--name), or off (--no-name) for a field on by default
        else:
            expected = list(default) if isinstance(default, tuple) and md.get("nargs") else default
        if action.default != expected:
            problems.append(f"{option}: the parser's default {action.default!r} is not {cls.__name__}.{name}'s "
                            f"{expected!r}")
        if action.type is not md.get("type") or action.choices != md.get("choices"):
            problems.append(f"{option}: its type or choices are not {cls.__name__}.{name}'s")
    if config_cls is not None:
        dests = {}
        for f in dataclasses.fields(config_cls):
            dests[f.name] = dests[flag_dest(f)] = f.name
        for action in parser._actions:
            if action.option_strings and getattr(action, "config_field", None) is None and action.dest in dests:
                problems.append(f"{action.option_strings[-1]} sets {config_cls.__name__}.{dests[action.dest]} "
                                f"but is declared by hand")
    return problems


def _parsers():
    """(command words, parser) of every action of dlrm, face and cf, of `cache plan` (the
    trainer's settings, predicted), and of the benchmarks."""
    def walk(parser, words):
        yield words, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{words} {name}")

    for name in ("dlrm", "face", "cf"):
        yield from walk(importlib.import_module(COMMANDS[name][0]).build_parser(f"embcache {name}"), name)
    cache = importlib.import_module(COMMANDS["cache"][0])
    for name, (path, _) in cache.COMMANDS.items():
        yield f"cache {name}", importlib.import_module(path).build_parser(f"embcache cache {name}")
    bench = importlib.import_module(COMMANDS["bench"][0])
    for name, (path, _) in bench.COMMANDS.items():
        yield f"bench {name}", importlib.import_module(path).build_parser(f"embcache bench {name}")


PARSERS = dict(_parsers())


@pytest.mark.parametrize("words", sorted(PARSERS))
def test_every_flag_of_a_setting_is_made_from_its_field(words):
    assert declaration_problems(PARSERS[words], BUILDS.get(words)) == []


@pytest.mark.parametrize("words", sorted(BUILDS))
def test_a_command_line_without_flags_is_the_config_s_defaults(words):
    """What the flags default to builds the config's defaults (the fields a checkpoint or the
    data fills in when not given, `unset`, aside)."""
    cls = BUILDS[words]
    parser = PARSERS[words]
    unset = {a.config_field[1] for a in parser._actions if getattr(a, "config_field", None) and a.config_field[2]}
    values = config_values(parser.parse_args([]), cls)
    assert unset <= set(values) and len(values) > 10
    assert cls(**{k: v for k, v in values.items() if k not in unset}) == cls()


def test_the_flags_keep_their_names():
    """Fields whose flags are not `--field-name`, and the shorthands beside them."""
    options = {o for a in PARSERS["dlrm train"]._actions for o in a.option_strings}
    assert {"--lr", "--no-pipeline", "--no-progress", "--no-prefetch", "--prefetch-depth"} <= options
    assert "--sparse-lr" not in options and "--pipeline" not in options
    args = PARSERS["dlrm train"].parse_args(["--lr", "0.2", "--no-pipeline", "--no-progress"])
    values = config_values(args, DLRMConfig)
    assert (values["sparse_lr"], values["pipeline"], values["progress"]) == (0.2, False, False)
    args = PARSERS["cf train"].parse_args(["-k", "10", "20"])
    assert config_values(args, CFTrainConfig)["ks"] == [10, 20]


# --- each check fails where it should: small configs broken on purpose ---

@dataclasses.dataclass
class Toy:
    batch_size: int = setting(64, type=positive_int, help="samples per step")
    lr: float = setting(0.1, type=positive_float, help="learning rate")
    progress: bool = setting(True, flag="--no-progress", help="no progress bar")


def _toy_parser(names=("batch_size", "lr", "progress")) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_config_arguments(p, Toy, names)
    return p


def test_the_toy_passes():
    assert declaration_problems(_toy_parser(), Toy) == []


def test_a_flag_declared_by_hand_beside_its_field_is_found():
    p = _toy_parser(["batch_size", "progress"])
    p.add_argument("--lr", type=float, default=0.1, help="learning rate")  # the same value, declared again
    assert declaration_problems(p, Toy) == ["--lr sets Toy.lr but is declared by hand"]


def test_a_default_that_drifted_from_the_field_is_found():
    p = _toy_parser()
    p.set_defaults(batch_size=128)
    assert declaration_problems(p) == ["--batch-size: the parser's default 128 is not Toy.batch_size's 64"]


def test_a_flag_of_a_field_on_by_default_that_is_not_off_by_default_is_found():
    p = _toy_parser()
    p.set_defaults(no_progress=True)
    assert declaration_problems(p) == ["--no-progress: the parser's default True is not Toy.progress's False"]


def test_a_field_without_help_is_found():
    @dataclasses.dataclass
    class NoHelp:
        dim: int = setting(16, type=positive_int, help="")

    p = argparse.ArgumentParser()
    add_config_arguments(p, NoHelp, ["dim"])
    assert declaration_problems(p) == ["--dim: NoHelp.dim has no help of its own"]


def test_a_type_or_choices_away_from_the_field_are_found():
    p = _toy_parser()
    next(a for a in p._actions if a.dest == "lr").type = float  # no bound: not the field's check
    assert declaration_problems(p) == ["--lr: its type or choices are not Toy.lr's"]


def test_a_field_without_a_flag_cannot_be_made_into_one():
    @dataclasses.dataclass
    class Plain:
        dim: int = 16

    with pytest.raises(TypeError, match="Plain.dim has no flag"):
        add_config_arguments(argparse.ArgumentParser(), Plain, ["dim"])


def test_a_command_line_whose_defaults_differ_from_the_config_is_found():
    @dataclasses.dataclass
    class Drifted:
        dim: int = setting(16, type=positive_int, help="dimension")

    p = argparse.ArgumentParser()
    add_config_arguments(p, Drifted, ["dim"])
    p.set_defaults(dim=32)
    assert Drifted(**config_values(p.parse_args([]), Drifted)) != Drifted()
