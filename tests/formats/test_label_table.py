"""Label tables (mnist2db.formats.lists.label_table): value lists, CSV/whitespace headers,
CelebA's layout; every refusal one line naming the file and the line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mnist2db.errors import ImageError
from mnist2db.formats.lists.label_table import (
    MAX_VALUES,
    first_label,
    iter_rows,
    open_label_table,
)


def rows(path: Path, **kwargs: object) -> list[tuple[int, bytes, list[float]]]:
    table = open_label_table(path, **kwargs)  # type: ignore[arg-type]
    return [(r.line, r.path, r.values.tolist()) for r in iter_rows(table)]


def write(tmp_path: Path, text: bytes, name: str = "labels.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(text)
    return path


def test_value_list_width_from_first_line(tmp_path: Path) -> None:
    path = write(tmp_path, b"a b.jpg 0 1 1 0\r\n\nc.jpg\t1 0 0 1\n  d.jpg 1 1 1 1  \n")
    table = open_label_table(path, header=False)
    assert (table.layout, table.width, table.names) == ("list", 4, ())
    assert rows(path, header=False) == [
        (0, b"a b.jpg", [0, 1, 1, 0]), (2, b"c.jpg", [1, 0, 0, 1]), (3, b"d.jpg", [1, 1, 1, 1]),
    ]  # fmt: skip


def test_value_list_width_given_path_ending_in_numbers(tmp_path: Path) -> None:
    path = write(tmp_path, b"scan 2 1.5 -3.5e2 17\n")
    assert rows(path, header=False, width=3) == [(0, b"scan 2", [1.5, -350.0, 17.0])]


def test_csv_whitespace_and_celeba(tmp_path: Path) -> None:
    csv = write(tmp_path, b"path,smiling,young\na.jpg,1,0\nb  c.jpg , -1 ,1e3\n", "a.csv")
    table = open_label_table(csv)
    assert (table.layout, table.names, table.skip) == ("csv", ("smiling", "young"), 1)
    assert rows(csv) == [(0, b"a.jpg", [1, 0]), (1, b"b  c.jpg", [-1, 1000])]
    spaced = write(tmp_path, b"image x y\nf.png 0.5 0.25\n", "b.txt")
    assert open_label_table(spaced).layout == "whitespace"
    assert rows(spaced) == [(0, b"f.png", [0.5, 0.25])]
    celeba = write(tmp_path, b"2\n5_o_Clock_Shadow Arched_Eyebrows\n000001.jpg -1  1\n"
                             b"000002.jpg  1 -1\n", "list_attr_celeba.txt")  # fmt: skip
    table = open_label_table(celeba)
    assert (table.layout, table.width, table.promised) == ("celeba", 2, 2)
    assert table.names == ("5_o_Clock_Shadow", "Arched_Eyebrows")
    assert rows(celeba) == [(0, b"000001.jpg", [-1, 1]), (1, b"000002.jpg", [1, -1])]


def test_values_are_float32_rounded_through_a_double(tmp_path: Path) -> None:
    path = write(tmp_path, b"a.png 0.1 16777217 1e-45\n")
    [(_, _, values)] = rows(path, header=False)
    assert values == np.array([0.1, 16777217.0, 1e-45]).astype(np.float32).tolist()


def test_a_wide_row(tmp_path: Path) -> None:
    values = np.arange(10_000) / 7
    path = write(tmp_path, b"w.png " + " ".join(map(repr, values.tolist())).encode() + b"\n")
    [(_, _, read)] = rows(path, header=False)
    assert read == values.astype(np.float32).tolist()


@pytest.mark.parametrize(
    ("text", "kwargs", "message"),
    [
        (b"a.jpg 0 1\nb.jpg 1\n", {}, "labels.txt:2: 1 values after the path, expected 2: "
         "every line holds a path and the same number of values"),
        (b"a.jpg 0 1\nb 3.jpg 1 0 1\n", {}, "labels.txt:2: more than 2 values after the path "
         "('b 3.jpg 1' ends in a number); every line holds the same number"),
        (b"a.jpg 0 1\nb.jpg 1 x\n", {}, "labels.txt:2: value 2, 'x', is not a number"),
        (b"a.jpg 0 1\nb.jpg 1 nan\n", {}, "labels.txt:2: value 2, 'nan', is NaN"),
        (b"a.jpg 0 1\nb.jpg -inf 1\n", {}, "labels.txt:2: value 1, '-inf', is infinite"),
        (b"a.jpg 0 1\nb.jpg 1 1e39\n", {}, "labels.txt:2: value 2, '1e39', does not fit a "
         "float32 (at most ±3.4e38)"),
        (b"a.jpg 0 1_0\n", {"width": 2}, "labels.txt:1: value 2, '1_0', is not a number"),
        (b"a\0.jpg 0 1\n", {}, "labels.txt:1: the path holds a NUL byte"),
        (b"a.jpg\nb.jpg 1\n", {}, "labels.txt:1: no values after the path: each line is "
         "'PATH V1 … VN'"),
        (b"", {}, "labels.txt: no rows: the file is empty"),
        (b"a.jpg 1\n", {"width": 0}, "labels.txt: 0 values a row; a label row holds 1 to "
         f"{MAX_VALUES} values"),
        (b"a.jpg 1\n", {"width": 10**9}, f"labels.txt: {10**9} values a row; a label row holds "
         f"1 to {MAX_VALUES} values"),
    ],
)  # fmt: skip
def test_value_list_refusals(tmp_path: Path, text: bytes, kwargs: dict, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ImageError) as caught:
        rows(path, header=False, **kwargs)
    assert str(caught.value) == f"{path.parent}/{message}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"path\na.jpg\n", "labels.txt:1: the header 'path' names no label columns: expected "
         "'path,name1,name2,…' (or a CelebA count line, then the names)"),
        (b"path,,b\n", "labels.txt:1: the header 'path,,b' names no label columns: expected "
         "'path,name1,name2,…' (or a CelebA count line, then the names)"),
        (b"a.jpg 0 1\n", "labels.txt:1: the first line ends in a number, not a column name: a "
         "label table begins with a header row (a list of PATH V1 … VN lines: --list with "
         "--values)"),
        (b"p,a,b\nx.jpg,1\n", "labels.txt:2: 1 values after the path, expected 2: every line "
         "holds a path and the same number of values"),
        (b"p,a\n,1\n", "labels.txt:2: no path before the values"),
        (b"3\nA B\n1.jpg 1 1\n", "labels.txt: 1 rows, but its first line says 3 (a file cut "
         "short?)"),
        (b"1\nA B\n1.jpg 1 one\n", "labels.txt:3: value 2, 'one', is not a number"),
    ],
)  # fmt: skip
def test_table_refusals(tmp_path: Path, text: bytes, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ImageError) as caught:
        rows(path)
    assert str(caught.value) == f"{path.parent}/{message}"


def test_a_row_of_a_billion_values_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.csv"
    with path.open("wb") as out:  # a header naming more columns than a row may hold
        out.write(b"path" + b",c" * (MAX_VALUES + 1) + b"\n")
    with pytest.raises(ImageError) as caught:
        open_label_table(path)
    assert str(caught.value) == (
        f"{path}:1: {MAX_VALUES + 1} values a row; a label row holds 1 to {MAX_VALUES} values"
    )


def test_a_line_past_the_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mnist2db.formats.lists import label_table

    monkeypatch.setattr(label_table, "MAX_LINE", 64)
    path = write(tmp_path, b"a.jpg" + b" 1" * 100 + b"\n")
    with pytest.raises(ImageError) as caught:
        rows(path, header=False, width=100)
    assert str(caught.value) == f"{path}:1: the line is longer than 64 bytes"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ImageError) as caught:
        open_label_table(tmp_path / "none.txt")
    assert (
        str(caught.value)
        == f"{tmp_path}/none.txt: cannot read the labels: No such file or directory"
    )


@pytest.mark.parametrize(
    ("values", "label"),
    [([3.0, 0.5], 3), ([0.25, 1.0], 0), ([-1.0], -1), ([2.0**31], 0), ([-(2.0**31)], -(2**31))],
)
def test_first_label(values: list[float], label: int) -> None:
    assert first_label(np.array(values)) == label


finite = st.floats(width=32, allow_nan=False, allow_infinity=False)


@given(st.lists(st.lists(finite, min_size=2, max_size=2), min_size=1, max_size=10))
def test_written_rows_read_back(
    tmp_path_factory: pytest.TempPathFactory, table: list[list[float]]
) -> None:
    path = tmp_path_factory.mktemp("t") / "v.txt"
    path.write_bytes(b"".join(b"i %d.png %r %r\n" % (i, *row) for i, row in enumerate(table)))
    assert [r[2] for r in rows(path, header=False, width=2)] == table


def test_a_pipe_or_a_directory_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ImageError) as caught:
        open_label_table(fifo, header=False)
    assert str(caught.value) == (
        f"{fifo}: not a regular file (a pipe or device): a label table is read more than "
        "once; save it to a file first"
    )
    with pytest.raises(ImageError) as caught:
        open_label_table(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path}: not a regular file (a directory)")
