"""The run skeleton the three trainers stand on (`run`: loop, checkpoints, resume, metrics
log, divergence guard; `run_cli`: the flags and summary they share; `run_config`: the run
settings; `tensorboard_log`; `best_score`: the word when a run ends below its best), and
what every benchmark writes beside its numbers (`bench_results`). The trainers live in their
rooms: `embcache.dlrm`, `embcache.face`, `embcache.cf`."""
