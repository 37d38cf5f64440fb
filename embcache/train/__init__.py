"""Training loops: DLRM over the embedding cache (`dlrm`), face classification with a
dynamic class pool (`face`); each has a thin CLI module beside it."""
