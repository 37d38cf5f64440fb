"""A face checkpoint used: `embcache face embed` (L2-normalised embeddings of images) and
`embcache face verify` (two images: cosine and a same/different verdict), from the checkpoint
alone, no training folder (it records how to rebuild its network: `probe_spec`). `face search`
is `embcache.face.search`'s.

The verdict's threshold is the one at FAR 1e-3 on the last evaluation's first verification
set (recorded in the checkpoint's history), or `--threshold`. Where that set had too few
impostor pairs to resolve FAR 1e-3 (fewer than 1,000) the line says what the cut is instead.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from embcache.errors import CheckpointError, UserFacingError
from embcache.face.config import MAX_SIDE  # the largest image side, training's --image-size's bound too

EMBED_FORMATS = (".npy", ".parquet")


def load_probe(checkpoint, device="cpu", images: bool = False):
    """(the checkpoint's embedding network in eval mode, its `probe_spec`, the checkpoint);
    with `images`, a network of feature vectors (the synthetic default) is refused at once,
    naming the file and how to train one that embeds images."""
    from embcache.checkpoint import load_checkpoint
    from embcache.train.run import checkpoint_in

    path = Path(checkpoint)
    if path.is_dir():
        path = checkpoint_in(path, "face")
    try:
        ck = load_checkpoint(path, kind="face")
    except CheckpointError:  # names the file already
        raise
    except (OSError, ValueError) as err:
        raise UserFacingError(f"{path}: {err}") from None
    spec = ck.get("probe_spec")
    if spec is None:
        raise UserFacingError(f"{path}: written before checkpoints recorded their network's shape; `face evaluate` "
                              f"uses it with its training data, or train again to embed with it alone")
    if images and isinstance(spec, dict) and len(spec.get("sample_shape") or ()) != 3:
        raise UserFacingError(f"{path}: this checkpoint embeds {tuple(spec['sample_shape'])} feature vectors "
                              f"(synthetic data with --image-size 0), not images: train with --image-size S or "
                              f"on an image folder to embed images")
    probe = probe_from_spec(path, spec, ck.get("probe"))
    return probe.to(device).eval(), spec, ck


def probe_from_spec(path, spec, state):
    """The embedding network `spec` (a checkpoint's `probe_spec`) names, holding `state`.

    A checkpoint may come from someone else, and its spec alone sizes the network and the
    images resized for it: a feat_dim of 10^11 asked for 25 TB, a side of 10^6 for terabytes
    of pixels. So the spec is checked, and the network built on the meta device (no memory)
    must have exactly the shapes of the tensors the file holds, before anything real is
    built: what a load allocates is then bounded by the file's own size. UserFacingError in
    one line naming `path` otherwise."""
    from embcache.nn.backbones import BACKBONES, build_backbone

    def refuse(what):
        return UserFacingError(f"{path}: its network (probe_spec) {what}; not a network this checkpoint can hold")

    if not isinstance(spec, dict) or spec.get("backbone") not in BACKBONES:
        raise refuse(f"names backbone {spec.get('backbone') if isinstance(spec, dict) else spec!r:.60}")
    dim, shape = spec.get("feat_dim"), spec.get("sample_shape")
    if type(dim) is not int or dim < 1 or not isinstance(shape, (list, tuple)) or len(shape) not in (1, 3) \
            or any(type(s) is not int or s < 1 for s in shape):
        raise refuse(f"has feat_dim {dim!r:.40} and sample_shape {shape!r:.60}")
    if len(shape) == 3 and (shape[0] != 3 or max(shape[1:]) > MAX_SIDE):
        raise refuse(f"takes images of shape {tuple(shape)} (3 channels, sides up to {MAX_SIDE})")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise refuse("has no tensors (its 'probe' is not a state dict)")
    try:
        with torch.device("meta"):
            want = {k: tuple(v.shape) for k, v in build_backbone(spec["backbone"], dim, tuple(shape))
                    .state_dict().items()}
    except (ValueError, RuntimeError) as err:
        raise refuse(str(err).splitlines()[0] if str(err) else type(err).__name__) from None
    got = {k: tuple(v.shape) for k, v in state.items()}
    if want != got:
        odd = sorted(set(want) ^ set(got)) or [k for k in want if want[k] != got[k]]
        raise refuse(f"does not match its tensors ({odd[0]}: {want.get(odd[0])} by the spec, "
                     f"{got.get(odd[0])} in the file)")
    probe = build_backbone(spec["backbone"], dim, tuple(shape))
    probe.load_state_dict(state)
    return probe


def images_among(files, where: str) -> list[Path]:
    """The images of `files` (by suffix, as training reads a folder), sorted; the other files
    are counted in one warning naming `where` and the first (hidden files, `.DS_Store`, aside):
    a `.gif` or `.tif` in a folder was left out of `embed` and `search` without a word."""
    from embcache.face.data.folder import IMAGE_SUFFIXES

    files = sorted(files)
    others = [p for p in files if p.suffix.lower() not in IMAGE_SUFFIXES and not p.name.startswith(".")]
    if others:
        import logging

        kinds = sorted({p.suffix.lower() or "no suffix" for p in others})
        logging.getLogger("embcache").warning(
            f"{where}: left out {len(others):,} file(s) that are not images by name ({', '.join(kinds[:5])}; "
            f"first {others[0]}): images are {', '.join(sorted(IMAGE_SUFFIXES))}")
    return [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]


def image_paths(inputs: list[str]) -> list[Path]:
    """Every image named, or found (sorted, recursively) in a directory named."""
    out = []
    for item in map(Path, inputs):
        if item.is_dir():
            out += images_among((p for p in item.rglob("*") if p.is_file()), str(item))
        elif item.is_file():
            out.append(item)
        else:
            raise UserFacingError(f"{item}: no such file or directory")
    if not out:
        raise UserFacingError(f"no images in {', '.join(inputs)}")
    return out


def skipped_images():
    """The log `--skip-bad-images` keeps (`embed_readable`'s `bad`): one entry an image."""
    from embcache.data.bad_rows import BadRowLog

    return BadRowLog(noun="unreadable image", position=None)


def report_skipped(log) -> None:
    """The images `log` left out, counted and named (nothing where none was, or no log)."""
    if log is not None and log.total:
        print(f"skipped {log.total:,} unreadable image(s):", flush=True)
        log.report()


def embed_images(probe, spec: dict, paths: list[Path], device="cpu", flip: bool = True,
                 batch: int = 256, progress: bool = False) -> torch.Tensor:
    """`[n, feat_dim]` L2-normalised embeddings of image files (decoded and resized as
    training read them; with `flip`, of the image plus its mirror, as evaluation does); an
    unreadable image is one line naming it."""
    return embed_readable(probe, spec, paths, device, flip, batch=batch, progress=progress)[0]


def embed_readable(probe, spec: dict, paths: list[Path], device="cpu", flip: bool = True, bad=None,
                   batch: int = 256, progress: bool = False) -> tuple[torch.Tensor, list[Path]]:
    """(embeddings, their paths) as `embed_images`, except that with a `BadRowLog` as `bad`
    an unreadable image is logged there and left out rather than stopping the rest."""
    from tqdm import tqdm

    from embcache.errors import DataFormatError
    from embcache.face.data.images import decode_image
    from embcache.face.evaluation import embed

    shape = tuple(spec["sample_shape"])
    if len(shape) != 3:
        raise UserFacingError(f"this checkpoint embeds {shape} vectors, not images")
    out, kept = [], []
    for lo in tqdm(range(0, len(paths), batch), desc="embed", unit="batch", disable=not progress):
        images = []
        for p in paths[lo:lo + batch]:
            try:
                images.append(decode_image(p, str(p), shape[1]))
            except DataFormatError as err:
                if bad is None:
                    raise UserFacingError(str(err)) from None
                bad.add(str(p), 0, str(err).partition(": ")[2])
                continue
            kept.append(p)
        if images:
            out.append(embed(probe, torch.stack(images), device=device, flip=flip))
    return (torch.cat(out) if out else torch.zeros(0, int(spec["feat_dim"]))), kept


def embed_command(args) -> int:
    from embcache.data.results_file import write_columns
    from embcache.paths import check_output_file

    out = Path(args.out)
    if out.suffix not in EMBED_FORMATS:
        raise UserFacingError(f"{out}: embeddings are written as {' or '.join(EMBED_FORMATS)}")
    check_output_file(out)  # before the work, not after it
    probe, spec, _ = load_probe(args.checkpoint, args.device, images=True)
    bad = skipped_images() if args.skip_bad_images else None
    emb, paths = embed_readable(probe, spec, image_paths(args.inputs), args.device, flip=not args.no_flip, bad=bad,
                                progress=args.progress)
    report_skipped(bad)
    if not paths:
        raise UserFacingError(f"no readable image in {', '.join(args.inputs)}; nothing written")
    emb = emb.numpy()
    if out.suffix == ".npy":
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp.npy")
        np.save(tmp, emb)
        tmp.replace(out)
        Path(str(out) + ".paths.txt").write_text("".join(f"{p}\n" for p in paths))
    else:
        import pyarrow as pa

        vectors = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), emb.shape[1])
        write_columns({"path": [str(p) for p in paths], "embedding": vectors}, out)
    print(f"wrote {len(paths):,} embeddings of {emb.shape[1]} floats to {out}"
          + (f" (paths in {out}.paths.txt)" if out.suffix == ".npy" else ""))
    return 0


def recorded_scores(ck: dict, far: float = 1e-3) -> dict | None:
    """The verification scores that hold the checkpoint's cut at `far`: the last
    evaluation's first verification set that recorded one (None if none did)."""
    for record in reversed(ck.get("history") or []):
        for value in record.values():
            if isinstance(value, dict) and value.get(f"threshold@far={far:g}") is not None:
                return value
    return None


def verify_threshold(ck: dict, far: float = 1e-3) -> float | None:
    """The cut at `far` of the last evaluation's first verification set, if it recorded one."""
    scores = recorded_scores(ck, far)
    return None if scores is None else float(scores[f"threshold@far={far:g}"])


def threshold_source(ck: dict, far: float = 1e-3) -> str:
    """How a line names the checkpoint's cut at `far`. Where the evaluation had too few
    impostor pairs to resolve `far` the cut is only the highest impostor cosine, and the
    line says so rather than call it a FAR."""
    from embcache.face.evaluation import far_resolved, far_text

    scores = recorded_scores(ck, far)
    if scores is None or far_resolved(scores, far):
        return f"the checkpoint's, at FAR {far_text(far)}"
    least = scores.get("min_resolvable_far") or 1.0
    pairs = scores.get("negatives", round(1 / least))
    return (f"the checkpoint's, not a FAR {far_text(far)} cut: its evaluation's {pairs:,} impostor pairs resolve "
            f"FAR >= {far_text(least)} only, and it is the highest of their cosines")


def resolve_threshold(ck: dict, threshold: float | None) -> tuple[float | None, str]:
    """(threshold, where it came from): the caller's, else the checkpoint's at FAR 1e-3
    (`threshold_source` words it); `face verify`'s and `face search`'s."""
    if threshold is not None:
        return float(threshold), "--threshold"
    recorded = verify_threshold(ck)
    if recorded is None:
        return None, "no evaluation recorded one: give --threshold"
    return recorded, threshold_source(ck)


def verify_command(args) -> int:
    for item in (args.a, args.b):  # a directory's images would be more than the two compared
        if Path(item).is_dir():
            raise UserFacingError(f"{item}: a directory; verify compares two image files (embed and search "
                                  f"take directories)")
    probe, spec, ck = load_probe(args.checkpoint, args.device, images=True)
    threshold, source = resolve_threshold(ck, args.threshold)
    if threshold is None:
        raise UserFacingError(f"{args.checkpoint}: no evaluation recorded a threshold at FAR 1e-3: give --threshold")
    a, b = embed_images(probe, spec, image_paths([args.a, args.b]), args.device, flip=not args.no_flip)
    cosine = float((a * b).sum())
    verdict = "same" if cosine > threshold else "different"
    print(f"cosine {cosine:.4f}, threshold {threshold:.4f} ({source}): {verdict}")
    return 0
