"""The routing of a hybrid-parallel batch on 2 spawned gloo ranks: what each owner receives
(every rank's lookups into its shards, in global sample order, row-wise ids shifted), and
how many collectives it takes: one all-to-all of the ids per batch (two when a block
outgrows the capacity the ranks agreed on), and a DLRM training step's count in all.

Ranks are spawned here and enter `embcache.distributed.world.launch()` themselves; each
writes what the test compares to a file."""
from __future__ import annotations

import collections
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from embcache.distributed import placement
from tests.torchrun_helpers import free_port

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")

# table name, its features, rows; "c" (200 rows) is split by rows over the 2 ranks
TABLES = [("a", ("fa",), 50), ("b", ("fb1", "fb2"), 30), ("c", ("fc",), 200), ("d", ("fd",), 40)]
FEATURES = [f for _, fs, _ in TABLES for f in fs]
# per batch: (rank 0's samples, rank 1's, most ids a sample has of a feature); batch 2's
# blocks outgrow the capacity the ranks agreed on after batch 1; the others are no larger
# than the batch before
BATCHES = [(5, 7, 3), (4, 5, 2), (9, 8, 12), (6, 5, 3), (3, 2, 2)]


def shards() -> list[placement.Shard]:
    return placement.plan([placement.TableLoad(n, fs, rows) for n, fs, rows in TABLES], 2, row_wise_rows=100)


def _init(rank: int, size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)


def _count_all_to_alls(counts: collections.Counter, events: list | None = None) -> None:
    """Count this process's `all_to_all_single` calls: "ids" (integer buffers) or "pooled"
    (and list them in order in `events`)."""
    original = dist.all_to_all_single

    def counted(output, input, *args, **kwargs):
        kind = "pooled" if output.dtype.is_floating_point else "ids"
        counts[kind] += 1
        if events is not None:
            events.append(kind)
        return original(output, input, *args, **kwargs)

    dist.all_to_all_single = counted


class _Recorder(nn.Module):
    """A local collection that keeps the batches it is asked for and pools nothing."""

    def __init__(self, configs):
        super().__init__()
        self.configs, self.seen = configs, []

    def forward(self, kjt):
        from embcache.sparse_types import KeyedTensor

        self.seen.append({"keys": list(kjt.keys()), "lengths": kjt.lengths().clone(), "values": kjt.values().clone()})
        width = [8] * len(kjt.keys())
        return KeyedTensor(keys=kjt.keys(), length_per_key=width, values=torch.zeros(kjt.stride(), sum(width)))


def _route_rank(rank: int, size: int, port: int, out: str) -> None:
    _init(rank, size, port)
    from embcache.distributed.sharded_collection import ShardedEmbeddingBagCollection
    from embcache.distributed.world import launch
    from embcache.sparse_types import EmbeddingBagConfig, KeyedJaggedTensor

    counts = collections.Counter()
    _count_all_to_alls(counts)
    with launch(torch.device("cpu"), 60.0):
        configs = [EmbeddingBagConfig(name=n, embedding_dim=8, num_embeddings=rows, feature_names=list(fs))
                   for n, fs, rows in TABLES]
        collection = ShardedEmbeddingBagCollection(configs, shards(), _Recorder)
        sent, calls = [], []
        for i, (*batch, most) in enumerate(BATCHES):
            g = torch.Generator().manual_seed(100 * i + rank)
            lengths = torch.randint(0, most + 1, (len(FEATURES), batch[rank]), generator=g)
            rows = {f: n for _, fs, n in TABLES for f in fs}
            values = torch.cat([torch.randint(0, rows[f], (int(n),), generator=g)
                                for f, n in zip(FEATURES, lengths.sum(1))])
            kjt = KeyedJaggedTensor(keys=FEATURES, values=values, lengths=lengths.reshape(-1))
            before = counts["ids"]
            features = collection(kjt)
            calls.append(counts["ids"] - before)
            assert features.values().shape == (batch[rank], 8 * len(FEATURES))
            sent.append({"lengths": lengths, "values": values})
        torch.save({"sent": sent, "seen": collection.local.seen, "ids_all_to_alls": calls},
                   os.path.join(out, f"rank{rank}.pt"))


def _expected(owner: int, sent: list[dict]) -> dict:
    """What `owner` must look up for one batch, built sample by sample from every rank's
    batch: its features' lookups, rank 0's samples then rank 1's, row-wise ids shifted."""
    keys, lengths, values = [], [], []
    for shard in (s for s in shards() if s.rank == owner):
        for f in shard.features:
            keys.append(shard.feature_key(f))
            j = FEATURES.index(f)
            for batch in sent:
                per_feature = batch["values"].split(batch["lengths"].sum(1).tolist())[j]
                for ids in per_feature.split(batch["lengths"][j].tolist()):
                    mine = [int(x) - shard.row_start for x in ids if shard.row_start <= x < shard.row_stop]
                    lengths.append(len(mine))
                    values += mine
    return {"keys": keys, "lengths": torch.tensor(lengths, dtype=torch.long),
            "values": torch.tensor(values, dtype=torch.long)}


def test_each_owner_receives_every_ranks_lookups_in_global_sample_order_in_one_all_to_all(tmp_path):
    assert [(s.name, s.rank) for s in shards()] == [("a", 0), ("b", 1), ("c@0", 0), ("c@100", 1), ("d", 1)]
    mp.start_processes(_route_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, start_method="spawn", join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for i in range(len(BATCHES)):
        for owner in range(2):
            seen = ranks[owner]["seen"][i]
            expected = _expected(owner, [ranks[r]["sent"][i] for r in range(2)])
            assert seen["keys"] == expected["keys"], (i, owner)
            assert torch.equal(seen["lengths"], expected["lengths"]), (i, owner)
            assert torch.equal(seen["values"], expected["values"]), (i, owner)
    # the first batch finds no capacity agreed yet (headers only: its blocks follow in a second
    # all-to-all), as does batch 2, whose blocks outgrow it; every other batch takes one
    assert ranks[0]["ids_all_to_alls"] == ranks[1]["ids_all_to_alls"] == [2, 1, 2, 1, 1]


def _train_rank(rank: int, size: int, port: int, data: str, out: str) -> None:
    _init(rank, size, port)
    from embcache.distributed.data_parallel import unwrap
    from embcache.distributed.world import launch
    from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer

    counts, events = collections.Counter(), []
    _count_all_to_alls(counts, events)
    original = dist.all_reduce

    def all_reduce(*args, **kwargs):
        counts["all_reduce"] += 1
        return original(*args, **kwargs)

    dist.all_reduce = all_reduce
    # one-hot features and no row-wise table: every full batch's blocks are the same size
    cfg = DLRMConfig(batch_size=256, embedding_dim=8, dense_arch=[16], over_arch=[16], device="cpu", progress=False,
                     epochs=1, max_steps=6, cache_ratio=0.05, row_wise_rows=10**9, checkpoint_dir=os.path.join(out, "ck"))
    with launch(torch.device("cpu"), 60.0):
        trainer = DLRMTrainer(cfg, data)
        per_step, order, step = [], [], trainer.train_step
        bottom = unwrap(trainer.model.dense_arch)
        bottom.register_forward_pre_hook(lambda *_: events.append("bottom_mlp"))
        bottom.register_full_backward_pre_hook(lambda *_: events.append("bottom_mlp_backward"))

        def counted(*args, **kwargs):
            before = collections.Counter(counts)
            events.clear()
            loss = step(*args, **kwargs)
            per_step.append(dict(counts - before))
            order.append(list(events))
            return loss

        trainer.train_step = counted
        trainer.fit()
        torch.save({"per_step": per_step, "order": order, "prefetch_depth": trainer.cfg.prefetch_depth},
                   os.path.join(out, f"rank{rank}.pt"))
        del trainer  # before the process group goes (a DDP reducer outliving it can hang the exit)


def test_a_dlrm_training_step_makes_one_all_to_all_of_ids_and_one_of_pooled_embeddings_each_way(
        small_synthetic, tmp_path):
    mp.start_processes(_train_rank, args=(2, free_port(), str(small_synthetic), str(tmp_path)), nprocs=2,
                       start_method="spawn", join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert ranks[0]["per_step"] == ranks[1]["per_step"]
    first, *steady = ranks[0]["per_step"]
    depth = ranks[0]["prefetch_depth"]
    assert depth >= 1
    # the first step routes its own batch (headers first: no capacity agreed yet) and
    # prefetches `depth` batches; no rank is asked how many are pending (the trainer's
    # pipeline holds a ticket for each), so its all-reduces are DDP's alone
    assert first == {"ids": 2 + depth, "pooled": 2, "all_reduce": 2}
    # then a step routes the next batch in one all-to-all (its ids, lengths and sizes in one
    # buffer), sends the pooled embeddings in one and their gradients back in one; DDP
    # all-reduces the two MLPs' gradients
    assert steady == [{"ids": 1, "pooled": 2, "all_reduce": 2}] * 5
    # the pooled embeddings are on their way before the bottom MLP runs (it overlaps them),
    # and their gradients before the bottom MLP's backward runs (it overlaps those)
    for order in ranks[0]["order"]:
        assert [e for e in order if e != "ids"] == ["pooled", "bottom_mlp", "pooled", "bottom_mlp_backward"]
