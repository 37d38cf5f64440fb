"""The PyTorch reference engine: the same models and loss as the HEAT kernels, written the
way a user of the published PyTorch SimpleX would run them (mini-batches, embedding
gathers, batched matmuls for the similarities, autograd, Adam). It is the accuracy oracle
of the tests and the baseline that `embcache bench cf` measures HEAT against."""
from __future__ import annotations


import numpy as np
import torch
import torch.nn.functional as F

from cpu_kernels.model import CFConfig, CFParams
from cpu_kernels.options import TorchOptions  # noqa: F401 (its home before)


def user_side(U, I, W, hist, hist_len, users, config: CFConfig):
    """z for a batch of users: U[users], or SimpleX's gamma*U + (1-gamma)*W mean(history)."""
    u = U[users]
    if not config.simplex:
        return u
    rows = I[hist[users]]                                         # [B, H, d]
    n = hist_len[users]
    mask = (torch.arange(hist.shape[1], device=n.device) < n[:, None]).to(rows.dtype)
    h = (rows * mask[:, :, None]).sum(1) / n.clamp(min=1)[:, None].to(rows.dtype)
    return config.gamma * u + (1.0 - config.gamma) * (h @ W.T)


def cf_loss(U, I, W, hist, hist_len, users, pos, negs, config: CFConfig, reduction="mean"):
    """Cosine contrastive loss (1 - cos(z,p)) + w/K sum_j max(0, cos(z,n_j) - m), per sample,
    then summed or averaged over the batch. All arguments are torch tensors."""
    z = F.normalize(user_side(U, I, W, hist, hist_len, users, config), dim=-1)
    # 1/|i| for the whole table once, gathered per use: cheaper than normalising the
    # gathered [B, K, d] negatives (the dominant tensor) and identical in value
    inv_norm = 1.0 / I.norm(dim=-1).clamp_min(1e-12)
    cos_p = (z * I[pos]).sum(-1) * inv_norm[pos]
    cos_n = torch.bmm(I[negs], z.unsqueeze(-1)).squeeze(-1) * inv_norm[negs]   # [B, K]
    per_sample = (1.0 - cos_p) + config.neg_weight * F.relu(cos_n - config.margin).mean(-1)
    return per_sample.sum() if reduction == "sum" else per_sample.mean()


def _is_seen(seen_keys, keys):
    """keys (user * num_items + item) found in the sorted `seen_keys`."""
    at = torch.searchsorted(seen_keys, keys).clamp_max(len(seen_keys) - 1)
    return seen_keys[at] == keys


def sample_negatives(users, num_items: int, K: int, generator, seen_keys=None, max_redraws: int = 16):
    """K uniform negatives [B, K] for a batch of users (a torch int64 tensor). With
    `seen_keys` (the sorted user * num_items + item of every training pair: the "unseen"
    rule) the candidates that are the user's own items are redrawn, all of a batch's at
    once, at most `max_redraws` rounds; returns (negatives, redraws, negatives still the
    user's). A sorted-key search rather than a users x items mask, which would not fit at
    Gowalla's scale.

    Example:
        >>> keys = torch.tensor([0 * 3 + 0, 0 * 3 + 1])   # user 0 owns items 0 and 1 of 3
        >>> negs, redraws, kept = sample_negatives(torch.tensor([0]), 3, 4, torch.Generator().manual_seed(0), keys)
        >>> negs.tolist(), kept
        ([[2, 2, 2, 2]], 0)
    """
    negs = torch.randint(0, num_items, (len(users), K), generator=generator)
    if seen_keys is None or not len(seen_keys):
        return negs, 0, 0
    base = users[:, None] * num_items
    bad = _is_seen(seen_keys, base + negs)
    redraws = 0
    for _ in range(max_redraws):
        rows, cols = bad.nonzero(as_tuple=True)
        if not len(rows):
            break
        redraws += len(rows)
        fresh = torch.randint(0, num_items, (len(rows),), generator=generator)
        negs[rows, cols] = fresh
        bad[rows, cols] = _is_seen(seen_keys, base[rows, 0] + fresh)
    return negs, redraws, int(bad.sum())


class TorchEngine:
    """Trains `CFParams` in place (the tensors share the numpy arrays' memory) with Adam.

    Example:
        >>> import numpy as np
        >>> users, items = np.array([0, 0, 1, 2]), np.array([1, 3, 2, 0])   # training pairs
        >>> indptr, indices = np.array([0, 2, 3, 4]), np.array([1, 3, 2, 0])  # the same, as CSR
        >>> params = CFParams.init(CFConfig(dim=8, negatives=2), 3, 4, indptr, indices)
        >>> eng = TorchEngine(params, users, items, TorchOptions(batch_size=2))
        >>> stats = eng.epoch(epoch=0)
        >>> stats["samples"], stats["loss"] > 0
        (4, True)
    """

    def __init__(self, params: CFParams, users: np.ndarray, items: np.ndarray,
                 options: TorchOptions = TorchOptions()):
        self.params, self.options = params, options
        self.config = params.config
        self.users = torch.from_numpy(np.asarray(users, dtype=np.int64))
        self.items = torch.from_numpy(np.asarray(items, dtype=np.int64))
        # on the CPU the tensors are the numpy arrays; elsewhere copies, written back to the
        # arrays after every epoch (`_push`) and refreshed from them after a load (`_pull`)
        self.device = torch.device(options.device)
        self.U = torch.from_numpy(params.U).to(self.device).requires_grad_()
        self.I = torch.from_numpy(params.I).to(self.device).requires_grad_()
        self.W = torch.from_numpy(params.W).to(self.device).requires_grad_(self.config.simplex)
        self.hist = torch.from_numpy(params.hist).to(self.device)
        self.hist_len = torch.from_numpy(params.hist_len).to(self.device)
        trainable = [self.U, self.I] + ([self.W] if self.config.simplex else [])
        self.optimizer = torch.optim.Adam(trainable, lr=options.lr)
        self.generator = torch.Generator().manual_seed(self.config.seed)
        self.seen_keys = None  # the "all" rule: no test
        if self.config.negatives_from == "unseen":
            self.seen_keys = torch.unique(self.users * len(params.I) + self.items)  # sorted
        if options.threads:
            torch.set_num_threads(options.threads)

    def state_dict(self) -> dict:
        """What the next epoch needs besides the parameters: Adam's moments and the
        negative sampler's generator."""
        return {"engine": "torch", "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("engine") != "torch":
            raise ValueError(f"the checkpoint was written by the {state.get('engine')} engine, not torch")
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self._pull()

    def _pull(self) -> None:
        """The parameters from `params`' arrays (a loaded checkpoint wrote them there)."""
        if self.device.type != "cpu":
            with torch.no_grad():
                for tensor, array in ((self.U, self.params.U), (self.I, self.params.I), (self.W, self.params.W)):
                    tensor.copy_(torch.from_numpy(array))

    def _push(self) -> None:
        """The parameters into `params`' arrays, where evaluation and checkpoints read them."""
        if self.device.type != "cpu":
            for tensor, array in ((self.U, self.params.U), (self.I, self.params.I), (self.W, self.params.W)):
                array[...] = tensor.detach().cpu().numpy()

    def epoch(self, epoch: int, chunks: int = 1, progress=None, trace=None) -> dict:
        """One pass in the same seeded order as the HEAT engine; `progress(n, loss)` is called
        about `chunks` times. `trace` (a test hook, as HEAT's): a tensor [pairs, K] that
        receives each training pair's negatives."""
        c, o = self.config, self.options
        order = torch.from_numpy(np.random.default_rng((c.seed, epoch)).permutation(len(self.users)))
        n = len(order)
        report_every = max(1, (n // o.batch_size) // max(chunks, 1))
        total, since_n, since_loss = 0.0, 0, 0.0
        redraws, kept = 0, 0
        for step, lo in enumerate(range(0, n, o.batch_size)):
            idx = order[lo:lo + o.batch_size]
            users, pos = self.users[idx], self.items[idx]
            negs, r, k = sample_negatives(users, len(self.params.I), c.negatives, self.generator, self.seen_keys,
                                          o.max_redraws)
            redraws, kept = redraws + r, kept + k
            if trace is not None:
                trace[idx] = negs
            if self.device.type != "cpu":
                users, pos, negs = (t.to(self.device, non_blocking=True) for t in (users, pos, negs))
            loss = cf_loss(self.U, self.I, self.W, self.hist, self.hist_len, users, pos, negs, c)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            batch_loss = float(loss.detach()) * len(idx)
            total += batch_loss
            since_n += len(idx)
            since_loss += batch_loss
            if progress is not None and ((step + 1) % report_every == 0 or lo + o.batch_size >= n):
                progress(since_n, since_loss / since_n)
                since_n, since_loss = 0, 0.0
        self._push()
        return {"loss": total / max(n, 1), "samples": n, "redraws": redraws, "seen_negatives": kept}
