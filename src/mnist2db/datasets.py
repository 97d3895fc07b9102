"""The datasets mnist2db fetches, as data: files, published digests, mirrors. No network imports.

:data:`DATASETS` names, for each dataset, its mirrors in order and, for each file, the
published digests of the packed file (``.gz``, ``.xz``) and, where published, of the
unpacked one. Mirrors re-compress (Debian's Fashion-MNIST ``.gz`` files differ from the
official ones, their content does not), so a file is accepted when its packed digest **or**
its unpacked digest matches a published value. Digests, not URLs, identify a file: hosts
move (yann.lecun.com no longer serves MNIST; EMNIST's archive has moved four times).

This module is imported at start-up by the command line (for the ``--dataset`` choices):
it must stay free of network and heavy imports.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "DATASETS",
    "DATASET_NAMES",
    "DEFAULT_DATASET",
    "FILE_NAMES",
    "MNIST_SPLITS",
    "Archive",
    "Dataset",
    "Resource",
    "default_data_dir",
    "default_out_dir",
    "get_dataset",
]

TRAIN_IMAGES = "train-images-idx3-ubyte"
TRAIN_LABELS = "train-labels-idx1-ubyte"
TEST_IMAGES = "t10k-images-idx3-ubyte"
TEST_LABELS = "t10k-labels-idx1-ubyte"
FILE_NAMES = (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)

#: (database name stem, images, labels), as create_mnist.sh converts them.
MNIST_SPLITS = (("train", TRAIN_IMAGES, TRAIN_LABELS), ("test", TEST_IMAGES, TEST_LABELS))

#: How a file is packed where it is published: the suffix it carries there.
PACKING_SUFFIX = {"gzip": ".gz", "xz": ".xz", "none": ""}


@dataclass(frozen=True)
class Resource:
    """One file of a dataset and its published digests (lowercase hex, by hashlib name).

    Attributes:
        name: the unpacked file name, as stored in the data directory.
        gz: digests of the published packed file (the ``.gz``, or the ``.xz``),
            e.g. ``{"sha256": "..."}``.
        unpacked: digests of the unpacked file.
        size: published size of the packed file in bytes (a progress hint only: mirrors
            re-compress).
        source: its name on a mirror (or inside the dataset's archive); default
            ``name`` plus the packing's suffix.
        packing: ``"gzip"``, ``"xz"`` or ``"none"`` (served as is).
    """

    name: str
    gz: Mapping[str, str] = field(default_factory=dict)
    unpacked: Mapping[str, str] = field(default_factory=dict)
    size: int | None = None
    source: str = ""
    packing: str = "gzip"

    @property
    def remote(self) -> str:
        """The name to ask a mirror for (or to read from the archive)."""
        return self.source or self.name + PACKING_SUFFIX[self.packing]


@dataclass(frozen=True)
class Archive:
    """One file on the mirrors holding every file of the dataset (EMNIST's ``gzip.zip``).

    Attributes:
        name: its file name on the mirrors, and where it is kept.
        digests: its published digests.
        size: its published size in bytes (a progress hint).
        home: the directory it is kept in, relative to the data directory's parent
            (``data/emnist`` for ``data/emnist-letters``), so every split shares it.
    """

    name: str
    digests: Mapping[str, str]
    size: int | None = None
    home: str = ""


@dataclass(frozen=True)
class Dataset:
    """A dataset: its name, its mirrors in order of preference, its files.

    ``archive``: when set, the mirrors serve that one archive and the resources are members
    of it. ``splits``: (database stem, images file, labels file) for ``create``.
    """

    name: str
    mirrors: tuple[str, ...]
    resources: tuple[Resource, ...]
    archive: Archive | None = None
    splits: tuple[tuple[str, str, str], ...] = MNIST_SPLITS


DATASETS: dict[str, Dataset] = {
    "mnist": Dataset(
        name="mnist",
        mirrors=(
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
            "http://yann.lecun.com/exdb/mnist/",
        ),
        resources=(
            Resource(
                TRAIN_IMAGES,
                gz={
                    "sha256": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
                    "md5": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
                },
                unpacked={"md5": "6bbc9ace898e44ae57da46a324031adb"},
                size=9912422,
            ),
            Resource(
                TRAIN_LABELS,
                gz={
                    "sha256": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
                    "md5": "d53e105ee54ea40749a09fcbcd1e9432",
                },
                unpacked={"md5": "a25bea736e30d166cdddb491f175f624"},
                size=28881,
            ),
            Resource(
                TEST_IMAGES,
                gz={
                    "sha256": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
                    "md5": "9fb629c4189551a2d022fa330f9573f3",
                },
                unpacked={"md5": "2646ac647ad5339dbf082846283269ea"},
                size=1648877,
            ),
            Resource(
                TEST_LABELS,
                gz={
                    "sha256": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
                    "md5": "ec29112dd5afa0611ce80d1b7f02629c",
                },
                unpacked={"md5": "27ae3e4e09519cfbb04c329615203637"},
                size=4542,
            ),
        ),
    ),
    "fashion-mnist": Dataset(
        name="fashion-mnist",
        mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        resources=(
            Resource(
                TRAIN_IMAGES,
                gz={"sha256": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84"},
                unpacked={
                    "sha256": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"
                },
            ),
            Resource(
                TRAIN_LABELS,
                gz={"sha256": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845"},
                unpacked={
                    "sha256": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"
                },
            ),
            Resource(
                TEST_IMAGES,
                gz={"sha256": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073"},
                unpacked={
                    "sha256": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"
                },
            ),
            Resource(
                TEST_LABELS,
                gz={"sha256": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5"},
                unpacked={
                    "sha256": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"
                },
            ),
        ),
    ),
    "kmnist": Dataset(
        name="kmnist",
        mirrors=("http://codh.rois.ac.jp/kmnist/dataset/kmnist/",),
        resources=(
            Resource(
                TRAIN_IMAGES,
                gz={"sha256": "51467d22d8cc72929e2a028a0428f2086b092bb31cfb79c69cc0a90ce135fde4"},
            ),
            Resource(
                TRAIN_LABELS,
                gz={"sha256": "e38f9ebcd0f3ebcdec7fc8eabdcdaef93bb0df8ea12bee65224341c8183d8e17"},
            ),
            Resource(
                TEST_IMAGES,
                gz={"sha256": "edd7a857845ad6bb1d0ba43fe7e794d164fe2dce499a1694695a792adfac43c5"},
            ),
            Resource(
                TEST_LABELS,
                gz={"sha256": "20bb9a0ef54c7db3efc55a92eef5582c109615df22683c380526788f98e42a1c"},
            ),
        ),
    ),
}

#: The names the command line offers, in the table's order.
DATASET_NAMES = tuple(DATASETS)
DEFAULT_DATASET = "mnist"


def get_dataset(dataset: str | Dataset) -> Dataset:
    """The :class:`Dataset` named ``dataset`` (a :class:`Dataset` is returned as is).

    Raises:
        Mnist2dbError: unknown name.
    """
    if isinstance(dataset, Dataset):
        return dataset
    try:
        return DATASETS[dataset]
    except KeyError:
        from .errors import Mnist2dbError

        raise Mnist2dbError(
            f"unknown dataset {dataset!r}: expected one of {', '.join(DATASETS)}"
        ) from None


def default_data_dir(dataset: str | Dataset) -> str:
    """``data/<dataset>``: where ``fetch`` stores and ``create`` reads."""
    return os.path.join("data", get_dataset(dataset).name)


def default_out_dir(dataset: str | Dataset) -> str:
    """``examples/<dataset>``, where ``create`` writes (Caffe: examples/mnist)."""
    return os.path.join("examples", get_dataset(dataset).name)
