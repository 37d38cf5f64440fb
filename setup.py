"""embcache: a small, fast working set in front of a huge table.

torchrec is deliberately absent from ``install_requires``: its metadata asks for the
CUDA build of fbgemm-gpu (a 500 MB wheel that breaks the CPU one), so the Makefile
installs it with ``--no-deps`` after this package.
"""
from setuptools import find_packages, setup

setup(
    name="embcache",
    version="0.1.0",
    description="Frequency-aware embedding cache, HEAT CPU kernels and a dynamic class pool",
    python_requires=">=3.11,<3.12",
    # `datasets/` and `bench/` are folders, not packages: `datasets` would shadow
    # Hugging Face's library for every user.
    packages=find_packages(include=["embcache", "embcache.*", "cpu_kernels", "cpu_kernels.*"]),
    install_requires=[
        "torch==2.13.0",
        "fbgemm-gpu-cpu==1.8.0",
        "tensordict==0.15.3",
        "torchmetrics==1.0.3",
        "numpy>=2,<2.5",
        "numba==0.68.1",
        "pyarrow==26.0.1",
        "faiss-cpu==1.15.1",
        "tqdm>=4.66,<5",
        "matplotlib>=3.8,<4",
        "pillow>=10,<14",
        "tensorboard==2.21.0",  # --tensorboard DIR (torch.utils.tensorboard writes through it)
        # torchrec's own run-time dependencies (torchrec itself goes in with --no-deps)
        "iopath",
        "pyre-extensions",
        "typing-inspect",
    ],
    extras_require={
        "test": ["pytest>=8", "hypothesis>=6.100"],
        "gpu": ["faiss-gpu"],
    },
    entry_points={"console_scripts": ["embcache=embcache.cli:main"]},
)
