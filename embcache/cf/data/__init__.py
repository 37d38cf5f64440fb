"""CF data: `Interactions` (train/test CSR) and its readers (LightGCN text, MovieLens
ratings), the synthetic power-law set, and the embeddings files `embcache cf` saves and loads."""
