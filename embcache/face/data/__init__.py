"""Face data: readers of the formats face datasets come in (an image folder per identity,
MXNet RecordIO `train.rec`/`train.idx`, verification `.bin` pairs), Pillow decoding and the few
transforms needed, a synthetic identity generator, and the identity + instance loaders that
make one pair batch per training step."""
