"""Implicit-feedback data for CF: `Interactions`, train and test as CSR (user -> sorted
items), and the two ways to build it from (user, item) pairs, `to_csr` and `from_pairs`.

Example:
    >>> data = from_pairs([0, 0, 1], [2, 0, 1], [1], [2])
    >>> data.summary()
    'data: 2 users, 3 items, 3 train / 1 test interactions'
    >>> data.train_indices.tolist(), data.train_indptr.tolist()
    ([0, 2, 1], [0, 2, 3])
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from embcache.data.bad_rows import BadRowLog

SPLITS = ("random", "time")
TEST_FRACTION = 0.2  # the default test share per user of every split here


@dataclass
class Interactions:
    """Train and test interactions as CSR (indptr [users+1], indices: item ids, sorted per
    user, no duplicates). `bad_rows` counts the input lines that were skipped, per file."""

    num_users: int
    num_items: int
    train_indptr: np.ndarray
    train_indices: np.ndarray
    test_indptr: np.ndarray
    test_indices: np.ndarray
    name: str = ""
    bad_rows: BadRowLog = field(default_factory=BadRowLog)
    # the ids of your own data: user_ids[u] is index u's id in the file (None: the ids are the indices)
    user_ids: np.ndarray | None = None
    item_ids: np.ndarray | None = None
    duplicates: int = 0  # repeated (user, item) rows merged into one interaction
    # test users and items with no training interaction ("users", "user_interactions", "items",
    # "item_interactions"): the users' pairs left out of the test split, the items' kept (LightGCN's reader)
    cold_test: dict = field(default_factory=dict)

    @property
    def num_train(self) -> int:
        return len(self.train_indices)

    @property
    def num_test(self) -> int:
        return len(self.test_indices)

    def train_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(users, items) of every training interaction, int32."""
        users = np.repeat(np.arange(self.num_users, dtype=np.int32), np.diff(self.train_indptr))
        return users, self.train_indices.astype(np.int32)

    def item_degrees(self) -> np.ndarray:
        return np.bincount(self.train_indices, minlength=self.num_items)

    def summary(self) -> str:
        s = (f"{self.name or 'data'}: {self.num_users} users, {self.num_items} items, "
             f"{self.num_train} train / {self.num_test} test interactions")
        if self.duplicates:
            s += f"; merged {self.duplicates:,} repeated (user, item) row(s)"
        if self.bad_rows.total:
            carried = self.bad_rows.carried
            s += f"; skipped {self.bad_rows.total} malformed line(s)"
            s += "" if carried is None else f" with {carried:,} interaction(s) in them"
        return s + self._cold_clauses()

    def _cold_clauses(self) -> str:
        """What the data line says of `cold_test`: a figure the user could not tell from the
        metrics alone (a cold user left out, a cold item ranked like the rest)."""
        cold, s = self.cold_test, ""
        if cold.get("users"):
            s += (f"; {cold['users']:,} test user(s) ({cold['user_interactions']:,} interaction(s)) not in training, "
                  f"left out of evaluation")
        if cold.get("items"):
            s += (f"; {cold['items']:,} test item(s) ({cold['item_interactions']:,} interaction(s)) not in training, "
                  f"kept in evaluation (trained only as negatives)")
        return s


def to_csr(users: np.ndarray, items: np.ndarray, num_users: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR of (user, item) pairs: sorted by user then item, duplicates removed."""
    users = np.asarray(users, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    if len(users):
        key = np.unique(users * (int(items.max()) + 1) + items)
        users, items = np.divmod(key, int(items.max()) + 1)
    indptr = np.zeros(num_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(users, minlength=num_users), out=indptr[1:])
    return indptr, items.astype(np.int64)


def from_pairs(train_u, train_i, test_u, test_i, num_users=None, num_items=None, name="",
               bad_rows=None) -> Interactions:
    """Interactions from (user, item) arrays; sizes default to the largest id + 1."""
    all_u = np.concatenate([train_u, test_u]).astype(np.int64)
    all_i = np.concatenate([train_i, test_i]).astype(np.int64)
    nu = int(num_users if num_users is not None else (all_u.max() + 1 if len(all_u) else 0))
    ni = int(num_items if num_items is not None else (all_i.max() + 1 if len(all_i) else 0))
    tr = to_csr(train_u, train_i, nu)
    te = to_csr(test_u, test_i, nu)
    return Interactions(nu, ni, *tr, *te, name=name, bad_rows=bad_rows or BadRowLog())
