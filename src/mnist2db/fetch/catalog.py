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

from mnist2db.errors import ArgumentError

TRAIN_IMAGES = "train-images-idx3-ubyte"
TRAIN_LABELS = "train-labels-idx1-ubyte"
TEST_IMAGES = "t10k-images-idx3-ubyte"
TEST_LABELS = "t10k-labels-idx1-ubyte"
FILE_NAMES = (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)

#: (database name stem, images, labels), as create_mnist.sh converts them.
MNIST_SPLITS = (("train", TRAIN_IMAGES, TRAIN_LABELS), ("test", TEST_IMAGES, TEST_LABELS))

#: How a file is packed where it is published: the suffix it carries there.
PACKING_SUFFIX = {"gzip": ".gz", "xz": ".xz", "none": "", "zip": ""}


@dataclass(frozen=True)
class Resource:
    """One file of a dataset and its published digests (lowercase hex, by hashlib name).

    Attributes:
        name: the unpacked file name, as stored in the data directory.
        gz: digests of the published packed file (the ``.gz``, or the ``.xz``),
            e.g. ``{"sha256": "..."}``.
        unpacked: digests of the unpacked file.
        size: published size of the packed file in bytes: a progress hint, and the bound on
            what a mirror may send where only packed digests are published (elsewhere
            mirrors may re-compress).
        source: its name on a mirror (or inside the dataset's archive); default
            ``name`` plus the packing's suffix.
        packing: ``"gzip"``, ``"xz"`` or ``"none"`` (served as is).
        idx: an IDX file (its header declares its size, which bounds what is unpacked);
            False for a text file (EMNIST's class mappings).
    """

    name: str
    gz: Mapping[str, str] = field(default_factory=dict)
    unpacked: Mapping[str, str] = field(default_factory=dict)
    size: int | None = None
    source: str = ""
    packing: str = "gzip"
    idx: bool = True

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
    ``stored_transposed``: the images are stored with height and width swapped (EMNIST),
    so ``create`` transposes them back by default.
    """

    name: str
    mirrors: tuple[str, ...]
    resources: tuple[Resource, ...]
    archive: Archive | None = None
    splits: tuple[tuple[str, str, str], ...] = MNIST_SPLITS
    stored_transposed: bool = False


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
        mirrors=(
            "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
            "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
        ),
        resources=(
            Resource(
                TRAIN_IMAGES,
                gz={
                    "sha256": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
                    "md5": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                },
                unpacked={
                    "sha256": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"
                },
            ),
            Resource(
                TRAIN_LABELS,
                gz={
                    "sha256": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
                    "md5": "25c81989df183df01b3e8a0aad5dffbe",
                },
                unpacked={
                    "sha256": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"
                },
            ),
            Resource(
                TEST_IMAGES,
                gz={
                    "sha256": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
                    "md5": "bef4ecab320f06d8554ea6380940ec79",
                },
                unpacked={
                    "sha256": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"
                },
            ),
            Resource(
                TEST_LABELS,
                gz={
                    "sha256": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
                    "md5": "bb300cfdad3c16e7a12a480ee83cd310",
                },
                unpacked={
                    "sha256": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"
                },
            ),
        ),
    ),
    "kmnist": Dataset(
        name="kmnist",
        # The one host (reported unreachable, rois-codh/kmnist#29); no second host publishes
        # these files: --mirror a copy, the digests decide.
        mirrors=("http://codh.rois.ac.jp/kmnist/dataset/kmnist/",),
        resources=(
            Resource(
                TRAIN_IMAGES,
                gz={
                    "sha256": "51467d22d8cc72929e2a028a0428f2086b092bb31cfb79c69cc0a90ce135fde4",
                    "md5": "bdb82020997e1d708af4cf47b453dcf7",
                },
            ),
            Resource(
                TRAIN_LABELS,
                gz={
                    "sha256": "e38f9ebcd0f3ebcdec7fc8eabdcdaef93bb0df8ea12bee65224341c8183d8e17",
                    "md5": "e144d726b3acfaa3e44228e80efcd344",
                },
            ),
            Resource(
                TEST_IMAGES,
                gz={
                    "sha256": "edd7a857845ad6bb1d0ba43fe7e794d164fe2dce499a1694695a792adfac43c5",
                    "md5": "5c965bf0a639b31b8f53240b1b52f4d7",
                },
            ),
            Resource(
                TEST_LABELS,
                gz={
                    "sha256": "20bb9a0ef54c7db3efc55a92eef5582c109615df22683c380526788f98e42a1c",
                    "md5": "7320c461ea6c1c855c0b718fb2a4b134",
                },
            ),
        ),
    ),
}

# -- EMNIST: one archive, six splits ----------------------------------------------------

#: EMNIST's one archive; every split is four ``.gz`` members and a mapping in it.
EMNIST_ARCHIVE = Archive(
    "gzip.zip",
    {
        "md5": "58c8d27c78d21e728a6bc7b3cc06412e",
        "sha256": "fb9bb67e33772a9cc0b895e4ecf36d2cf35be8b709693c3564cea2a019fcda8e",
    },
    size=561753746,
    home="emnist",
)
EMNIST_MIRRORS = (
    "https://biometrics.nist.gov/cs_links/EMNIST/",
    "https://www.itl.nist.gov/iaui/vip/cs_links/EMNIST/",
)
#: split → (training items, test items, classes), from the EMNIST paper (Cohen et al. 2017).
#: Letters: the paper and NIST's page give 145 600 in all (124 800 + 20 800); TFDS's catalog
#: gives 88 800 + 14 800; not checked offline (data only: fetch does not enforce counts).
#: Images are stored transposed (column-major) in the archive, and extracted as they are.
EMNIST_SPLITS = {
    "byclass": (697_932, 116_323, 62),
    "bymerge": (697_932, 116_323, 47),
    "balanced": (112_800, 18_800, 47),
    "letters": (124_800, 20_800, 26),
    "digits": (240_000, 40_000, 10),
    "mnist": (60_000, 10_000, 10),
}


def _emnist(split: str) -> Dataset:
    member = f"gzip/emnist-{split}-"
    files = (
        (TRAIN_IMAGES, "train-images-idx3-ubyte.gz"),
        (TRAIN_LABELS, "train-labels-idx1-ubyte.gz"),
        (TEST_IMAGES, "test-images-idx3-ubyte.gz"),
        (TEST_LABELS, "test-labels-idx1-ubyte.gz"),
    )
    # No digest is published per member: the archive's digest vouches for them, and the
    # manifest records what was extracted. Stored under MNIST's names, so create works.
    resources = tuple(Resource(name, source=member + remote) for name, remote in files)
    mapping = Resource(
        f"emnist-{split}-mapping.txt", source=f"{member}mapping.txt", packing="none", idx=False
    )
    return Dataset(
        f"emnist-{split}",
        EMNIST_MIRRORS,
        (*resources, mapping),
        EMNIST_ARCHIVE,
        stored_transposed=True,  # the EMNIST paper's README; torchvision#8783, TFDS#812
    )


DATASETS.update({f"emnist-{split}": _emnist(split) for split in EMNIST_SPLITS})

# -- QMNIST: MNIST's digits found again in NIST, with eight label columns ------------------

QMNIST_MIRRORS = ("https://raw.githubusercontent.com/facebookresearch/qmnist/master/",)
# Stored under the published names, unpacked: the labels are IDX int32 N × 8 ("idx2-int"),
# not MNIST's idx1-ubyte, so MNIST's names would lie. Dataset.splits tells create which
# pair is which.
QMNIST_TRAIN = ("qmnist-train-images-idx3-ubyte", "qmnist-train-labels-idx2-int")
QMNIST_TEST = ("qmnist-test-images-idx3-ubyte", "qmnist-test-labels-idx2-int")
XNIST = ("xnist-images-idx3-ubyte", "xnist-labels-idx2-int")

DATASETS["qmnist"] = Dataset(
    name="qmnist",
    mirrors=QMNIST_MIRRORS,
    resources=(
        Resource(QMNIST_TRAIN[0], gz={"md5": "ed72d4157d28c017586c42bc6afe6370"}),
        Resource(QMNIST_TRAIN[1], gz={"md5": "0058f8dd561b90ffdd0f734c6a30e5e4"}),
        Resource(QMNIST_TEST[0], gz={"md5": "1394631089c404de565df7b7aeaf9412"}),
        Resource(QMNIST_TEST[1], gz={"md5": "5b5b05890a5e13444e108efe57b788aa"}),
    ),
    splits=(("train", *QMNIST_TRAIN), ("test", *QMNIST_TEST)),
)
DATASETS["qmnist-nist"] = Dataset(
    name="qmnist-nist",
    mirrors=QMNIST_MIRRORS,
    resources=(
        Resource(XNIST[0], gz={"md5": "7f124b3b8ab81486c9d8c2749c17f834"}, packing="xz"),
        Resource(XNIST[1], gz={"md5": "5ed0e788978e45d4a8bd4b7caec3d79d"}, packing="xz"),
    ),
    splits=(("nist", *XNIST),),
)


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
        raise ArgumentError(
            f"unknown dataset {dataset!r}: expected one of {', '.join(DATASETS)}"
        ) from None


def default_data_dir(dataset: str | Dataset) -> str:
    """``data/<dataset>``: where ``fetch`` stores and ``create`` reads."""
    return os.path.join("data", get_dataset(dataset).name)


def default_out_dir(dataset: str | Dataset) -> str:
    """``examples/<dataset>``, where ``create`` writes (Caffe: examples/mnist)."""
    return os.path.join("examples", get_dataset(dataset).name)
