"""Runs beyond one process on `torch.distributed`, launched by `torchrun`: the world (ranks,
start-up, failures), placement of embedding tables on ranks, the sharded embedding
collection (all-to-all of ids and pooled embeddings), the data-parallel dense part, and the
one logical checkpoint any world size resumes. A run without torchrun is world size 1."""
