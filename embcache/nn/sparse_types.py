"""The sparse types' home before they moved to the ground floor (`embcache.sparse_types`, which
the data loaders import too); kept so that `embcache.nn.sparse_types` still answers."""
from embcache.sparse_types import (  # noqa: F401
    HAVE_TORCHREC,
    TORCHREC_ERROR,
    CollectionInterface,
    EmbeddingBagConfig,
    EmbeddingBagConfigLite,
    JaggedTensor,
    JaggedTensorLite,
    KeyedJaggedTensor,
    KeyedJaggedTensorLite,
    KeyedTensor,
    KeyedTensorLite,
    PoolingType,
    PoolingTypeLite,
    __all__,
    pooling_mode,
)
