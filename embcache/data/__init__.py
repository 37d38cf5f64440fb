"""Data readers and generators. The CTR side here: the canonical on-disk format (Parquet
shards + meta.json), its batch loader, id-frequency statistics, converters from public
formats and a synthetic generator; `cf/` and `face/` hold the other two trainers' data.
Nothing heavy is imported here: each module is imported where it is used (see `embcache data`)."""
