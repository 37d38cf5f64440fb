"""`cf train --save FILE.parquet` wrote each user and item row with `id` its row number: the
user your file calls `u0` read as `id 0`, and nothing in the file gave your ids back. A
`your_id` column now holds them (null for SimpleX's W rows); `id` stays the row."""
from __future__ import annotations

import pyarrow.parquet as pq

from embcache.cf.data.embeddings_file import load
from embcache.cli import main


def test_parquet_embeddings_name_users_and_items_by_your_ids(tmp_path):
    source = tmp_path / "clicks.csv"
    rows = [(f"u{u}", f"0{(u * 7 + t) % 13}", t) for u in range(12) for t in range(5)]
    source.write_text("user_id,item_id,ts\n" + "".join(f"{u},{i},{t}\n" for u, i, t in rows))
    out = tmp_path / "emb.parquet"
    assert main(["cf", "train", "--data", str(source), "--time-col", "ts", "--epochs", "1", "--dim", "4",
                 "--negatives", "4", "--no-progress", "--save", str(out)]) == 0
    table = pq.read_table(out).drop(["vector"]).to_pylist()
    users = [r for r in table if r["kind"] == "user"]
    items = [r for r in table if r["kind"] == "item"]
    assert [r["your_id"] for r in users] == sorted({u for u, _, _ in rows})  # numbered in sorted order
    assert [r["your_id"] for r in items] == sorted({i for _, i, _ in rows})  # '05' kept as the file has it
    assert [r["id"] for r in users] == list(range(len(users)))
    assert all(r["your_id"] is None for r in table if r["kind"] == "W")
    U, I, _, _ = load(out)  # still read back as before
    assert U.shape == (12, 4) and I.shape == (13, 4)
