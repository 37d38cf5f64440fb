"""Tests that stand in for a user's hand-made shard (a wrong column type, an id out of
range) write it with `write_shard`, which records its CRC-32 in meta.json as preparing the
data would: the row checks, not the checksum, are then what the test meets."""
import json
from pathlib import Path

import pyarrow.parquet as pq

from embcache.integrity import file_crc32


def write_shard(table, path, **kwargs) -> None:
    path = Path(path)
    pq.write_table(table, path, **kwargs)
    root = next(p for p in path.parents if (p / "meta.json").is_file())
    meta = json.loads((root / "meta.json").read_text())
    if "shard_crc32" in meta:
        meta["shard_crc32"][path.relative_to(root).as_posix()] = file_crc32(path)
        (root / "meta.json").write_text(json.dumps(meta))
