"""A CSV value may hold a newline inside quotes, so its row spans two lines. A bad row after
it was named one line too early (pyarrow numbers records, not lines): the skip report and
meta.json said `line 3` of a row an editor shows on line 4. Tiny files: well under a second."""
from __future__ import annotations

import re

import numpy as np
import pytest

from embcache.cli import main
from embcache.data.bad_rows import BadRowLog
from embcache.data.ctr_format import read_meta
from embcache.data.delimited import read_blocks


def test_prepare_own_names_the_line_a_bad_row_starts_on_after_a_quoted_newline(tmp_path, capsys):
    path = tmp_path / "in.csv"
    good = [f"{i % 2},{i},u{i % 3}" for i in range(30)]
    path.write_text("clicked,price,user\n" + '1,2,"a\nb"\n' + "0,x,u\n" + "2,1,u\n" + "\n".join(good) + "\n")
    assert main(["data", "prepare", "own", "--input", str(path), "--out", str(tmp_path / "out"), "--label-col",
                 "clicked", "--dense-cols", "price", "--sparse-cols", "user", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "first: line 4: not a number: price='x'; line 5: " in err, err
    assert read_meta(tmp_path / "out")["bad_rows"][str(path)]["first_lines"] == [4, 5]


def _file(rng: np.random.Generator) -> tuple[str, dict[str, int], list[int]]:
    """(CSV text with quoted line breaks, the line each good row starts on by its id, the lines
    of the rows with the wrong number of fields), line breaks being LF, CRLF or a lone CR."""
    text, good, wrong = "id,note\n", {}, []
    for i in range(int(rng.integers(40, 120))):
        line = 1 + len(re.findall(r"\r\n|\r|\n", text))
        note = "".join(rng.choice(["a", "b", "\n", "\r\n", "\r", ","], size=int(rng.integers(0, 6))))
        if rng.random() < 0.2:
            text += f'{i},"{note}",extra'
            wrong.append(line)
        else:
            text += f'{i},"{note}"'
            good[str(i)] = line
        text += "\r\n" if rng.random() < 0.3 else "\n"
    return text, good, wrong


@pytest.mark.parametrize("seed", range(4))
def test_every_row_and_skipped_row_is_named_by_its_first_line_across_block_edges(tmp_path, seed):
    rng = np.random.default_rng(seed)
    text, good, wrong = _file(rng)
    path = tmp_path / "in.csv"
    path.write_bytes(text.encode())
    for block_bytes in (64, 97, 256, 1 << 20):
        log, seen = BadRowLog(keep=1000), {}
        for block, first, lines in read_blocks(path, ["id", "note"], ",", True, log, block_bytes):
            seen |= dict(zip(block.column("id").to_pylist(), lines.of(first + np.arange(block.num_rows)).tolist()))
        assert seen == good, block_bytes
        assert log.to_json()[str(path)]["first_lines"] == wrong, block_bytes
