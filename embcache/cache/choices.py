"""The cache's named choices, here so that the command line can offer them (and its
`--help` show them) without importing torch: eviction policies, row optimizers, and the
cache ratios the planner tries."""

POLICIES = ("freq", "lfu", "lru")
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam")
# those with a torch sparse optimizer that equals them (`optimizers.TORCH_EQUIVALENTS`)
TORCH_OPTIMIZERS = ("sgd", "adagrad", "adam")
PLANNED_RATIOS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.10, 0.25)
