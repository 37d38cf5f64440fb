"""`embcache dlrm export` of runs whose closed tables met raw keys (`--raw-keys hash` and
`first-day`): `embcache.serve` scores raw-key requests as the trained model scores the same
rows, to the bit, and a key the run never trained by the run's rule (hash: its bucket;
first-day: row 0, the row later keys shared in training)."""
import json
import shutil

import numpy as np
import pytest
import torch

from embcache.checkpoint import load_checkpoint, save_checkpoint
from embcache.cli import main
from embcache.data.ctr_format import load_key_frequencies
from embcache.data.delimited import splitmix64
from embcache.errors import DataFormatError
from embcache.serve import load_export
from embcache.sparse_types import KeyedJaggedTensor
from embcache.dlrm.trainer import DLRMTrainer
from embcache.dlrm.export import export_checkpoint, verify_export

from tests.test_open_vocab_training import config, days  # noqa: F401 (days: the raw-key data's fixture)

REQUESTS = 64  # rows of never-seen keys


@pytest.fixture(scope="module", params=["hash", "first-day"])
def run(request, days, tmp_path_factory):  # noqa: F811 (the imported fixture)
    """One day (day_0) trained in the mode, its export loaded, and the trainer as training
    left it (the checkpoint's model), in eval mode."""
    root = tmp_path_factory.mktemp(request.param)
    trainer = DLRMTrainer(config(raw_keys=request.param, days="0", checkpoint_dir=str(root / "ck")), days)
    trainer.fit()
    trainer.model.eval()
    export_checkpoint(root / "ck", root / "export")
    return {"mode": request.param, "trainer": trainer, "root": root, "ck": root / "ck", "out": root / "export",
            "model": load_export(root / "export"), "data": days}


def day_batches(trainer, split: str):
    """(raw-key batch, the same rows as training's loader maps them): one batch of the split."""
    raw = next(iter(trainer._batches(split, 4096, map_keys=False)))
    mapped = next(iter(trainer._batches(split, 4096)))
    return raw, mapped


def trainer_logits(trainer, dense: torch.Tensor, ids: dict[str, np.ndarray]) -> torch.Tensor:
    """The trained model's logits of one-hot rows given by table ids."""
    names = list(ids)
    values = torch.from_numpy(np.concatenate([ids[f] for f in names]).astype(np.int64))
    sparse = KeyedJaggedTensor(keys=names, values=values, lengths=torch.ones(len(values), dtype=torch.int64))
    with torch.no_grad():
        return trainer.model(dense, sparse).reshape(-1)


def table_rows(trainer) -> list[int]:
    return [t.num_embeddings for t in trainer.sparse.embedding_bag_configs()]


def hashed(keys: np.ndarray, rows: int) -> np.ndarray:
    """The hash rule computed here: splitmix64(key) % rows."""
    return (splitmix64(keys.view(np.uint64)) % np.uint64(rows)).astype(np.int64)


def test_raw_key_requests_score_as_the_trained_model(run):
    """Day 1 (keys day 0 never trained among them) as raw-key requests: the export's scores
    equal the trained model's bit for bit, and so does `verify_export`; the same keys mapped
    by a wrong rule (first-day: training's own int64-order ids, which the export reorders;
    hash: no splitmix64) score otherwise."""
    trainer, model = run["trainer"], run["model"]
    raw, mapped = day_batches(trainer, "day_1")
    with torch.no_grad():
        want = trainer.model(mapped.dense, mapped.sparse).reshape(-1)
    requests = {f: raw.sparse[f].values().tolist() for f in model.features}
    assert torch.equal(model.logits(requests, raw.dense.numpy()), want)
    assert verify_export(run["ck"], run["out"], split="day_1")["bit_for_bit"]

    def wrong(f, rows):
        keys = raw.sparse[f].values().numpy()
        return mapped.sparse[f].values().numpy() if run["mode"] == "first-day" else \
            (keys.view(np.uint64) % np.uint64(rows)).astype(np.int64)
    wrong_ids = {f: (wrong(f, n), [1] * len(want)) for f, n in zip(model.features, table_rows(trainer))}
    assert not torch.equal(model.logits_of_pooled(model.pool_ids(wrong_ids), raw.dense.numpy()), want)


def test_keys_never_trained_are_scored_by_the_rule(run):
    """Keys never seen (random 64-bit ones): hash: the trained model's scores of their
    buckets; first-day: of row 0, a trained row, not zeros. A first-day run's keys new on a
    later day find row 0 too. A wrong rule (hash: no splitmix64; first-day: row 1) scores
    otherwise."""
    trainer, model = run["trainer"], run["model"]
    keys = np.random.default_rng(3).integers(-2**63, 2**63 - 1, size=(len(model.features), REQUESTS),
                                             dtype=np.int64)
    dense = day_batches(trainer, "day_1")[0].dense[:REQUESTS]
    got = model.logits({f: k.tolist() for f, k in zip(model.features, keys)}, dense.numpy())
    rows = table_rows(trainer)
    if run["mode"] == "hash":
        right = [hashed(k, n) for k, n in zip(keys, rows)]
        wrong = [(k.view(np.uint64) % np.uint64(n)).astype(np.int64) for k, n in zip(keys, rows)]
    else:
        right, wrong = [np.zeros(REQUESTS, np.int64)] * len(keys), [np.ones(REQUESTS, np.int64)] * len(keys)
        assert not torch.equal(model.tables[2][0], torch.zeros(model.tables[2].shape[1]))
        first = load_key_frequencies(run["data"], split="day_0")
        later = load_key_frequencies(run["data"], split="day_2")
        new = np.setdiff1d(later["sparse_2"][0].numpy(), first["sparse_2"][0].numpy())
        assert len(new) and model.lookups[2].ids(new.tolist()).tolist() == [0] * len(new)
    assert torch.equal(got, trainer_logits(trainer, dense, dict(zip(model.features, right))))
    assert not torch.equal(got, trainer_logits(trainer, dense, dict(zip(model.features, wrong))))


def test_the_manifest_states_the_rule(run):
    """hash: {"rule": "hash", "rows": N} and no keys; first-day: the first day's keys, as
    uint64 in ascending order (the served lookup's order), one per row after row 0."""
    manifest = run["model"].manifest
    first = load_key_frequencies(run["data"], split="day_0")
    for table, lookup in zip(manifest["tables"], run["model"].lookups):
        vocab = table["vocabulary"]
        assert vocab["rule"] == run["mode"] and vocab["key"] == "raw" and not vocab["open"]
        if run["mode"] == "hash":
            assert vocab["rows"] == table["rows"] and "keys_file" not in vocab
        else:
            keys = first[table["feature"]][0].numpy()
            assert np.array_equal(lookup.keys, np.sort(keys.view(np.uint64)))
            assert table["rows"] == len(keys) + 1


def test_bad_input_is_one_line(run, tmp_path, capsys):
    """A checkpoint from before the key map was recorded still exports (to the bit); one whose
    record the data does not rebuild (other first-day keys, other sizes) is refused in one
    line; a manifest of an unknown rule, or of a hash rule on other rows, is one line too."""
    ck = load_checkpoint(run["ck"] / "dlrm-last.pt", kind="dlrm")
    assert ck["key_map"]["rule"] == run["mode"]
    old = tmp_path / "old"
    shutil.copytree(run["ck"], old)
    save_checkpoint({k: v for k, v in ck.items() if k != "key_map"}, old / "dlrm-last.pt", kind="dlrm")
    export_checkpoint(old, tmp_path / "old-export")
    assert verify_export(old, tmp_path / "old-export", split="day_1")["bit_for_bit"]

    save_checkpoint({**ck, "key_map": {**ck["key_map"], "rows": [r + 1 for r in ck["key_map"]["rows"]]}},
                    old / "dlrm-last.pt", kind="dlrm")
    assert main(["dlrm", "export", str(old), "--out", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "do not rebuild the key map" in err, err
    assert not (tmp_path / "x").exists()

    edited = tmp_path / "edited"
    shutil.copytree(run["out"], edited)
    manifest = json.loads((edited / "manifest.json").read_text())
    for rule, rows, match in (("bogus", None, "rule 'bogus' is not one of"), ("hash", 1, "not the table's")):
        manifest["tables"][2]["vocabulary"].update(rule=rule, rows=rows)
        (edited / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(DataFormatError, match=match):
            load_export(edited)
