"""The three trainers on one run skeleton (`run`: loop, checkpoints, resume, metrics log,
divergence guard; `run_cli`: the flags and summary they share): DLRM over the embedding
cache (`dlrm`), face classification with a dynamic class pool (`face`) and collaborative
filtering with the HEAT kernels (`cf`); each has its evaluation (`*_eval`) and a thin CLI
module (`*_cli`) beside it. `embcache cache plan` (`cache_cli`, `plan_cli`) sizes the DLRM
trainer's cache before training, with the trainer's settings (the planner itself is
`embcache.cache.planner`); `face_heads` builds the face trainer's head."""
