"""A synthetic implicit-feedback set shaped like Gowalla (~30k users, 40k items, 1M
interactions): power-law user and item degrees, and a hidden community structure so that a
trained model must beat popularity. For benchmarks and smoke runs; needs no download."""
from __future__ import annotations

import numpy as np

from embcache.cf.data.interactions import TEST_FRACTION, Interactions
from embcache.cf.data.ratings import split_ratings


def power_law_interactions(num_users: int = 30_000, num_items: int = 40_000,
                           interactions: int = 1_000_000, communities: int = 100,
                           in_community: float = 0.8, user_exponent: float = 0.8,
                           item_exponent: float = 0.9, min_degree: int = 3, seed: int = 0,
                           test_fraction: float = TEST_FRACTION) -> Interactions:
    """Draw distinct interactions, then split each user 80/20 at random.

    Args:
        user_exponent, item_exponent: degree of the rank-r user / item is ~ r^-exponent.
        communities: users and items each belong to one; `in_community` of a user's
            interactions pick items of its own community (by popularity), the rest any item.
        min_degree: every user gets at least this many draws (before duplicates go and
            before the draws are cut down to `interactions`).
    """
    if interactions < num_users * min_degree:
        raise ValueError("interactions must be at least num_users * min_degree")
    if interactions > num_users * num_items // 4:
        raise ValueError("interactions must be at most a quarter of num_users * num_items")
    rng = np.random.default_rng(seed)
    u_w = _power_weights(num_users, user_exponent, rng)
    i_w = _power_weights(num_items, item_exponent, rng)
    user_comm = rng.integers(0, communities, num_users)
    item_comm = rng.integers(0, communities, num_items)
    # popular pairs repeat, so draw more than wanted (growing the draws until the distinct
    # pairs suffice) and keep exactly `interactions` of them
    draws = interactions
    for _ in range(30):
        pairs = _draw_pairs(draws, num_users, num_items, u_w, i_w, user_comm, item_comm,
                            communities, in_community, min_degree, rng)
        if len(pairs) >= interactions:
            break
        draws = int(draws * max(interactions / len(pairs), 1.0) * 1.2)
    else:
        raise ValueError(f"could not draw {interactions:,} distinct pairs; lower interactions or the skew")
    keep = np.sort(rng.permutation(len(pairs))[:interactions])
    users, items = np.divmod(pairs[keep], num_items)
    ratings = np.stack([users, items, np.ones_like(users), np.arange(len(users))], axis=1)
    return split_ratings(ratings, "random", test_fraction, seed,
                         name=f"synthetic-{num_users}x{num_items}", num_users=num_users,
                         num_items=num_items)


def _draw_pairs(draws, num_users, num_items, u_w, i_w, user_comm, item_comm, communities,
                in_community, min_degree, rng) -> np.ndarray:
    """Distinct pair keys user*num_items+item from `draws` draws."""
    # degrees: a floor plus a power-law share of the rest
    deg = min_degree + rng.multinomial(max(draws - num_users * min_degree, 0), u_w)
    users = np.repeat(np.arange(num_users), deg)
    items = _draw(i_w, np.arange(num_items), len(users), rng)
    local = np.flatnonzero(rng.random(len(users)) < in_community)
    local_comm = user_comm[users[local]]
    for c in range(communities):
        members = np.flatnonzero(item_comm == c)
        picks = local[local_comm == c]
        if len(members) and len(picks):
            items[picks] = _draw(i_w[members], members, len(picks), rng)
    return np.unique(users.astype(np.int64) * num_items + items)


def _power_weights(n: int, exponent: float, rng) -> np.ndarray:
    w = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    w = w[rng.permutation(n)]
    return w / w.sum()


def _draw(weights: np.ndarray, ids: np.ndarray, size: int, rng) -> np.ndarray:
    cdf = np.cumsum(weights)
    pos = np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right")
    return ids[np.minimum(pos, len(ids) - 1)]
