"""`python -m embcache ...` is the `embcache` command."""
import sys

from embcache.cli import main

sys.exit(main())
