"""`embcache face search` and the Python call behind it (`search`): each query image's nearest
gallery identities by cosine, and whether each clears the threshold, so that a query like no
one in the gallery is answered "unknown" rather than by its nearest stranger.

The threshold is the one `face verify` uses: the cut at FAR 1e-3 that the last evaluation
found on its first verification set (recorded in the checkpoint), or the caller's. It was
found on pairs of single images, where a gallery identity is the mean of its images'
embeddings: there the cut is a guide, not a measured false accept rate. Where the evaluation
had too few impostor pairs to resolve FAR 1e-3, the line naming the threshold says so.

Queries are embedded before the gallery: an unreadable query stops the search before the
larger part of the work, not after it. With `skip_bad_images` (`--skip-bad-images`) unreadable
images, query or gallery, are left out, counted and named instead.

Example:
    >>> # found = search("runs/face", "people/", ["photos/"], k=3)
    >>> # [(q.path.name, q.identity or "unknown") for q in found.queries]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from embcache.data.bad_rows import BadRowLog
from embcache.errors import UserFacingError
from embcache.face.use import report_skipped, resolve_threshold, skipped_images


@dataclass
class QueryResult:
    """One query image's `k` nearest identities (best first), their cosines, and per result
    whether it clears the threshold (`matches`; None when no threshold is known)."""

    path: Path
    identities: list[str]
    cosines: list[float]
    matches: list[bool] | None

    @property
    def identity(self) -> str | None:
        """The identity the query is taken for: the nearest, if it clears the threshold;
        None for an unknown query (or when there is no threshold to decide by)."""
        return self.identities[0] if self.matches and self.matches[0] else None

    @property
    def unknown(self) -> bool:
        """Clears the threshold for no gallery identity (False when there is no threshold)."""
        return self.matches is not None and not any(self.matches)


@dataclass
class SearchResults:
    queries: list[QueryResult]
    gallery_size: int                 # identities with at least one readable image
    k: int
    threshold: float | None
    threshold_from: str               # where the threshold came from, for the user
    skipped: BadRowLog = field(default_factory=skipped_images)

    @property
    def unknown(self) -> int:
        return sum(q.unknown for q in self.queries)


def gallery_identities(root: str | Path) -> tuple[list[str], list[list[Path]]]:
    """(names, image files of each) of a gallery: `<root>/<identity>/<image>` like a training
    folder, or images directly in `root`, each its own entry named by its file's stem."""
    from embcache.face.use import images_among

    root = Path(root)
    if not root.is_dir():
        raise UserFacingError(f"{root}: no such directory")
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    found = images_among([p for d in [root, *folders] for p in d.iterdir() if p.is_file()], str(root))
    by_folder = {}
    for p in found:
        by_folder.setdefault(p.parent, []).append(p)
    names, files = [], []
    for d in folders:
        if d in by_folder:
            names.append(d.name)
            files.append(by_folder[d])
    for image in by_folder.get(root, []):
        names.append(image.stem)
        files.append([image])
    if not names:
        raise UserFacingError(f"{root}: no images (expected <gallery>/<identity>/<image>.jpg or images in it)")
    return names, files


def identity_centres(embeddings: torch.Tensor, files: list[list[Path]]) -> torch.Tensor:
    """One L2-normalised vector per identity: the mean of its images' embeddings."""
    sizes = [len(f) for f in files]
    return torch.nn.functional.normalize(torch.stack([e.mean(0) for e in embeddings.split(sizes)]), dim=1)


def search(checkpoint, gallery, queries: list[str], k: int = 5, threshold: float | None = None, device="cpu",
           flip: bool = True, skip_bad_images: bool = False, progress: bool = False) -> SearchResults:
    """The `k` nearest identities of `gallery` (a directory) for each image of `queries`
    (files or directories), judged against `threshold` (default: the checkpoint's)."""
    from embcache.face.evaluation import nearest_by_inner_product
    from embcache.face.use import embed_readable, image_paths, load_probe

    probe, spec, ck = load_probe(checkpoint, device, images=True)
    threshold, source = resolve_threshold(ck, threshold)
    names, files = gallery_identities(gallery)
    found = SearchResults([], 0, k, threshold, source)
    bad = found.skipped if skip_bad_images else None
    q_emb, q_paths = embed_readable(probe, spec, image_paths(queries), device, flip, bad=bad)
    g_emb, g_paths = embed_readable(probe, spec, [p for f in files for p in f], device, flip, bad=bad,
                                    progress=progress)
    readable = set(g_paths)
    kept = [(n, [p for p in f if p in readable]) for n, f in zip(names, files)]
    kept = [(n, f) for n, f in kept if f]
    if not kept:
        raise UserFacingError(f"{gallery}: no readable gallery image")
    names, files = [n for n, _ in kept], [f for _, f in kept]
    found.gallery_size = len(names)
    if not q_paths:
        return found
    nearest, scores = nearest_by_inner_product(identity_centres(g_emb, files), q_emb, k)
    found.k = nearest.shape[1]
    for path, row, cos in zip(q_paths, nearest, scores):
        cos = [float(c) for c in cos]
        matches = None if threshold is None else [c > threshold for c in cos]
        found.queries.append(QueryResult(path, [names[i] for i in row], cos, matches))
    return found


def search_command(args) -> int:
    import pyarrow as pa

    from embcache.data.results_file import check_output, write_columns

    out = check_output(args.out, "search results") if args.out else None  # before the work, not after it
    found = search(args.checkpoint, args.gallery, args.query, args.k, args.threshold, args.device,
                   flip=not args.no_flip, skip_bad_images=args.skip_bad_images, progress=args.progress)
    report_skipped(found.skipped)
    rule = (f"threshold {found.threshold:.4f} ({found.threshold_from})" if found.threshold is not None
            else f"no threshold ({found.threshold_from})")
    k, qs = found.k, found.queries
    if out is not None:
        write_columns({"query": [str(q.path) for q in qs for _ in range(k)],
                       "rank": [r + 1 for _ in qs for r in range(k)],
                       "identity": [n for q in qs for n in q.identities],
                       "cosine": np.array([c for q in qs for c in q.cosines], dtype=np.float32),
                       "match": pa.array([m for q in qs for m in (q.matches or [None] * k)], pa.bool_())}, out)
        print(f"wrote the {k} nearest of {found.gallery_size:,} gallery identities for {len(qs):,} queries to "
              f"{out}; {rule}: {unknown_line(found)}")
        return 0
    print(f"the {k} nearest of {found.gallery_size:,} gallery identities (cosine to the mean of each one's "
          f"images; " + (f"'match': above the {rule}):" if found.threshold is not None else f"{rule}):"))
    for q in qs:
        answer = "" if q.matches is None else f"{q.identity or 'unknown'}: "
        print(f"{q.path}: {answer}" + ", ".join(f"{n} {c:.3f}" + (" match" if q.matches and m else "")
                                                  for n, c, m in zip(q.identities, q.cosines,
                                                                     q.matches or [False] * k)))
    print(unknown_line(found))
    return 0


def unknown_line(found: SearchResults) -> str:
    """How many queries are unknown, or why none can be."""
    if found.threshold is None:
        return "no query is called unknown without a threshold"
    return f"{found.unknown:,} of {len(found.queries):,} queries match no gallery identity (unknown)"
