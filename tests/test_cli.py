import subprocess
import sys

from embcache.cli import main


def test_top_level_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    from embcache.cli import COMMANDS

    for name in COMMANDS:
        assert name in out


def test_unknown_command_is_one_clear_line(capsys):
    assert main(["no-such-thing"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'no-such-thing'" in err and "Traceback" not in err


def test_help_does_not_import_torch():
    code = "import sys; from embcache.cli import main; main(['--help']); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False")


def test_library_log_lines_are_printed_once_on_stdout_and_warnings_on_stderr(capsys):
    """The library reports through `logging`; a command prints those lines itself, once,
    even when something else gave the root logger a handler (as some dependencies do)."""
    import logging

    from embcache.cli import console_logging

    root_handler = logging.StreamHandler(sys.stderr)
    logging.getLogger().addHandler(root_handler)
    try:
        with console_logging():
            logging.getLogger("embcache.train.run").info("epoch 1: done")
            logging.getLogger("embcache.cf.trainer").warning("the test split is empty")
        logging.getLogger("embcache.train.run").info("after the command: not printed")
    finally:
        logging.getLogger().removeHandler(root_handler)
    out, err = capsys.readouterr()
    assert out == "epoch 1: done\n"
    assert err == "warning: the test split is empty\n"


def test_version_is_the_package_version_without_importing_torch():
    import re
    from pathlib import Path

    import embcache

    # pyproject.toml takes the version from the package: it is written in one place
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \[.*"version".*\]$', pyproject, re.M)
    assert re.search(r'^version = \{ attr = "embcache.__version__" \}$', pyproject, re.M)
    assert re.fullmatch(r"\d+\.\d+\.\d+", embcache.__version__)
    code = "import sys; from embcache.cli import main; main(['--version']); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [f"embcache {embcache.__version__}", "False"]
