"""`embcache cache`: size the embedding cache before training, from a prepared data set."""

COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("embcache.dlrm.plan_cli",
             "predicted hit rate of freq/lfu/lru, device/host memory and traffic by cache size"),
}
