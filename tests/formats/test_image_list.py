"""Caffe's list files read as their writers meant them (mnist2db.formats.lists.image_list)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mnist2db.errors import ImageError
from mnist2db.formats.lists.image_list import ListEntry, image_key, parse_line, read_image_list


def caffe_reading(line: bytes) -> tuple[bytes, int]:
    """convert_imageset's own reading: split at the last space, atoi the rest."""
    pos = line.rfind(b" ")
    rest = line[pos + 1 :] if pos >= 0 else line
    digits = rest.lstrip(b" \t\n\v\f\r")
    sign = 1
    if digits[:1] in (b"+", b"-"):
        sign = -1 if digits[:1] == b"-" else 1
        digits = digits[1:]
    number = b""
    for byte in digits:
        if not 48 <= byte <= 57:
            break
        number += bytes((byte,))
    return (line[:pos] if pos >= 0 else line), sign * int(number or b"0")


@pytest.mark.parametrize(
    ("line", "path", "label"),
    [
        (b"a.png 3", b"a.png", 3),
        (b"a.png\t3", b"a.png", 3),
        (b"a.png 3 ", b"a.png", 3),
        (b"a.png  3", b"a.png", 3),
        (b"a.png 3\r", b"a.png", 3),
        (b"my photos/cat one.jpg 7", b"my photos/cat one.jpg", 7),
        (b"dir\tname.png 2", b"dir\tname.png", 2),
        (b"x.png -1", b"x.png", -1),
        (b"x.png +12", b"x.png", 12),
        (b"caf\xe9.png 1", b"caf\xe9.png", 1),
    ],
)
def test_lines_read_as_meant(line: bytes, path: bytes, label: int) -> None:
    assert parse_line(line, 4, "list.txt") == ListEntry(4, path, label)


@pytest.mark.parametrize("line", [b"", b"   ", b"\t", b"\r", b" \r"])
def test_blank_lines_name_nothing(line: bytes) -> None:
    assert parse_line(line, 0, "list.txt") is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            b"a.png",
            "list.txt:8: no label in 'a.png': each line is 'PATH LABEL' (a space before the label)",
        ),
        (
            b"a.png cat",
            "list.txt:8: the label 'cat' is not a whole number: each line is 'PATH LABEL', the label last",
        ),
        (
            b"a.png 3.5",
            "list.txt:8: the label '3.5' is not a whole number: each line is 'PATH LABEL', the label last",
        ),
        (
            b"a.png 2147483648",
            "list.txt:8: the label 2147483648 does not fit a Datum's int32 label",
        ),
        (b"a\0b.png 1", "list.txt:8: the path holds a NUL byte"),
    ],
)
def test_refused_in_one_line(line: bytes, message: str) -> None:
    with pytest.raises(ImageError) as caught:
        parse_line(line, 7, "list.txt")
    assert str(caught.value) == message


def test_file_keeps_caffe_line_numbers(tmp_path) -> None:
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"a.png 1\r\n\nb c.png 2\nlast.png 3")
    entries = list(read_image_list(listing))
    assert entries == [
        ListEntry(0, b"a.png", 1),
        ListEntry(2, b"b c.png", 2),
        ListEntry(3, b"last.png", 3),
    ]
    assert [image_key(e) for e in entries] == [
        b"00000000_a.png",
        b"00000002_b c.png",
        b"00000003_last.png",
    ]


def test_missing_list_is_named(tmp_path) -> None:
    with pytest.raises(ImageError) as caught:
        list(read_image_list(tmp_path / "nope.txt"))
    assert (
        str(caught.value)
        == f"{tmp_path / 'nope.txt'}: cannot read the list: No such file or directory"
    )


paths = st.binary(min_size=1, max_size=30).filter(
    lambda p: b"\n" not in p and b"\0" not in p and p.strip(b" \t\r") == p and b"\r" not in p
)


@given(paths, st.integers(-(2**31), 2**31 - 1))
def test_caffe_lines_read_as_caffe_reads_them(path: bytes, label: int) -> None:
    """Every line Caffe reads as PATH LABEL is read the same: the keys are Caffe's."""
    line = path + b" " + str(label).encode()
    assert parse_line(line, 0, "l") == ListEntry(0, *caffe_reading(line))


@given(paths, st.integers(-(2**31), 2**31 - 1), st.sampled_from([b" ", b"\t", b"  ", b" \t"]),
       st.sampled_from([b"", b" ", b"\t", b"\r", b" \r"]))  # fmt: skip
def test_slips_read_as_meant(path: bytes, label: int, gap: bytes, tail: bytes) -> None:
    """Tabs, doubled or trailing spaces and CRLF give the path and label the writer meant."""
    line = path + gap + str(label).encode() + tail
    assert parse_line(line, 5, "l") == ListEntry(5, path.rstrip(b" \t"), label)


def test_an_index_reads_the_entries_again_in_any_order(tmp_path) -> None:
    """A shuffle holds the entries' offsets, not the entries: read again by offset, in the
    order given, each numbered by its place in it, as the entries themselves would be."""
    import os

    from mnist2db.formats.lists.image_list import ImageList, ListIndex

    text = b"a.png 1\n\n  \r\nb c.png\t2\r\nd.png  -3\n\n" + b"e/%d.jpg 4\n" * 3 + b"last.png 9"
    listing = tmp_path / "list.txt"
    listing.write_bytes(text)
    listed = list(read_image_list(listing))
    order = [6, 0, 3, 5, 1, 2, 4]
    expected = [ListEntry(k, listed[i].path, listed[i].label) for k, i in enumerate(order)]
    index = ListIndex(ImageList(listing))
    assert len(index) == len(listed) == 7
    assert list(index.entries(order)) == expected
    assert list(index.entries(order)) == expected  # as often as asked
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    pid = os.fork()
    if pid == 0:  # a pipe: read once, kept in a copy the index reads
        with open(fifo, "wb") as stream:
            stream.write(text)
        os._exit(0)
    kept = ImageList(fifo)
    piped = ListIndex(kept)
    os.waitpid(pid, 0)
    try:
        assert list(piped.entries(order)) == expected == list(piped.entries(order))
    finally:
        kept.close()


def test_an_index_checks_every_line(tmp_path) -> None:
    from mnist2db.formats.lists.image_list import ImageList, ListIndex

    listing = tmp_path / "list.txt"
    listing.write_bytes(b"a.png 1\nb.png x\n")
    with pytest.raises(ImageError, match=r"list.txt:2: the label 'x' is not a whole number"):
        ListIndex(ImageList(listing))
