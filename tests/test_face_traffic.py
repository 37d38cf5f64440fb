"""`bench scaling`'s face traffic model (`embcache.face.traffic`) against the bytes the
face trainer's steps hand to their collectives (`CollectiveMeter`, the summary's
`comm_bytes_per_step`): equal, collective by collective, at 2 ranks with either batch norm
and at 1 rank (nothing); the model's arithmetic on a toy config; the meter itself on stand-in
collectives."""
import pytest
import torch
import torch.distributed as dist

from embcache.face.traffic import face_traffic_model, probe_shape
from embcache.face.trainer import CollectiveMeter, FaceTrainer
from tests.test_face_distributed import config, run_ranks

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ------------------------------------------------------------------ the model's arithmetic
def test_the_model_s_terms_on_a_toy_config():
    # B = 40: 10 pairs; d = 3: rows of 2*3 + 1 = 7 float64s; batch norms of 2 and 5 channels; 7 parameters
    toy = dict(batch_size=40, feat_dim=3, bn_channels=[2, 5], params=7)
    two = face_traffic_model(**toy, world=2)
    # gallery: 5 pairs a rank + the header row = 6 rows of 7, to the 1 other rank: 6 * 7 * 8
    # batch norm: 4 rows (2 gallery views, probe forward, probe backward) of 2c + 1: 4*5*8 + 4*11*8
    # DDP: 7 float32 gradients, all-gathered once
    assert two == {"gallery_allgather": 336.0, "batch_norm_allreduce": 512.0, "ddp_gradients": 28.0}
    # 3 ranks: ceil(10 / 3) = 4 pairs + the header, to 2 others; all-reduces at 2(N-1)/N = 4/3 their bytes
    three = face_traffic_model(**toy, world=3)
    assert three == pytest.approx({"gallery_allgather": 2 * 5 * 7 * 8, "batch_norm_allreduce": 512 * 4 / 3,
                                   "ddp_gradients": 28 * 4 / 3}, rel=1e-15)
    # fewer identities with two samples than B // 4: 6 pairs, 3 a rank
    assert face_traffic_model(**toy, world=2, identities=6)["gallery_allgather"] == 4 * 7 * 8
    # local batch norm: no batch-norm traffic, the rest unchanged
    assert face_traffic_model(**toy, world=2, batch_norm="local") == {**two, "batch_norm_allreduce": 0.0}
    assert set(face_traffic_model(**toy, world=1).values()) == {0.0}
    with pytest.raises(ValueError, match="batch_norm"):
        face_traffic_model(**toy, world=2, batch_norm="sync")


def test_probe_shape_counts_the_mlp_by_hand():
    channels, params = probe_shape("mlp", 128, (64,))
    assert channels == [256, 256, 128]
    # three linear layers (weights and biases) and three batch norms (weight and bias each)
    assert params == (64 * 256 + 256) + (256 * 256 + 256) + (256 * 128 + 128) + 2 * (256 + 256 + 128) == 116_608


# --------------------------------------------------------------- the meter, on stand-ins
def gather_rows_and_counts():  # named as the callers the meter knows
    dist.all_gather([], torch.zeros(4, 5, dtype=torch.float64))  # 160 bytes


def _gather_sum_hook():
    dist.all_gather([], torch.zeros(10))  # 40 bytes


class _AllReduce:
    @staticmethod
    def forward():
        dist.all_reduce(torch.zeros(6, dtype=torch.float64))  # 48 bytes


def somewhere_else():
    dist.all_reduce(tensor=torch.zeros(3))  # 12 bytes


def test_the_meter_counts_what_each_caller_hands_to_a_collective(monkeypatch):
    calls = []
    monkeypatch.setattr(dist, "all_gather", lambda parts, t, **kw: calls.append("all_gather"))
    monkeypatch.setattr(dist, "all_reduce", lambda t=None, **kw: calls.append("all_reduce"))
    stand_ins = dist.all_gather, dist.all_reduce
    meter = CollectiveMeter(3)
    for _ in range(2):
        with meter:
            gather_rows_and_counts(), _gather_sum_hook(), _AllReduce.forward(), somewhere_else()
    assert (dist.all_gather, dist.all_reduce) == stand_ins  # put back
    assert calls == ["all_gather", "all_gather", "all_reduce", "all_reduce"] * 2
    # 3 ranks: an all-gather's tensor goes to 2 others, an all-reduce sends 4/3 of its bytes
    assert meter.per_step() == pytest.approx({"gallery_allgather": 320, "ddp_gradients": 80,
                                              "batch_norm_allreduce": 64, "all_reduce by somewhere_else": 16})
    with CollectiveMeter(1):  # one process: nothing replaced
        assert (dist.all_gather, dist.all_reduce) == stand_ins


# -------------------------------------------------------- the model against the trainer
# 36 images a step: 9 pairs (4 and 5 a rank: rank 1's slice is padded), 18 instances; d = 32
RUN = dict(head="dcp", batch_size=36, feat_dim=32, max_steps=3)


def model_for(world: int, norm: str) -> dict:
    channels, params = probe_shape("mlp", RUN["feat_dim"], (64,))  # config()'s synthetic vectors of 64
    return face_traffic_model(RUN["batch_size"], RUN["feat_dim"], channels, params, world, norm,
                              identities=config().num_classes)


@pytest.mark.parametrize("norm", ["global", "local"])
def test_the_model_is_the_measured_bytes_at_2_ranks(tmp_path, norm):
    ranks = run_ranks(tmp_path, **RUN, batch_norm=norm)
    model = model_for(2, norm)
    # every byte counted, exactly: the sizes are the config's (padded to the widest slice), not the data's
    for r, dump in enumerate(ranks):
        assert dump["summary"]["steps"] == 3
        assert dump["summary"]["comm_bytes_per_step"] == model, f"rank {r}"
    print(f"--batch-norm {norm}, 2 ranks: {model}")
    assert (model["batch_norm_allreduce"] > 0) == (norm == "global")


def test_one_process_sends_nothing():
    summary = FaceTrainer(config(**RUN)).fit()
    assert summary["comm_bytes_per_step"] == model_for(1, "global")
    assert set(summary["comm_bytes_per_step"].values()) == {0.0}
