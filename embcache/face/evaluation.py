"""Face evaluation on held-out identities.

- Verification: cosine similarity of each pair; 10-fold accuracy, the threshold of each fold
  chosen to maximise accuracy on the other nine; TAR at FAR 1e-3 and 1e-4 (the threshold is
  the FAR-quantile of the different-identity scores; with n negative pairs the smallest FAR
  that can be resolved is 1/n, reported beside it). A FAR below 1/n keeps its figures in
  the result, flagged `resolved@far=...: false`, since they would read as a measurement they
  are not (the cut is then the highest impostor score): what prints them shows `n/a` and
  says why once (`unresolved_note`).
- Identification: top-1 accuracy of probes against a gallery with one sample per identity,
  by exact inner-product search (faiss `IndexFlatIP` where importable) on L2-normalised features.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


@torch.no_grad()
def embed(model: torch.nn.Module, samples: torch.Tensor, batch_size: int = 512,
          device: torch.device | str = "cpu", flip: bool = False) -> torch.Tensor:
    """L2-normalised embeddings of `samples` in eval mode (for images, optionally the sum of
    the embeddings of the image and its mirror, as face benchmarks usually do)."""
    was_training = model.training
    model.eval()
    out = []
    for i in range(0, samples.shape[0], batch_size):
        x = samples[i:i + batch_size].to(device)
        f = model(x)
        if flip and x.dim() == 4:
            f = f + model(x.flip(-1))
        out.append(F.normalize(f.float(), dim=1).cpu())
    model.train(was_training)
    return torch.cat(out) if out else torch.empty(0)


def embed_shared(model: torch.nn.Module, samples: torch.Tensor, world, device: torch.device | str,
                 flip: bool, feat_dim: int) -> torch.Tensor:
    """`embed` under several ranks (`world`, a `embcache.distributed.world.World`): each rank
    embeds its slice of `samples` and the slices are gathered, in order, on every rank."""
    if not world.distributed:
        return embed(model, samples, device=device, flip=flip)
    from embcache.distributed.gathers import gather_rows
    from embcache.partition import slice_bounds

    n, size = samples.shape[0], world.size
    lo, hi = world.slice(n)
    own = embed(model, samples[lo:hi], device=device, flip=flip) if hi > lo else torch.zeros(0, feat_dim)
    return gather_rows(own, [b - a for a, b in (slice_bounds(n, size, r) for r in range(size))])


def score_val_sets(val_sets: dict, embed_fn, scores: bool = True) -> dict:
    """Verification of each `--val` set (`load_val_sets`: name -> first images, second
    images, is-same), each image embedded with its mirror by `embed_fn(samples, flip=True)`
    (collective under several ranks); scored where `scores` (rank 0), else `{}`."""
    out = {}
    for name, (a, b, same) in val_sets.items():
        ea, eb = embed_fn(a, flip=True), embed_fn(b, flip=True)
        if scores:
            out[name] = verification(ea, eb, same)
    return out


def _best_threshold(scores: np.ndarray, same: np.ndarray) -> float:
    """The threshold (predict same when score > t) with the highest accuracy on these pairs."""
    order = np.argsort(scores)
    s, y = scores[order], same[order]
    # threshold just below s[i]: pairs i.. predicted same; correct = negatives below + positives at/above
    neg_below = np.concatenate([[0], np.cumsum(~y)])
    pos_above = y.sum() - np.concatenate([[0], np.cumsum(y)])
    correct = neg_below + pos_above
    best = int(np.argmax(correct))
    if best == 0:
        return float(s[0]) - 1e-6
    if best == len(s):
        return float(s[-1]) + 1e-6
    return float((s[best - 1] + s[best]) / 2)


def verification(emb_a: torch.Tensor, emb_b: torch.Tensor, issame: torch.Tensor, folds: int = 10,
                 fars: tuple[float, ...] = (1e-3, 1e-4)) -> dict:
    """10-fold accuracy (mean, std) and TAR@FAR for pairs of normalised embeddings."""
    scores = (emb_a * emb_b).sum(1).double().numpy()
    same = issame.numpy().astype(bool)
    n = len(scores)
    if n < 2 * folds:
        raise ValueError(f"{n} verification pairs are fewer than {folds} folds")
    fold_of = np.arange(n) * folds // n  # contiguous folds, as the LFW protocol
    accs = []
    for k in range(folds):
        test = fold_of == k
        t = _best_threshold(scores[~test], same[~test])
        accs.append(float(((scores[test] > t) == same[test]).mean()))
    out = {"accuracy": float(np.mean(accs)), "accuracy_std": float(np.std(accs)), "pairs": n,
           "negatives": int((~same).sum())}
    neg = np.sort(scores[~same])[::-1]
    pos = scores[same]
    for far in fars:
        k = int(np.floor(far * len(neg)))  # at most k negatives may pass the threshold
        thr = neg[k] if k < len(neg) else -np.inf
        out[f"tar@far={far:g}"] = float((pos > thr).mean()) if len(pos) else float("nan")
        out[f"threshold@far={far:g}"] = float(thr) if np.isfinite(thr) else None  # `face verify`'s cut
        out[f"resolved@far={far:g}"] = k >= 1  # else no impostor may pass: the cut is the highest one's score
    out["min_resolvable_far"] = 1.0 / max(1, len(neg))
    return out


def far_resolved(scores: dict, far: float) -> bool:
    """Whether the impostor pairs of `scores` (a `verification` result) are enough to measure
    `far`; a result written before the flag is judged by its `min_resolvable_far`."""
    flag = scores.get(f"resolved@far={far:g}")
    if flag is not None:
        return bool(flag)
    least = scores.get("min_resolvable_far")
    return least is None or far * (1 + 1e-9) >= least


def far_text(far: float) -> str:
    """1e-3, 2.2e-2: a FAR as the lines print it."""
    mantissa, exponent = f"{far:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}"


def tar_text(scores: dict, far: float) -> str:
    """TAR at `far` with four decimals, or `n/a` where too few impostor pairs resolve `far`."""
    return f"{scores[f'tar@far={far:g}']:.4f}" if far_resolved(scores, far) else "n/a"


def unresolved_note(name: str, scores: dict, hint: str | None = None) -> str | None:
    """The line that says, once, why the TAR@FAR figures of verification set `name` show as
    n/a: its impostor pairs are too few for those FARs (None when they are enough), with
    `hint` (`pair_hints`: how to get more) after it."""
    fars = [float(k.split("=", 1)[1]) for k in scores if k.startswith("tar@far=")]
    low = [far_text(f) for f in fars if not far_resolved(scores, f)]
    if not low:
        return None
    least = scores.get("min_resolvable_far") or 1.0
    pairs = scores.get("negatives", round(1 / least))
    return (f"{name}: {pairs:,} impostor pairs resolve FAR >= {far_text(least)} only: TAR@FAR={' and '.join(low)} "
            f"cannot be measured on them and show as n/a (the result's figures are kept, flagged "
            f"\"resolved@far=...\": false)" + (f"; {hint}" if hint else ""))


def unresolved_notes(record: dict, said: set[str], hints: dict[str, str] | None = None) -> list[str]:
    """`unresolved_note` of each verification set of `record` (an epoch's scores) that is
    not in `said` yet, which gains them: a command says it once, not on every epoch's line.
    `hints`: by set name, how more pairs would be had (`pair_hints`)."""
    out = []
    for name, scores in record.items():
        note = (unresolved_note(name, scores, (hints or {}).get(name))
                if isinstance(scores, dict) and name not in said else None)
        if note:
            said.add(name)
            out.append(note)
    return out


def pair_hints(source, eval_pairs: int, record: dict) -> dict[str, str]:
    """How an image folder's held-out evaluation (`record["heldout"]`) would get more impostor
    pairs, by what limits them now: the cap of `eval_pairs`, every identity that can be held
    out already held out (as at --holdout 1), or --holdout. "A larger --holdout" was said in
    every case, where it could not help in the first two."""
    held, can = len(getattr(source, "heldout_paths", None) or ()), getattr(source, "holdable", None)
    scores = record.get("heldout")
    if not held or not isinstance(scores, dict) or can is None:
        return {}
    cap = eval_pairs // 2
    if scores.get("negatives", 0) >= cap:
        return {"heldout": f"held-out pairs are capped at {cap:,} impostor pairs: a --val file with more pairs "
                           f"measures lower FARs"}
    if held < can:
        return {"heldout": f"a larger --holdout gives more pairs (it holds out {held:,} of the {can:,} identities "
                           f"it can)"}
    return {"heldout": f"every identity that can be held out is ({held:,}: all with two or more images but the 2 "
                       f"kept to train), so a larger --holdout cannot help: more identities with two or more "
                       f"images, or a --val file (lfw.bin), give more pairs"}


def format_epoch(record: dict) -> str:
    """An epoch's line: each verification set's accuracy, TAR@FAR=1e-3 (n/a where its
    impostor pairs cannot resolve it) and identification top-1."""
    parts = [f"epoch {record['epoch']}"]
    for name, m in record.items():
        if isinstance(m, dict):
            s = (f"{name}: acc {m['accuracy']:.4f}±{m['accuracy_std']:.4f}, TAR@FAR=1e-3 {tar_text(m, 1e-3)}"
                 if "accuracy" in m else f"{name}: no verification ({m.get('pairs', 0)} pairs, under 20)")
            if "identification_top1" in m:
                s += f", top-1 {identification_text(m)}"
            parts.append(s)
    if len(parts) == 1:  # no held-out identities and no --val: said, not an empty line that reads as a score
        return f"{parts[0]} (nothing evaluated)"
    return " | ".join(parts)


def identification(gallery: torch.Tensor, gallery_labels: torch.Tensor, probes: torch.Tensor,
                   probe_labels: torch.Tensor) -> dict:
    """`identification_top1` with what it was measured on, the gallery's identities and the
    probes: a top-1 among 2 identities (chance 0.5) reads very differently from one among
    500, and the figure alone does not say which."""
    return {"identification_top1": identification_top1(gallery, gallery_labels, probes, probe_labels),
            "identification_gallery": int(gallery_labels.unique().numel()),
            "identification_probes": int(probe_labels.numel())}


def identification_text(m: dict, long: bool = False) -> str:
    """A result's top-1 as a line prints it, with the identities it chose among (and, `long`,
    the probes and chance) where the result records them."""
    text = f"{m['identification_top1']:.4f}"
    ids = m.get("identification_gallery")
    if not ids:
        return text
    if not long:
        return f"{text} ({ids:,} identities)"
    return f"{text} ({m['identification_probes']:,} probes against {ids:,} identities; chance {1 / ids:.2f})"


def identification_top1(gallery: torch.Tensor, gallery_labels: torch.Tensor, probes: torch.Tensor,
                        probe_labels: torch.Tensor) -> float:
    """Fraction of probes whose nearest gallery feature (inner product on L2-normalised
    features) has the probe's identity."""
    nearest, _ = nearest_by_inner_product(F.normalize(gallery.float(), dim=1), F.normalize(probes.float(), dim=1), 1)
    return float((gallery_labels.numpy()[nearest[:, 0]] == probe_labels.numpy()).mean())


def nearest_by_inner_product(gallery: torch.Tensor, queries: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices [q, k], scores [q, k]) of each query's `k` best gallery rows by inner product,
    by exact search: faiss `IndexFlatIP` where faiss is importable, else a matmul and
    `topk` (the same ranking; ties may order differently)."""
    g = np.ascontiguousarray(gallery.float().numpy())
    q = np.ascontiguousarray(queries.float().numpy())
    k = min(k, len(g))
    try:
        import faiss
    except ImportError:
        top = torch.from_numpy(q @ g.T).topk(k, dim=1)
        return top.indices.numpy(), top.values.numpy()
    index = faiss.IndexFlatIP(g.shape[1])
    index.add(g)
    scores, found = index.search(q, k)
    return found, scores


def heldout_pairs(labels: torch.Tensor, max_pairs: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(first, second, same) sample indices of verification pairs among labelled samples:
    up to `max_pairs // 2` genuine pairs (every pair of two samples of one identity, a seeded
    subset where there are more) and as many impostor pairs (two samples of different
    identities, drawn by `seed`).

    Example:
        >>> a, b, same = heldout_pairs(torch.tensor([0, 0, 0, 1, 1]), 100)
        >>> int(same.sum()), int((~same).sum()), bool((same == (torch.tensor([0, 0, 0, 1, 1])[a] == torch.tensor([0, 0, 0, 1, 1])[b])).all())
        (4, 4, True)
    """
    g = torch.Generator().manual_seed(seed)
    n = labels.numel()
    i, j = torch.triu_indices(n, n, offset=1)
    genuine = labels[i] == labels[j]
    gi, gj = i[genuine], j[genuine]
    if gi.numel() > max_pairs // 2:
        keep = torch.randperm(gi.numel(), generator=g)[:max_pairs // 2].sort().values
        gi, gj = gi[keep], gj[keep]
    ii, ij = i[~genuine], j[~genuine]
    keep = torch.randperm(ii.numel(), generator=g)[:gi.numel()].sort().values
    ii, ij = ii[keep], ij[keep]
    same = torch.cat([torch.ones(gi.numel(), dtype=torch.bool), torch.zeros(ii.numel(), dtype=torch.bool)])
    return torch.cat([gi, ii]), torch.cat([gj, ij]), same
