"""A trained CF model you can use: `CFModel` holds everything recommending needs (settings,
embeddings, SimpleX's histories, each user's training items, and the ids of your data) and
saves to and loads from one file, with no training data around.

Scores are the cosine of the user side (`U`, or SimpleX's `g*u + (1-g)*W*mean(history)`)
and an item's row: what training optimises and evaluation ranks by.

Example:
    >>> import numpy as np, tempfile
    >>> from embcache.cf.data.interactions import from_pairs
    >>> from cpu_kernels.model import CFConfig, CFParams
    >>> data = from_pairs([0, 0, 1], [0, 1, 2], [], [], num_items=4)
    >>> data.user_ids, data.item_ids = np.array(["ann", "bob"]), np.array(["a", "b", "c", "d"])
    >>> params = CFParams.init(CFConfig(dim=8), 2, 4, data.train_indptr, data.train_indices)
    >>> model = CFModel.from_training(params, data)
    >>> items, scores = model.recommend("ann", k=2)   # ann's own items a and b left out
    >>> sorted(items.tolist())
    ['c', 'd']
    >>> with tempfile.TemporaryDirectory() as d:
    ...     again = CFModel.load(model.save(d + "/model.npz"))
    >>> bool((again.recommend("ann", k=2)[1] == scores).all())
    True
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from cpu_kernels.model import CFConfig, CFParams, sample_histories
from embcache.integrity import ChecksumError, open_verified, save_npz

logger = logging.getLogger(__name__)

FORMAT = "embcache-cf-model"
VERSION = 1


@dataclass
class CFModel:
    """A trained SimpleX / MF-CCL model (see the module docstring). `user_ids[u]` and
    `item_ids[i]` are the ids of index u and i in your data (None: the indices are the ids)."""

    params: CFParams
    train_indptr: np.ndarray
    train_indices: np.ndarray
    user_ids: np.ndarray | None = None
    item_ids: np.ndarray | None = None
    # the data and split it was trained on (`embcache.cf.trained_on.record`), for `cf evaluate`
    trained_on: dict | None = None

    @classmethod
    def from_training(cls, params: CFParams, data, trained_on: dict | None = None) -> "CFModel":
        return cls(params, np.asarray(data.train_indptr, dtype=np.int64), np.asarray(data.train_indices, np.int64),
                   data.user_ids, data.item_ids, trained_on)

    def __repr__(self) -> str:
        """One line: the arrays are thousands of rows, too many to print."""
        c = self.params.config
        ids = "your ids" if self.user_ids is not None or self.item_ids is not None else "index ids"
        return (f"CFModel({c.model}, {self.num_users:,} users x {self.num_items:,} items, d={self.params.U.shape[1]}, "
                f"{len(self.train_indices):,} training interactions, {ids})")

    @property
    def num_users(self) -> int:
        return len(self.params.U)

    @property
    def num_items(self) -> int:
        return len(self.params.I)

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> Path:
        """One `.npz` file holding the whole model, written under a temporary name and
        renamed, so a file at `path` is always whole."""
        path = Path(path)
        if path.suffix != ".npz":
            raise ValueError(f"{path}: a CF model is saved as .npz")
        p = self.params
        meta = {"format": FORMAT, "version": VERSION, "config": asdict(p.config), "num_users": self.num_users,
                "num_items": self.num_items, "dim": p.U.shape[1]}
        if self.trained_on is not None:
            meta["trained_on"] = self.trained_on
        arrays = {"U": p.U, "I": p.I, "W": p.W, "hist": p.hist, "hist_len": p.hist_len,
                  "train_indptr": self.train_indptr, "train_indices": self.train_indices,
                  "meta": np.array(json.dumps(meta))}
        for name, ids in (("user_ids", self.user_ids), ("item_ids", self.item_ids)):
            if ids is not None:
                arrays[name] = np.asarray(ids)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_npz(path, arrays)  # sealed with its CRC-32
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CFModel":
        """A model `save` wrote (or `cf train --save FILE.npz`); ValueError naming the file
        for anything else, or a damaged one."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such model file")
        if path.suffix in (".npy", ".parquet"):  # `--save` writes these as embeddings alone, never as a model
            held = "the ids but not the training items" if path.suffix == ".parquet" else "neither the ids nor the " \
                "training items"
            raise ValueError(f"{path}: holds embeddings only ({path.suffix} is saved with {held} a model needs): "
                             f"train with --save FILE.npz for a whole model")
        try:  # open_verified: ChecksumError (a ValueError) naming the file
            with open_verified(path, "CF model") as f, np.load(f, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                if meta.get("format") != FORMAT:
                    raise ValueError("it holds embeddings only, saved before models were whole files: train again "
                                     "with --save FILE.npz")
                arrays = {k: z[k] for k in z.files if k != "meta"}
            config = CFConfig(**meta["config"])  # a file from someone else: any key may be missing or odd
            params = CFParams(arrays["U"], arrays["I"], arrays["W"], arrays["hist"], arrays["hist_len"], config)
            model = cls(params, arrays["train_indptr"], arrays["train_indices"], arrays.get("user_ids"),
                        arrays.get("item_ids"), meta.get("trained_on"))
        except ChecksumError:
            raise
        except ValueError as err:
            raise ValueError(f"{path}: not a CF model ({err})") from None
        except Exception as err:  # zipfile, numpy and json each raise their own
            raise ValueError(f"{path}: not a readable CF model ({type(err).__name__}: {err})") from None
        model._check(path)
        return model

    def _check(self, path) -> None:
        p = self.params
        shapes_ok = (p.I.shape[1] == p.U.shape[1] == p.W.shape[0] == p.W.shape[1] and len(p.hist) == self.num_users
                     and len(self.train_indptr) == self.num_users + 1
                     and (self.user_ids is None or len(self.user_ids) == self.num_users)
                     and (self.item_ids is None or len(self.item_ids) == self.num_items))
        if not shapes_ok:
            raise ValueError(f"{path}: the model's arrays do not fit together (a damaged file?)")
        # the indices index arrays: one beyond them would be an IndexError traceback at the first user
        indptr, ni = self.train_indptr, self.num_items
        if not (p.hist.ndim == 2 and _within(p.hist, ni) and _within(p.hist_len, p.hist.shape[1] + 1)
                and _within(self.train_indices, ni) and indptr[0] == 0 and indptr[-1] == len(self.train_indices)
                and (np.diff(indptr) >= 0).all()):
            raise ValueError(f"{path}: the model's histories or training items point outside its {ni:,} items "
                             f"(a damaged file?)")
        for name, t in (("user", p.U), ("item", p.I), ("W", p.W)):
            bad = np.flatnonzero(~np.isfinite(t).all(axis=1))
            if len(bad):
                raise ValueError(f"{path}: {len(bad)} {name} row(s) hold NaN or infinity (first: {int(bad[0])})")

    # ------------------------------------------------------------------ ids
    def user_index(self, users) -> np.ndarray:
        return _indices(users, self.user_ids, self.num_users, "user")

    def item_index(self, items) -> np.ndarray:
        return _indices(items, self.item_ids, self.num_items, "item")

    def _item_ids(self, index: np.ndarray) -> np.ndarray:
        return index if self.item_ids is None else self.item_ids[index]

    # ------------------------------------------------------------------ scores
    def user_vectors(self, index: np.ndarray) -> np.ndarray:
        """The user side z of users `index`, L2-normalised."""
        p, c = self.params, self.params.config
        z = p.U[index].astype(np.float32)
        if c.simplex:
            lens = p.hist_len[index]
            rows = p.I[p.hist[index]] * (np.arange(p.hist.shape[1]) < lens[:, None])[:, :, None]
            mean = rows.sum(1) / np.maximum(lens, 1)[:, None]
            z = c.gamma * z + (1.0 - c.gamma) * (mean @ p.W.T)
        return _normalised(z)

    def recommend(self, users, k: int = 10, exclude_seen: bool = True, backend: str = "auto"):
        """The `k` best items for each of `users` (your ids): (items [n, k] as your ids,
        cosine scores [n, k]), best first; for one user given alone, 1-D arrays. With
        `exclude_seen` a user's training items are left out, and `k` stops at the fewest
        unseen items among `users` (a warning says so once): past them only seen items,
        scored -inf, would be left to fill the rows."""
        one = np.ndim(users) == 0
        index = self.user_index([users] if one else users)
        asked, k = int(k), min(int(k), self.num_items)
        if exclude_seen and len(index):
            unseen = self.unseen_counts(index)
            fewest = int(unseen.min())
            if k > fewest:
                who = users if one else self._user_id(int(index[np.argmin(unseen)]))
                logger.warning(f"k={asked} is more than the {fewest:,} item(s) user {who!r} has not seen: "
                               f"{fewest:,} returned per user")
                k = fewest
        top, scores = self.ranked(index, k, exclude_seen, backend)
        items = self._item_ids(top)
        return (items[0], scores[0]) if one else (items, scores)

    def unseen_counts(self, index: np.ndarray) -> np.ndarray:
        """How many items each of users `index` has no training interaction with."""
        return self.num_items - np.diff(self.train_indptr)[np.asarray(index, dtype=np.int64)]

    def ranked(self, index: np.ndarray, k: int, exclude_seen: bool = True, backend: str = "auto"):
        """(item indices [n, k], scores [n, k]) of users `index`, best first; a row with fewer
        than `k` unseen items ends in seen ones scored -inf (`recommend` stops before them)."""
        k = min(int(k), self.num_items)
        if k == 0:  # users who have seen every item
            return np.zeros((len(index), 0), np.int64), np.zeros((len(index), 0), np.float32)
        indptr, indices = (self.train_indptr, self.train_indices) if exclude_seen else \
            (np.zeros(self.num_users + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))
        return self._topk(self.user_vectors(index), index, indptr, indices, k, backend)

    def _user_id(self, index: int):
        return index if self.user_ids is None else self.user_ids[index].item()

    def similar_items(self, items, k: int = 10, backend: str = "auto"):
        """The `k` items most similar to each of `items` (cosine of their rows), the item
        itself left out: (items [n, k] as your ids, scores [n, k])."""
        one = np.ndim(items) == 0
        index = self.item_index([items] if one else items)
        k = min(int(k), self.num_items - 1)
        indptr = np.arange(len(index) + 1, dtype=np.int64)  # each query "has seen" itself
        top, scores = self._topk(_normalised(self.params.I[index]), np.arange(len(index)), indptr, index, k,
                                 backend)
        out = self._item_ids(top)
        return (out[0], scores[0]) if one else (out, scores)

    def _topk(self, z, rows, indptr, indices, k, backend):
        from embcache.cf.evaluation import topk_backend

        topk = topk_backend(_normalised(self.params.I), backend)
        tops, scores = [], []
        for lo in range(0, len(z), 1024):
            t, s = topk(np.ascontiguousarray(z[lo:lo + 1024]), rows[lo:lo + 1024], indptr, indices, k)
            tops.append(t)
            scores.append(s)
        return np.concatenate(tops), np.concatenate(scores)

    # ------------------------------------------------------------------ users unseen in training
    def fold_in(self, user_items, user_id=None, steps: int = 200, lr: float = 0.05, seed: int = 0) -> int:
        """Add a user unseen in training from their items (your ids): the user's history is
        (up to H of) those items, and their row is fitted to the training loss with every
        item row fixed (`steps` of Adam, negatives drawn from the items they lack).
        Returns the new user's index; `recommend(user_id)` then works for them."""
        import torch

        from cpu_kernels.torch_reference import cf_loss, sample_negatives

        p, c = self.params, self.params.config
        if user_id is not None and self.user_ids is not None and user_id in set(self.user_ids.tolist()):
            raise ValueError(f"user {user_id!r} is in the model already")
        items = np.unique(self.item_index(user_items))
        if not len(items):
            raise ValueError("fold_in needs at least one item")
        hist, hist_len = sample_histories(np.array([0, len(items)]), items, c.history, np.random.default_rng(seed))
        gen = torch.Generator().manual_seed(seed)
        I, W = torch.from_numpy(p.I), torch.from_numpy(p.W)
        u = torch.from_numpy(p.I[items].mean(0, keepdims=True)).clone().requires_grad_()
        opt = torch.optim.Adam([u], lr=lr)
        seen = torch.from_numpy(items)  # the user's keys (user 0 here), sorted
        pos = torch.from_numpy(items)
        users = torch.zeros(len(items), dtype=torch.long)
        h, hl = torch.from_numpy(hist), torch.from_numpy(hist_len)
        for _ in range(steps):
            negs, _, _ = sample_negatives(users, self.num_items, c.negatives, gen, seen)
            loss = cf_loss(u, I, W, h, hl, users, pos, negs, c)
            opt.zero_grad()
            loss.backward()
            opt.step()
        index = self.num_users
        p.U = np.concatenate([p.U, u.detach().numpy().astype(np.float32)])
        p.hist, p.hist_len = np.concatenate([p.hist, hist]), np.concatenate([p.hist_len, hist_len])
        self.train_indices = np.concatenate([self.train_indices, items])
        self.train_indptr = np.append(self.train_indptr, len(self.train_indices))
        if self.user_ids is not None:  # without an id of its own, the user's id is its index
            new = index if user_id is None else user_id
            self.user_ids = np.concatenate([self.user_ids, np.array([new if self.user_ids.dtype.kind in "iu"
                                                                      else str(new)])])
        return index


def _normalised(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _within(index: np.ndarray, count: int) -> bool:
    """Whether every entry of an integer array is in [0, count)."""
    return index.dtype.kind in "iu" and (index.size == 0 or (int(index.min()) >= 0 and int(index.max()) < count))


def _indices(wanted, ids: np.ndarray | None, count: int, noun: str) -> np.ndarray:
    """Each id's index; KeyError naming the ids the model does not know."""
    wanted = list(np.atleast_1d(np.asarray(wanted, dtype=object)))
    if ids is None:
        try:
            index = np.array([int(w) for w in wanted], dtype=np.int64)
        except (TypeError, ValueError):
            raise KeyError(f"{noun} ids of this model are 0..{count - 1}, not {wanted[:5]}") from None
        unknown = [int(w) for w, i in zip(wanted, index) if not 0 <= i < count]
    else:
        lookup = {v: i for i, v in enumerate(ids.tolist())}
        if ids.dtype.kind in "iu":
            keys = []
            for w in wanted:
                try:
                    keys.append(int(w))
                except (TypeError, ValueError):
                    keys.append(w)
        else:
            keys = [str(w) for w in wanted]
        index = np.array([lookup.get(key, -1) for key in keys], dtype=np.int64)
        unknown = [w for w, i in zip(wanted, index) if i < 0]
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise KeyError(f"{len(unknown)} {noun}(s) not in the model: {', '.join(map(repr, unknown[:5]))}{more}")
    return index
