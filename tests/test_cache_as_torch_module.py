"""What a torch user meets using the cache as a library, outside the command line: torch's
idioms for freezing, moving and loading a module, and nn.EmbeddingBag's arguments, each
doing what it says or refused in one line."""
import pytest
import torch

from embcache import CachedEmbeddingBag

N, D = 30, 3


def make_bag(**kwargs) -> CachedEmbeddingBag:
    torch.manual_seed(0)
    settings = dict(cache_ratio=0.5, lr=0.1, device="cpu")
    settings.update(kwargs)
    return CachedEmbeddingBag(N, D, **settings)


def test_requires_grad_false_freezes_the_rows():
    """torch's way to freeze a table: the bag has no parameter, so before the fix it was a
    no-op and the rows kept training."""
    bag, head = make_bag(), torch.nn.Linear(D, 1)
    x = torch.tensor([[1, 2], [3, 29]])
    before = bag.full_weight()
    assert bag.requires_grad_(False) is bag
    out = bag(x)
    assert not out.requires_grad
    head(out).sum().backward()
    assert head.weight.grad is not None
    assert torch.equal(bag.full_weight(), before)
    bag.requires_grad_(True)
    head(bag(x)).sum().backward()
    assert not torch.equal(bag.full_weight(), before)


def test_collection_requires_grad_false_freezes_every_table():
    from embcache import CachedEmbeddingBagCollection
    from embcache.sparse_types import EmbeddingBagConfig, KeyedJaggedTensor

    tables = [EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=20, feature_names=["f0"]),
              EmbeddingBagConfig(name="t1", embedding_dim=2, num_embeddings=10, feature_names=["f1"])]
    ebc = CachedEmbeddingBagCollection(tables, cache_ratio=0.5, device="cpu", lr=0.1)
    kjt = KeyedJaggedTensor(keys=["f0", "f1"], values=torch.tensor([1, 2, 3, 4]),
                            lengths=torch.tensor([2, 1, 0, 1]))
    before = {t: ebc.table_weight(t).clone() for t in ("t0", "t1")}
    ebc.requires_grad_(False)
    out = ebc(kjt).values()
    assert not out.requires_grad
    assert all(torch.equal(ebc.table_weight(t), before[t]) for t in before)


@pytest.mark.parametrize("move, says", [(lambda m: m.double(), "float64"), (lambda m: m.half(), "float16"),
                                        (lambda m: m.to(torch.bfloat16), "bfloat16"),
                                        (lambda m: m.to("meta"), "meta")])
def test_a_move_the_cache_cannot_make_is_refused(move, says):
    """`.to()` / `.half()` changed nothing (the rows are no parameter or buffer) and said
    nothing: a model's `.half()` left the bag's output float32."""
    model = torch.nn.Sequential()
    model.add_module("bag", make_bag())
    with pytest.raises(ValueError, match=f"CachedEmbeddingBag cannot .*{says}") as err:
        move(model)
    assert "\n" not in str(err.value)


def test_a_move_that_changes_nothing_is_taken():
    bag = make_bag()
    assert bag.to("cpu") is bag and bag.float() is bag and bag.cpu() is bag
    assert bag(torch.tensor([[1, 2]])).shape == (1, D)


@pytest.mark.parametrize("name, value", [("padding_idx", 0), ("include_last_offset", True), ("sparse", True),
                                         ("max_norm", 1.0), ("scale_grad_by_freq", True)])
def test_an_embedding_bag_argument_it_lacks_is_named_as_such(name, value):
    """These reached the row optimizer and were refused as "bad argument for optimizer 'sgd'"."""
    with pytest.raises(ValueError, match=f"^{name}: an nn.EmbeddingBag argument") as err:
        make_bag(**{name: value})
    assert "bad argument for optimizer" not in str(err.value)


def test_another_optimizers_state_is_not_dropped_silently():
    """Adagrad's sums loaded into an SGD bag were dropped and the load reported all keys
    matched; now they are unexpected keys, as torch reports them."""
    trained = make_bag(optimizer="adagrad")
    trained(torch.tensor([[1, 2]])).sum().backward()
    sd = trained.state_dict()
    with pytest.raises(RuntimeError, match="optimizer.sum"):
        make_bag(optimizer="sgd").load_state_dict(sd)
    loose = make_bag(optimizer="sgd")
    result = loose.load_state_dict(sd, strict=False)
    assert result.unexpected_keys == ["optimizer.sum"] and not result.missing_keys
    assert torch.equal(loose.full_weight(), trained.full_weight())


@pytest.mark.parametrize("bookkeeping", ["host", "device"])
def test_two_forwards_met_in_one_backward_are_refused(bookkeeping):
    """Two forwards then one backward of their losses (a table shared by two towers) made
    two Adagrad steps where nn.EmbeddingBag makes one: rows 0.1 off, without a word."""
    bag = make_bag(optimizer="adagrad", bookkeeping=bookkeeping)
    x1, x2 = torch.tensor([[1, 2], [3, 4]]), torch.tensor([[2, 5], [1, 1]])
    with pytest.raises(ValueError, match="two forwards of one bag met in one backward") as err:
        (bag(x1).sum() + bag(x2).sum()).backward()
    assert "\n" not in str(err.value)
    first, second = bag(x1), bag(x2)  # forwards in flight, each with its own backward: a step each
    first.sum().backward()
    second.sum().backward()
    bag(x1).sum().backward()


@pytest.mark.parametrize("rows", [20.5, True, "20"])
def test_a_table_size_that_is_no_whole_number_is_refused(rows):
    """int() took 20.5 as a table of 20 rows and True as one of 1, without a word."""
    with pytest.raises(ValueError, match=f"num_embeddings must be a whole number >= 1, got {rows!r}"):
        CachedEmbeddingBag(rows, D, device="cpu")


def test_a_trained_bag_is_saved_whole_as_torch_saves_a_module(tmp_path):
    """`torch.save(model)` of a model holding a trained bag, a forward in flight: what the
    bag keeps beside the cache must pickle (a weakref there did not)."""
    bag = make_bag(optimizer="adagrad")
    bag(torch.tensor([[1, 2]])).sum().backward()
    kept = bag(torch.tensor([[3, 4]]))  # a forward in flight: the copy has none of its own
    torch.save(bag, tmp_path / "bag.pt")
    copy = torch.load(tmp_path / "bag.pt", weights_only=False)
    assert torch.equal(copy.full_weight(), bag.full_weight())
    copy(torch.tensor([[1, 2]])).sum().backward()
    kept.sum().backward()
