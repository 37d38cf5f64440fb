"""DLRM's room: the trainer that drives a DLRM through the embedding cache (`trainer`,
`config`, `cli`: `embcache dlrm`), the plain-torch DLRM (`arch`), evaluation (`evaluation`:
AUC, log loss), raw-key data in training (`raw_keys`), export and scoring (`export`,
`predict`; serving itself is `embcache.serve`), the cache planner's command (`cache_cli`,
`plan_cli`: `embcache cache plan`) and its benchmark (`bench`: `embcache bench dlrm`). The
cache is `embcache.cache`, the bags `embcache.nn`, the CTR data format `embcache.data`."""
