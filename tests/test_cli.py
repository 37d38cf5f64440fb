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
