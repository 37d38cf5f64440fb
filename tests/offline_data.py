"""The real MovieLens-100k copy comes from the recbole wheel on PyPI, fetched on first use:
on a machine without the package registry the tests that need it skip, saying why."""
from __future__ import annotations

import pytest

from embcache.errors import DataFormatError


def load_or_skip(loader, *args, **kwargs):
    """loader(*args, **kwargs), or a skip when the offline copy could not be fetched."""
    try:
        return loader(*args, **kwargs)
    except DataFormatError as err:
        if "could not fetch" in str(err):
            pytest.skip(f"MovieLens-100k not available offline and pip download failed: {err}")
        raise
