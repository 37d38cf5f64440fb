"""Open tables: raw 64-bit keys mapped to rows as they come, their index, counts and kernels."""
