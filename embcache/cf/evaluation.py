"""Full-ranking evaluation of CF models: every user with test items is scored against all
items, its training items are masked, and Recall@k / NDCG@k are averaged over those users.
Users go in batches, so memory is bounded by batch x items scores however large the data.
`evaluate` works on any user and item vectors, `evaluate_params` on a model's parameters
and `popularity` gives the baseline (items ranked by training popularity).

Two top-k back-ends give the same ranking: `torch` (matmul, mask, `topk`) and `faiss`
(exact inner-product search for k + the batch's largest training count, then the training
items are dropped). `embcache bench cf` measures both; `auto` picks the faster one
(`DEFAULT_BACKEND`, set from that measurement).

Example:
    >>> from embcache.cf.data.interactions import from_pairs
    >>> data = from_pairs([0, 1, 1, 2], [0, 0, 1, 0], [0, 2], [1, 1])
    >>> popularity(data, ks=(1,))   # item 0 is the most popular, item 1 next
    {'recall@1': 1.0, 'ndcg@1': 1.0, 'users': 2}
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from cpu_kernels.heat import user_vectors
from cpu_kernels.model import CFParams
from embcache.cf.data.interactions import Interactions
from embcache.errors import UserFacingError

logger = logging.getLogger(__name__)

BACKENDS = ("torch", "faiss")
# bench/results/cf.json, "topk": torch was faster on this 2-core machine (see docs/heat.md)
DEFAULT_BACKEND = "torch"


def evaluate(user_vecs: np.ndarray, item_vecs: np.ndarray, train_indptr, train_indices,
             test_indptr, test_indices, ks=(20,), batch_size: int = 1024,
             backend: str = "auto", cosine: bool = True) -> dict:
    """{"recall@k": ..., "ndcg@k": ..., "users": evaluated users} for each k in ks. With no
    test users the metrics are None (not 0.0: nothing was measured).

    Args:
        user_vecs, item_vecs: [users, d] and [items, d]; scores are their inner products,
            after L2-normalising both when `cosine`.
        train_indptr/train_indices, test_indptr/test_indices: CSR user -> items.
        backend: "torch", "faiss" or "auto" (DEFAULT_BACKEND).
    """
    if not len(ks) or min(ks) < 1:
        raise ValueError(f"every cut-off k must be >= 1, not {list(ks)}")
    backend = DEFAULT_BACKEND if backend == "auto" else backend
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or 'auto'")
    U = np.ascontiguousarray(user_vecs, dtype=np.float32)
    V = np.ascontiguousarray(item_vecs, dtype=np.float32)
    if cosine:
        U = U / np.maximum(np.linalg.norm(U, axis=1, keepdims=True), 1e-12)
        V = V / np.maximum(np.linalg.norm(V, axis=1, keepdims=True), 1e-12)
    num_items = len(V)
    kmax = min(max(ks), num_items)
    users = np.flatnonzero(np.diff(test_indptr) > 0)
    topk_fn = topk_backend(V, backend)
    sums = {f"{m}@{k}": 0.0 for k in ks for m in ("recall", "ndcg")}
    discounts = 1.0 / np.log2(np.arange(2, kmax + 2))
    for lo in range(0, len(users), batch_size):
        b = users[lo:lo + batch_size]
        top, _ = topk_fn(U[b], b, train_indptr, train_indices, kmax)  # [B, kmax] item ids
        hit = _hits(top, b, test_indptr, test_indices, num_items)
        n_test = np.diff(test_indptr)[b]
        for k in ks:
            kk = min(k, kmax)
            hits_k = hit[:, :kk]
            sums[f"recall@{k}"] += float((hits_k.sum(1) / n_test).sum())
            dcg = (hits_k * discounts[:kk]).sum(1)
            ideal = np.cumsum(discounts[:kk])[np.minimum(n_test, kk) - 1]
            sums[f"ndcg@{k}"] += float((dcg / ideal).sum())
    n = len(users)
    out = {key: (v / n if n else None) for key, v in sums.items()}
    out["users"] = int(len(users))
    return out


def warn_of_large_k(ks, num_items: int) -> None:
    """One warning where a cut-off is not below the item count: its top k is every item, so
    Recall@k is 1 whatever the model, a figure that would pass for a score."""
    large = [k for k in ks if k >= num_items]
    if large:
        logger.warning(f"--k {' '.join(map(str, large))} is not below the {num_items:,} items: such a top k holds "
                       f"every item, so its Recall is 1.0 whatever the model")


def popularity_scores(train_indices: np.ndarray, num_users: int, num_items: int):
    """(user_vecs, item_vecs) that rank every user's items by training popularity; evaluate
    them with cosine=False. The floor any trained model must clear."""
    deg = np.bincount(train_indices, minlength=num_items).astype(np.float32)
    return np.ones((num_users, 1), np.float32), deg[:, None]


def evaluate_params(params: CFParams, data: Interactions, ks=(20,), backend="auto") -> dict:
    """Full-ranking metrics of a model's current parameters on the test split of `data`."""
    return evaluate(user_vectors(params), params.I, data.train_indptr, data.train_indices,
                    data.test_indptr, data.test_indices, ks=ks, backend=backend)


def popularity(data: Interactions, ks=(20,), backend="auto") -> dict:
    """Recall/NDCG of ranking every user's unseen items by training popularity."""
    u, v = popularity_scores(data.train_indices, data.num_users, data.num_items)
    return evaluate(u, v, data.train_indptr, data.train_indices, data.test_indptr, data.test_indices,
                    ks=ks, backend=backend, cosine=False)


def format_metrics(m: dict, ks) -> str:
    """"Recall@k R  NDCG@k N" for each k, or why they were not computed."""
    if m.get(f"recall@{ks[0]}") is None:
        return "Recall/NDCG not computed (no test users)"
    return "  ".join(f"Recall@{k} {m[f'recall@{k}']:.4f}  NDCG@{k} {m[f'ndcg@{k}']:.4f}" for k in ks)


def _hits(top: np.ndarray, users: np.ndarray, indptr, indices, num_items) -> np.ndarray:
    """hit[b, r] = 1.0 when top[b, r] is a test item of users[b]."""
    keys = np.repeat(users.astype(np.int64), np.diff(indptr)[users]) * num_items
    keys += np.concatenate([indices[indptr[u]:indptr[u + 1]] for u in users])
    found = users.astype(np.int64)[:, None] * num_items + top
    return np.isin(found, keys).astype(np.float64)


def topk_backend(V: np.ndarray, backend: str = "auto"):
    """`topk(Ub, users, indptr, indices, k)` -> (item indices [B, k], scores [B, k]): the
    best items by inner product with each row of `Ub`, the items of `users` in the CSR
    (`indptr`, `indices`) left out (pass an empty CSR to keep them)."""
    backend = DEFAULT_BACKEND if backend == "auto" else backend
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or 'auto'")
    return _topk_faiss(V) if backend == "faiss" else _topk_torch(V)


def _topk_torch(V: np.ndarray):
    items = torch.from_numpy(V)

    def topk(Ub, users, indptr, indices, k):
        scores = torch.from_numpy(Ub) @ items.T
        counts = np.diff(indptr)[users]
        rows = np.repeat(np.arange(len(users)), counts)
        cols = np.concatenate([indices[indptr[u]:indptr[u + 1]] for u in users]) if len(rows) else rows
        scores[torch.from_numpy(rows), torch.from_numpy(cols.astype(np.int64))] = -torch.inf
        top = scores.topk(k, dim=1)
        return top.indices.numpy(), top.values.numpy()

    return topk


def _topk_faiss(V: np.ndarray):
    try:
        import faiss
    except ImportError:
        raise UserFacingError("--topk faiss needs faiss: pip install 'embcache[faiss]' (or faiss-gpu-cu12), or "
                              "use --topk torch (the same ranking)") from None

    index = faiss.IndexFlatIP(V.shape[1])
    index.add(V)
    num_items = len(V)

    def topk(Ub, users, indptr, indices, k):
        extra = int(np.diff(indptr)[users].max(initial=0))
        kk = min(k + extra, num_items)
        scores, found = index.search(Ub, kk)
        train = np.repeat(users.astype(np.int64), np.diff(indptr)[users]) * num_items
        if len(train):
            train += np.concatenate([indices[indptr[u]:indptr[u + 1]] for u in users])
        masked = np.isin(users.astype(np.int64)[:, None] * num_items + found, train) | (found < 0)
        keep = np.argsort(masked, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(found, keep, axis=1), np.take_along_axis(scores, keep, axis=1)

    return topk
