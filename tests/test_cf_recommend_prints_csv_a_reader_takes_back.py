"""`cf recommend` without --out printed "user,rank,item,score" rows by joining the fields with
commas: an id holding a comma or a quote (`"Matrix, The"`, read from a quoted CSV field) gave
a line of the wrong number of fields. The rows are now written as CSV, quoted where needed."""
from __future__ import annotations

import csv
import io

from embcache.cli import main


def test_printed_rows_read_back_as_the_ids_of_the_file(tmp_path, capsys):
    source = tmp_path / "likes.csv"
    source.write_text('user_id,item_id\n"Smith, J",Toy Story\n"Smith, J","Matrix, The"\nann,"Matrix, The"\n'
                      'ann,"say ""hi"""\nbob,Toy Story\nbob,"say ""hi"""\n')
    model = tmp_path / "m.npz"
    assert main(["cf", "train", "--data", str(source), "--epochs", "1", "--dim", "4", "--negatives", "2",
                 "--test-fraction", "0.3", "--no-progress", "--save", str(model)]) == 0
    capsys.readouterr()
    assert main(["cf", "recommend", str(model), "--all", "--k", "3", "--include-seen"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["user", "rank", "item", "score"] and all(len(r) == 4 for r in rows)
    assert {r[0] for r in rows[1:]} == {"Smith, J", "ann", "bob"}
    assert {r[2] for r in rows[1:]} == {"Toy Story", "Matrix, The", 'say "hi"'}
    assert [r[1] for r in rows[1:4]] == ["1", "2", "3"]
