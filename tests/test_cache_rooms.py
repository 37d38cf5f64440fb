"""`embcache.cache` in rooms (bookkeeping, stores, open_keys, planning): code written against
the flat layout (`embcache.cache.row_cache`) still imports, and gets the one module object."""
import importlib
import pathlib
import subprocess
import sys

import embcache.cache as cache


def test_every_moved_module_imports_by_its_old_name_as_the_same_object():
    for old, new in cache.MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new)
        assert importlib.import_module(new).__spec__.name == new  # its own spec, not the alias's


def test_the_old_from_import_and_a_patch_through_the_old_name_reach_the_new_module(monkeypatch):
    from embcache.cache import planner, row_cache

    from embcache.cache.bookkeeping import row_cache as moved
    assert row_cache is moved and planner.__name__ == "embcache.cache.planning.planner"
    monkeypatch.setattr("embcache.cache.row_cache.MAX_PENDING_PREFETCHES", 99)
    assert moved.MAX_PENDING_PREFETCHES == 99


def test_no_module_is_left_flat_and_every_room_is_listed():
    here = pathlib.Path(cache.__file__).parent
    flat = {p.stem for p in here.glob("*.py")} - {"__init__"}
    assert flat == {"choices", "optimizers", "stats"}
    rooms = {p.parent.name for p in here.glob("*/__init__.py")}
    assert rooms == {new.split(".")[2] for new in cache.MOVED.values()}
    for new in cache.MOVED.values():  # each alias points at a file that is there
        assert (here / new.split(".")[2] / f"{new.split('.')[3]}.py").is_file()


def test_an_unknown_name_still_fails_as_python_says():
    code = "import embcache.cache.no_such_module"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1 and "ModuleNotFoundError" in out.stderr
