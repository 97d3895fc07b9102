"""Float targets beside an export: a database's label database (:mod:`mnist2db.labels.databases`)
read in step with its records, in the same pass.

The pair is checked as ``verify --label-db`` checks it (:func:`~mnist2db.labels.databases.iter_pairs`:
as many records, the same key at every position, one width), the counts before any work.
Columns are named as the label table's header named them (``imageset --labels`` records the
names in the label database's ``mnist2db.json``), else ``v0`` … ``vN-1`` (a table without a
header, a list of values, a label database of another writer).

Each value is printed as the shortest decimal that reads back as the same float32
(numpy's ``str`` of a float32: ``0.1``, ``-3.5``, ``1e-08``, ``3.4028235e+38``), so
``np.float32(float(text))`` gives back the stored value bit for bit; a CSV or JSON reader's
float64 of it rounds to the same float32.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from mnist2db.formats.datum.float_datum import decode_targets
from mnist2db.formats.datum.message import key_text
from mnist2db.labels.databases import iter_pairs
from mnist2db.recipe import load_metadata, target_names
from mnist2db.storage.databases.readers import DbReader

#: JSON's names for the values a label record may hold and JSON has no number for (as
#: Python's ``json`` writes and reads them).
#: Text ``json.dumps(..., ensure_ascii=False)`` writes as it is (no quote, backslash or
#: control character to escape).
_UNESCAPED = re.compile(r'[^"\\\x00-\x1f]*')
_NOT_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def column_names(width: int) -> list[str]:
    """The targets' column names: ``v0`` … ``v{width-1}``."""
    return [f"v{i}" for i in range(width)]


def value_texts(targets: np.ndarray) -> list[str]:
    """Each float32 value as the shortest decimal that reads back as the same float32."""
    return [str(value) for value in targets]


def targets_json(targets: np.ndarray) -> str:
    """The values as a JSON array (non-finite ones as Python's ``json`` names them)."""
    texts = value_texts(targets)
    if not all(math.isfinite(value) for value in targets.tolist()):
        texts = [_NOT_FINITE.get(text, text) for text in texts]
    return "[" + ", ".join(texts) + "]"


def sample_json(key_fields: dict[str, str], label: int, targets: np.ndarray | None) -> bytes:
    """A sample's ``KEY.json``: the source key, the label and, when known, the targets (as
    ``json.dumps`` writes them; a key it would not escape is written without it)."""
    ((name, value),) = key_fields.items()
    if type(label) is int and _UNESCAPED.fullmatch(value):
        text = f'{{"{name}": "{value}", "label": {label}}}'
    else:
        text = json.dumps({**key_fields, "label": label}, ensure_ascii=False)
    if targets is not None:
        text = f'{text[:-1]}, "targets": {targets_json(targets)}}}'
    return text.encode("utf-8")


def csv_field(text: str) -> str:
    """``text`` as one CSV field (RFC 4180: quoted when it holds a comma, a quote or a line
    break, its quotes doubled)."""
    if any(c in text for c in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


class TargetStream:
    """The records of an image database with their label database's targets, in step.

    Made, it has checked that the two hold as many records (VerifyError if not).

    :meth:`records` yields the image records (``(key, value)``, to any reader of them) and
    keeps each one's targets, in order; :meth:`take` hands out the next: the targets of the
    record the caller turned into the next sample (samples come out in the records' order,
    one per record, at most a batch behind).
    """

    def __init__(self, images: str, labels: str, image_reader: DbReader,
                 label_reader: DbReader) -> None:  # fmt: skip
        self.images = images
        self.labels = labels
        self.counts = (len(image_reader), len(label_reader))
        # The pair check's first refusal (other counts) now, before any work.
        next(iter_pairs(images, labels, (), (), counts=self.counts), None)
        first = label_reader.first_key()
        value = label_reader.get(first) if first is not None else None
        #: The width of every record (the first's; the pair check holds the others to it).
        where = f"{labels}: key {key_text(first or b'')}"
        self.width = len(decode_targets(value, where)) if value is not None else 0
        recorded = load_metadata(label_reader)
        names = target_names(recorded[1]) if recorded is not None else None
        #: The columns' names: the label table's, when recorded for every value, else
        #: :func:`column_names`.
        self.names = (
            names if names is not None and len(names) == self.width else column_names(self.width)
        )
        self._pending: deque[np.ndarray] = deque()

    def records(
        self,
        image_records: Iterable[tuple[bytes, Any]],
        label_records: Iterable[tuple[bytes, bytes]],
        start: int = 0,
    ) -> Iterator[tuple[bytes, Any]]:
        """The image records, from record ``start``, each checked against its label record.

        Raises:
            VerifyError: the two are not a pair (first: their counts).
        """
        pairs = iter_pairs(self.images, self.labels, image_records, label_records,
                           start=start, counts=self.counts)  # fmt: skip
        for key, value, targets in pairs:
            self._pending.append(targets)
            yield key, value

    def take(self) -> np.ndarray:
        """The targets of the next sample."""
        return self._pending.popleft()
