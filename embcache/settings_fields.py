"""Settings declared once: a config dataclass's field carries its command-line flag (help,
type and bounds, choices, metavar, the flag's name where it is not the field's) in its
`metadata`, written with `setting(...)`; `add_config_arguments` makes the flags of a
command from those fields, `config_values` reads a parsed command line back into field
values, and `option_names` names a field as the user types it. Light on purpose: no
torch import, so `--help` stays instant.

Example:
    >>> import argparse
    >>> from dataclasses import dataclass
    >>> from embcache.arg_types import positive_float, positive_int
    >>> @dataclass
    ... class Toy:
    ...     batch_size: int = setting(64, type=positive_int, help="samples per step")
    ...     sparse_lr: float = setting(0.05, flag="--lr", type=positive_float, help="learning rate of the embeddings")
    ...     progress: bool = setting(True, flag="--no-progress", help="no progress bar")
    >>> p = argparse.ArgumentParser()
    >>> _ = add_config_arguments(p, Toy, ["batch_size", "sparse_lr", "progress"])
    >>> Toy(**config_values(p.parse_args(["--lr", "0.1", "--no-progress"]), Toy))
    Toy(batch_size=64, sparse_lr=0.1, progress=False)
    >>> option_names(Toy, ["sparse_lr", "batch_size"])
    {'sparse_lr': '--lr', 'batch_size': '--batch-size'}
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Iterable

_KEYS = ("help", "type", "flag", "choices", "metavar", "nargs", "exclusive")


def setting(default: Any = dataclasses.MISSING, *, help: str, default_factory: Any = dataclasses.MISSING,
            type: Callable[[str], Any] | None = None, flag: str | tuple[str, ...] | None = None,
            choices: Iterable | None = None, metavar: str | None = None, nargs: str | int | None = None,
            exclusive: str | None = None) -> Any:
    """A dataclass field that is also a command-line flag.

    Args:
        default, default_factory: the field's default (as `dataclasses.field`); the flag's too.
        help: what the setting does, as `--help` shows it. It may name `{default}` (the
            field's default) and the placeholders the command passes as `context` to
            `add_config_arguments` (`{kind}`, `{cores}`, ...); "%" is written "%%".
        type: an `embcache.arg_types` checker (argparse's one-line error for a bad value).
        flag: the option string(s), where not `--field-name`. A bool field defaulting to
            True is switched off by a flag named `--no-...`; one defaulting to False is
            switched on by its flag.
        choices, metavar, nargs: as argparse's.
        exclusive: fields with the same key are mutually exclusive on a command line.
    """
    metadata = {"help": help, "type": type, "flag": flag, "choices": None if choices is None else tuple(choices),
                "metavar": metavar, "nargs": nargs, "exclusive": exclusive}
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={k: v for k, v in metadata.items() if v is not None})


def inherit(cls: type, name: str, default: Any = dataclasses.MISSING, **changes) -> Any:
    """The field `name` of the config class `cls` again, for a subclass that changes its
    default or some of its flag's metadata (`help=...`, `type=...`): the rest is `cls`'s."""
    base = _field(cls, name)
    if default is dataclasses.MISSING and base.default_factory is dataclasses.MISSING:
        default = base.default
    unknown = set(changes) - set(_KEYS)
    if unknown:
        raise TypeError(f"inherit: unknown metadata {sorted(unknown)}")
    return dataclasses.field(default=default, default_factory=base.default_factory if default is dataclasses.MISSING
                             else dataclasses.MISSING, metadata={**base.metadata, **changes})


def has_flag(f: dataclasses.Field) -> bool:
    """Whether the field is declared with `setting` (has a flag)."""
    return "help" in f.metadata


def field_default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def option_strings(f: dataclasses.Field) -> tuple[str, ...]:
    """The field's option strings: its `flag`, else `--field-name`."""
    flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
    return (flag,) if isinstance(flag, str) else tuple(flag)


def negated(f: dataclasses.Field) -> bool:
    """A bool field that is on by default, switched off by its `--no-...` flag."""
    return field_default(f) is True


def flag_dest(f: dataclasses.Field) -> str:
    """Where argparse keeps the field's flag: as argparse names it, after the first long
    option string (`--no-progress` -> `no_progress`, `-k/--k` -> `k`)."""
    names = option_strings(f)
    long = next((n for n in names if n.startswith("--")), names[0])
    return long.lstrip("-").replace("-", "_")


def add_config_arguments(parser, cls: type, names: Iterable[str], *, unset: Iterable[str] = (),
                         unset_note: str = "(default: {default})", context: dict | None = None) -> dict:
    """Add the flags of `cls`'s fields `names` to `parser`, in that order, each from its
    field's `setting` metadata; returns the mutually exclusive groups made, by key, so that
    a command can add a flag of its own to one (`--no-prefetch`).

    Args:
        unset: fields whose flag defaults to None, for a value that comes from elsewhere when
            the flag is not given (a checkpoint, a saved file), else from the field; their
            help gets `unset_note` (with `{default}`) unless it speaks of its default.
        context: values of the help texts' placeholders besides `{default}` (`{cores}`, the
            cores this process may use, is filled in by itself).
    """
    unset = set(unset)
    groups: dict[str, Any] = {}
    for name in names:
        f = _field(cls, name)
        md = f.metadata
        if not has_flag(f):
            raise TypeError(f"{cls.__name__}.{name} has no flag: declare it with setting(...)")
        default = field_default(f)
        text = md["help"].format_map(_HelpContext(context or {}, default=_shown(default)))
        kwargs: dict[str, Any] = {"help": text}
        if isinstance(default, bool):
            if negated(f) and not option_strings(f)[0].startswith("--no-"):
                raise TypeError(f"{cls.__name__}.{name} is on by default: its flag must be --no-...")
            kwargs["action"] = "store_true"
        else:
            kwargs["default"] = list(default) if isinstance(default, tuple) and md.get("nargs") else default
            for key in ("type", "choices", "metavar", "nargs"):
                if key in md:
                    kwargs[key] = md[key]
        if name in unset:
            kwargs["default"] = None
            if "default" not in text:
                kwargs["help"] = f"{text} {unset_note.format(default=_shown(default))}"
        where = parser
        if "exclusive" in md:
            if md["exclusive"] not in groups:
                groups[md["exclusive"]] = parser.add_mutually_exclusive_group()
            where = groups[md["exclusive"]]
        action = where.add_argument(*option_strings(f), dest=flag_dest(f), **kwargs)
        action.config_field = (cls, name, name in unset)  # what `tests/test_settings_declared_once.py` checks
    return groups


def config_values(args: argparse.Namespace, cls: type) -> dict:
    """The values of `cls`'s fields that `args` has flags for, under the field names (a
    `--no-...` flag read as the field it switches off)."""
    values = {}
    for f in dataclasses.fields(cls):
        if has_flag(f) and hasattr(args, flag_dest(f)):
            value = getattr(args, flag_dest(f))
            values[f.name] = (not value) if negated(f) else value
    return values


def option_names(cls: type, names: Iterable[str]) -> dict[str, str]:
    """Field -> the option a user types for it, for messages in their words (a field
    without a flag keeps its own name)."""
    out = {}
    for name in names:
        f = _field(cls, name)
        out[name] = next((o for o in option_strings(f) if o.startswith("--")), option_strings(f)[0]) \
            if has_flag(f) else name
    return out


def _field(cls: type, name: str) -> dataclasses.Field:
    try:
        return cls.__dataclass_fields__[name]
    except (AttributeError, KeyError):
        raise TypeError(f"{getattr(cls, '__name__', cls)} has no field {name!r}") from None


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


class _HelpContext(dict):
    """Placeholders of a help text: the command's, and `{cores}` worked out when named."""

    def __missing__(self, key: str) -> Any:
        if key == "cores":
            from embcache.threads import usable_cores

            return usable_cores()
        raise KeyError(f"a help text names {{{key}}}, which the command gives no value")
