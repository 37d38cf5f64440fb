"""Embedding kernels of our own (Triton), each a torch custom op."""
