"""Where a run's checkpoint is and what it records, for the run skeleton (`run`) and the
commands that read a checkpoint (evaluate, export, embed): the file a path names, what a
directory's run would lose if started afresh, whether it can take checkpoints at all, a
checkpoint's settings as a config (settings added since take the value they had in effect),
and the phrases that refuse a resume with other settings."""
from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

from embcache.checkpoint import load_checkpoint
from embcache.errors import CheckpointError
from embcache.paths import writable_directory
from embcache.safe_load import load_pickled

# checkpoints written before the kind-prefixed names: kind -> the file name they used
LEGACY_CHECKPOINT_NAMES = {"dlrm": "last.pt"}
# positions written under other names before the trainers shared this skeleton
LEGACY_POSITION_KEYS = {"step_in_epoch": ("batch_in_epoch",), "step": ("global_step",),
                        "epoch": ("epochs_done",), "history": ("records",)}


def checkpoint_file(path: str | os.PathLike, kind: str) -> Path:
    """The checkpoint named by `path`: the file itself, or in a directory its
    `checkpoint_in(directory, kind)`."""
    path = Path(path)
    return checkpoint_in(path, kind) if path.is_dir() else path


def checkpoint_in(directory: str | os.PathLike, kind: str) -> Path:
    """A run's checkpoint in `directory`: `<kind>-last.pt`, or the name a checkpoint of that
    kind had before when only that one is there (the directory need not exist)."""
    directory = Path(directory)
    current = directory / f"{kind}-last.pt"
    legacy = LEGACY_CHECKPOINT_NAMES.get(kind)
    if not current.exists() and legacy and (directory / legacy).exists():
        return directory / legacy
    return current


def existing_run(directory: str | os.PathLike | None, kind: str) -> str | None:
    """What a run would lose if it started afresh in `directory`: "a dlrm run (step 98)"
    when a checkpoint of `kind` is there (its position read cheaply, or left out when the file
    cannot be read), None when there is none."""
    if not directory:
        return None
    path = checkpoint_in(directory, kind)
    if not path.is_file():
        return None
    try:  # memory-mapped: a large checkpoint is not read in full for its position
        ck = load_pickled(path, trust=False, mmap=True)
        stepwise = "max_steps" in ck["config"]  # a `StepRunConfig`'s; cf's runs are whole epochs
        where = f"step {ck['step']}" if stepwise else f"epoch {ck['epoch']}"
    except Exception:  # an older, damaged or untrusted file is still a run's: it is kept all the same
        return f"a {kind} run ({path.name})"
    return f"a {kind} run ({where})"


def refuse_existing_run(directory: str | os.PathLike | None, kind: str) -> None:
    """CheckpointError in one line when `directory` holds a run of `kind`: a run that does
    not resume it must say `overwrite` to replace it."""
    found = existing_run(directory, kind)
    if found:
        raise CheckpointError(f"{directory} holds {found}; continue it with --resume or start over "
                              f"with --overwrite")


def check_checkpoint_dir(directory: str | os.PathLike | None, resume: bool) -> None:
    """Before a run's first step, once: `directory` created and written to, so that one that
    cannot take checkpoints (a path through a file, no permission) stops the run in one line
    now, not at its first checkpoint with the work since lost. A resume's directory that is
    not there is left to the resume's own line (a mistyped one is not created)."""
    if directory and not (resume and not Path(directory).is_dir()):
        writable_directory(directory, "checkpoints")


def upgrade_common_parts(ck: dict, config_cls) -> dict:
    """The skeleton's parts of a checkpoint an earlier version wrote, in today's form:
    positions under today's names, the settings added since with the value they had in
    effect (`config_cls.settings_added_later`)."""
    ck["config"] = {**getattr(config_cls, "settings_added_later", {}), **ck["config"]}
    for key, old_names in LEGACY_POSITION_KEYS.items():
        for old in old_names:
            if key not in ck and old in ck:
                ck[key] = ck.pop(old)
    return ck


def config_from_checkpoint(config_cls, saved: dict, **overrides):
    """A `config_cls` with the settings a checkpoint recorded (those the class still has),
    then `overrides`."""
    names = {f.name for f in fields(config_cls)}
    saved = {**getattr(config_cls, "settings_added_later", {}), **saved}
    return config_cls(**{**{k: v for k, v in saved.items() if k in names}, **overrides})


def checkpoint_to_evaluate(path: str | os.PathLike, kind: str, config_cls, device: str | None = None):
    """(file, checkpoint, config) for evaluating the checkpoint `path` names (a file or a
    checkpoint directory): the run's own settings on `device`, with no checkpoints, metrics
    or progress of its own. The settings that size the model are checked against the
    tensors the file holds first (`config_cls.sizes_in_checkpoint`, where it has one)."""
    path = checkpoint_file(path, kind)
    ck = load_checkpoint(path, kind=kind)
    if hasattr(config_cls, "sizes_in_checkpoint"):
        refuse_unheld_sizes(path, ck.get("config"), config_cls.sizes_in_checkpoint(ck))
    try:
        cfg = config_from_checkpoint(config_cls, ck["config"], device=device, resume=False, checkpoint_dir=None,
                                     metrics_out=None, progress=False)
    except ValueError as err:  # a setting the config refuses (an image side past the largest): name the file
        raise CheckpointError(f"{path}: {err}") from None
    return path, ck, cfg


def refuse_unheld_sizes(path, config, held: dict) -> None:
    """CheckpointError in one line naming `path` and each setting of `config` (a
    checkpoint's settings) that sizes the model otherwise than the tensors beside it
    (`held`: setting -> the value those tensors' shapes say). A checkpoint from someone else
    could say `embedding_dim` 10^9 beside tables 16 wide; the model is built from its
    settings, so without this the build would ask for terabytes before the load compared a
    tensor. What the file holds is bounded by its own size, so these values are too."""
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: its config is a {type(config).__name__}, not the settings of a run")
    differ = [f"{name} {config.get(name)!r:.60} in its config, {value!r:.60} in its tensors"
              for name, value in held.items() if _listed(config.get(name)) != _listed(value)]
    if differ:
        raise CheckpointError(f"{path}: its settings do not match the tensors it holds ({'; '.join(differ)}): "
                              f"not a checkpoint these settings wrote")


def _listed(value):
    """A setting as it compares: a list setting (`dense_arch`) as a list, whether a tuple or a list."""
    return list(value) if isinstance(value, (list, tuple)) else value


def resume_mismatches(saved: dict, now: dict, must_match, only_raised=(), names=None) -> list[str]:
    """One phrase per setting that stops `now` from resuming a run with settings `saved`:
    "NAME SAVED in the checkpoint, NOW now", NAME from `names` (the flag the user typed:
    "--lr" for `sparse_lr`), else the field's own. A setting the checkpoint does not record
    (added later) is not compared. Settings in `only_raised` may grow (a run
    can be extended), not shrink. Two names of one existing path are the same setting."""
    names = names or {}
    out = []
    for k in must_match:
        if k not in saved:  # a setting added since the checkpoint was written: it had its one behaviour
            continue
        was, cur = saved.get(k), now.get(k)
        if was != cur and not _same_path(was, cur):
            out.append(f"{names.get(k, k)} {was!r} in the checkpoint, {cur!r} now")
    for k in only_raised:
        if k in saved and now.get(k) is not None and now[k] < saved[k]:
            n = names.get(k, k)
            out.append(f"{n} {saved[k]!r} in the checkpoint, {now[k]!r} now ({n} may only be raised)")
    return out


def _same_path(a, b) -> bool:
    if not (isinstance(a, str) and isinstance(b, str)) or not (os.path.exists(a) and os.path.exists(b)):
        return False
    return Path(a).resolve() == Path(b).resolve()
