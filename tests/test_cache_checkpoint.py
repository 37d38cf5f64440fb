"""state_dict mid-training, then continue: identical (to the bit) to never stopping."""
import pytest
import torch

from embcache import CachedEmbeddingBag
from tests.cache_helpers import zipf_batches

N, D = 3000, 6


FREQ = torch.randint(0, 9, (N,), generator=torch.Generator().manual_seed(5))


def make(optimizer, seed=0):
    """`ids_freq` is construction input (the data's statistics), so a resumed run passes
    the same one; the initial table differs with `seed` and must be overwritten."""
    torch.manual_seed(seed)
    return CachedEmbeddingBag(N, D, cache_ratio=0.03, optimizer=optimizer, lr=0.05,
                              ids_freq=FREQ, device="cpu")


def run(bag, batches):
    for ids, offsets in batches:
        (bag(ids, offsets) ** 2).sum().backward()


@pytest.mark.parametrize("optimizer", ["adagrad", "adam", "rowwise_adagrad"])
def test_resume_equals_uninterrupted(optimizer, tmp_path):
    batches = zipf_batches(N, 120, 32, 3, seed=3)
    whole = make(optimizer)
    run(whole, batches)

    first = make(optimizer)
    run(first, batches[:50])
    torch.save(first.state_dict(), tmp_path / "ckpt.pt")
    resumed = make(optimizer, seed=99)  # different initial table: the checkpoint must win
    resumed.load_state_dict(torch.load(tmp_path / "ckpt.pt"))
    run(resumed, batches[50:])

    assert torch.equal(resumed.full_weight(), whole.full_weight())
    sd_a, sd_b = resumed.state_dict(), whole.state_dict()
    for key in sd_a:
        if key != "stats":
            assert torch.equal(sd_a[key], sd_b[key]), key
    # The counters resume too; only the checkpoint's own flush adds device->host bytes.
    got, want = resumed.cache_stats(), whole.cache_stats()
    assert got["bytes_d2h"] > want["bytes_d2h"]
    got.pop("bytes_d2h"), want.pop("bytes_d2h")
    assert got == want


def test_state_dict_holds_full_table_in_id_order_with_state():
    bag = make("adagrad")
    run(bag, zipf_batches(N, 20, 32, 3))
    sd = bag.state_dict()
    assert sd["weight"].shape == (N, D) and sd["optimizer.sum"].shape == (N, D)
    touched = torch.unique(torch.cat([ids for ids, _ in zipf_batches(N, 20, 32, 3)]))
    untouched = torch.ones(N, dtype=torch.bool)
    untouched[touched] = False
    assert bool((sd["optimizer.sum"][touched].sum(1) > 0).all())
    assert bool((sd["optimizer.sum"][untouched] == 0).all())


def test_loading_a_checkpoint_of_another_shape_or_optimizer_fails_clearly():
    sd = make("adagrad").state_dict()
    with pytest.raises(RuntimeError, match="lacks optimizer state|exp_avg"):
        make("adam").load_state_dict(sd)
    other = CachedEmbeddingBag(N + 1, D, cache_ratio=0.03, optimizer="adagrad", device="cpu")
    with pytest.raises(RuntimeError, match="checkpoint table is"):
        other.load_state_dict(sd)
