"""Face classification's room: the trainer of a probe net with a dynamic class pool, full FC
or Partial FC (`trainer`, `config`, `cli`: `embcache face`; `head_factory` picks the head,
`class_sharded` the heads split over ranks), evaluation (`evaluation`: verification, TAR@FAR,
identification), its readers (`data`: image folders, RecordIO, synthetic identities,
verification .bin files) and a trained checkpoint's use (`use`: embed, verify;
`search`: a gallery's nearest identities, or unknown; `onnx_export`), and its benchmark (`bench`, its flags in `bench_cli`: `embcache bench face`;
`traffic`: the trainer's bytes a step, modelled). The heads themselves are modules users put
in models: `embcache.nn`."""
