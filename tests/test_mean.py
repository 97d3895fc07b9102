"""The mean file: Caffe's BlobProto bytes (decoded by real protobuf), Caffe's float32
summation order past 2**24, the CLI and the compute_image_mean drop-in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lmdb
import numpy as np
import pytest
from click.testing import CliRunner
from helpers import write_idx

from mnist2db import convert
from mnist2db.cli.app import cli
from mnist2db.errors import Mnist2dbError
from mnist2db.mean import blobproto_bytes, compute_mean, write_mean

MEAN_ENTRY = [
    sys.executable,
    "-c",
    "from mnist2db.caffe_tools.drop_ins import mean_main; mean_main()",
]


def blobproto_class():
    """Caffe's BlobShape and BlobProto, field for field as in caffe.proto, built at run time."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(
        name="caffe_blob_test.proto", package="caffe_blob_test", syntax="proto2"
    )
    f = descriptor_pb2.FieldDescriptorProto
    shape = fdp.message_type.add(name="BlobShape")
    shape.field.add(
        name="dim", number=1, type=f.TYPE_INT64, label=f.LABEL_REPEATED
    ).options.packed = True
    blob = fdp.message_type.add(name="BlobProto")
    blob.field.add(
        name="shape",
        number=7,
        type=f.TYPE_MESSAGE,
        label=f.LABEL_OPTIONAL,
        type_name=".caffe_blob_test.BlobShape",
    )
    for name, number, kind in (
        ("data", 5, f.TYPE_FLOAT),
        ("diff", 6, f.TYPE_FLOAT),
        ("double_data", 8, f.TYPE_DOUBLE),
        ("double_diff", 9, f.TYPE_DOUBLE),
    ):
        blob.field.add(
            name=name, number=number, type=kind, label=f.LABEL_REPEATED
        ).options.packed = True
    for name, number in (("num", 1), ("channels", 2), ("height", 3), ("width", 4)):
        blob.field.add(
            name=name, number=number, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL, default_value="0"
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    descriptor = pool.FindMessageTypeByName("caffe_blob_test.BlobProto")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.21
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)  # protobuf 3.20


def sequential_mean(images: np.ndarray) -> np.ndarray:
    """Caffe's loop, literally: float32 sum = sum + pixel, record by record; / count."""
    total = np.zeros(images[0].size, dtype=np.float32)
    for image in images:
        for i, pixel in enumerate(image.reshape(-1)):
            total[i] = np.float32(total[i] + np.float32(pixel))
    return (total / np.float32(len(images))).astype(np.float32)


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_mean_bytes_decode_as_caffe_blobproto(mnist_pair, tmp_path: Path, backend: str) -> None:
    ipath, lpath, images, _ = mnist_pair(40, 5, 3)
    convert(ipath, lpath, tmp_path / "db", backend=backend)
    result = compute_mean(tmp_path / "db", batch_size=7)
    expected = sequential_mean(images)
    assert result.count == 40 and result.mean.shape == (1, 5, 3)
    assert result.mean.dtype == np.float32
    assert np.array_equal(result.mean.reshape(-1), expected)
    data = blobproto_bytes(result.mean)
    blob = blobproto_class()()
    blob.ParseFromString(data)
    assert (blob.num, blob.channels, blob.height, blob.width) == (1, 1, 5, 3)
    assert not blob.HasField("shape") and len(blob.diff) == 0
    assert np.array_equal(np.array(blob.data, dtype=np.float32), expected)
    # protobuf's own serialization of the same message is the same bytes.
    assert blob.SerializeToString() == data
    assert data[:9] == bytes([0x08, 1, 0x10, 1, 0x18, 5, 0x20, 3, 0x2A]) and len(data) == 10 + 60
    # The standard deviation is the population std over every pixel.
    assert result.channel_means[0] == pytest.approx(images.mean(), rel=1e-12)
    assert result.channel_stds[0] == pytest.approx(images.std(), rel=1e-12)


def test_caffe_summation_order_past_2_to_the_24(tmp_path: Path) -> None:
    """100 000 records of 1 × 2 pixels: the float32 sums pass 2**24 (at about record 67 800),
    where the order of the additions changes the result; the mean equals Caffe's sequential
    loop exactly."""
    n = 100000
    rng = np.random.default_rng(3)
    images = rng.integers(240, 256, size=(n, 1, 2), dtype=np.uint8)
    write_idx(tmp_path / "i", images)
    write_idx(tmp_path / "l", np.zeros(n, dtype=np.uint8))
    convert(tmp_path / "i", tmp_path / "l", tmp_path / "db")
    flat = images.reshape(n, 2)
    expected = np.zeros(2, dtype=np.float32)
    for c in range(2):
        total = np.float32(0)
        for value in flat[:, c].tolist():
            total = np.float32(total + np.float32(value))
        expected[c] = total / np.float32(n)
    # The order matters here: a pairwise float32 sum (numpy.sum of one pixel's values) and
    # the exact sum both give other means.
    for c in range(2):
        pairwise = flat[:, c].astype(np.float32).sum(dtype=np.float32) / np.float32(n)
        assert pairwise != expected[c]
        assert np.float32(flat[:, c].sum() / n) != expected[c]
    result = compute_mean(tmp_path / "db")
    assert np.array_equal(result.mean.reshape(-1), expected)


def test_float_data_records(tmp_path: Path) -> None:
    from mnist2db.formats.datum.message import array_to_datum

    arrays = [np.full((2, 1, 2), v, dtype=np.float32) + [[[0, 0.5]], [[1, 2]]] for v in (1, 3)]
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 20)
    with env.begin(write=True) as txn:
        for i, arr in enumerate(arrays):
            txn.put(b"%08d" % i, array_to_datum(arr, 0).SerializeToString())
    env.close()
    result = compute_mean(tmp_path / "db")
    assert result.mean.shape == (2, 1, 2)
    assert result.mean.reshape(-1).tolist() == [2.0, 2.5, 3.0, 4.0]


def test_errors(mnist_pair, tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path / "empty"), map_size=1 << 20)
    env.close()
    with pytest.raises(Mnist2dbError, match="holds no records; a mean needs at least one"):
        compute_mean(tmp_path / "empty")
    env = lmdb.open(str(tmp_path / "mixed"), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"00000000", b"\x08\x01\x10\x01\x18\x02\x22\x02ab")
        txn.put(b"00000001", b"\x08\x01\x10\x02\x18\x01\x22\x02ab")
        txn.put(b"00000002", b"\x08\x01\x10\x01\x18\x01\x22\x01a\x38\x01")
    env.close()
    with pytest.raises(Mnist2dbError) as info:
        compute_mean(tmp_path / "mixed")
    assert str(info.value) == (
        f"{tmp_path / 'mixed'}: key 00000001: shape 1 × 2 × 1 differs from the first "
        "record's 1 × 1 × 2"
    )


def test_a_value_that_is_not_a_datum_names_the_database_and_key(tmp_path: Path) -> None:
    # An LMDB with a named sub-database holds the sub-database's name as a key of the main one.
    env = lmdb.open(str(tmp_path / "named"), map_size=1 << 20, max_dbs=1)
    sub = env.open_db(b"sub")
    with env.begin(write=True) as txn:
        txn.put(b"a", b"b", db=sub)
    env.close()
    result = CliRunner().invoke(cli, ["mean", str(tmp_path / "named")])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {tmp_path / 'named'}: key sub: value of ")
    assert " bytes is not a Datum: " in result.stderr


def test_write_mean_is_atomic_and_refuses_existing(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, images, _ = mnist_pair(4, 2, 2)
    convert(ipath, lpath, tmp_path / "db")
    result = compute_mean(tmp_path / "db")
    out = tmp_path / "mean.binaryproto"
    out.write_bytes(b"user data")
    with pytest.raises(Mnist2dbError, match="already exists"):
        write_mean(result, out)
    assert out.read_bytes() == b"user data"
    (tmp_path / "dir").mkdir()
    with pytest.raises(Mnist2dbError, match="is a directory; refusing to replace it"):
        write_mean(result, tmp_path / "dir", overwrite=True)
    assert write_mean(result, out, overwrite=True) == 10 + 16
    assert out.read_bytes() == blobproto_bytes(result.mean)
    write_mean(result, tmp_path / "mean.npy")
    loaded = np.load(tmp_path / "mean.npy")
    assert loaded.dtype == np.float32 and np.array_equal(loaded, result.mean)
    assert sorted(p.name for p in tmp_path.iterdir() if "tmp" in p.name) == []


def test_cli_mean(mnist_pair, tmp_path: Path) -> None:
    images = np.array([[[0, 255]], [[255, 255]]], dtype=np.uint8)
    write_idx(tmp_path / "i", images)
    write_idx(tmp_path / "l", np.array([1, 2], dtype=np.uint8))
    convert(tmp_path / "i", tmp_path / "l", tmp_path / "db", backend="leveldb")
    out = tmp_path / "m.binaryproto"
    result = CliRunner().invoke(cli, ["mean", str(tmp_path / "db"), str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"{tmp_path / 'db'}: 2 records of 1 × 1 × 2 (channels × height × width)",
        "channel 0: mean 191.2500 std 110.4182 (0-255); 0.7500 0.4330 (0-1)",
        "Normalize(mean=(0.7500,), std=(0.4330,))",
    ]
    assert result.stderr == f"Wrote {out} (18 bytes).\n"
    assert out.read_bytes() == blobproto_bytes(np.array([[[127.5, 255]]], dtype=np.float32))
    again = CliRunner().invoke(cli, ["mean", str(tmp_path / "db"), str(out)])
    assert again.exit_code == 1
    assert again.stderr == f"Error: {out}: already exists (use --overwrite to replace it)\n"
    missing = CliRunner().invoke(cli, ["mean", str(tmp_path / "nothing")])
    assert missing.exit_code == 1
    assert missing.stderr == f"Error: {tmp_path / 'nothing'}: no such database\n"
    quiet = CliRunner().invoke(cli, ["mean", "-q", "--overwrite", str(tmp_path / "db"), str(out)])
    assert (quiet.exit_code, quiet.stdout, quiet.stderr) == (0, "", "")  # -q: nothing at all
    assert out.read_bytes() == blobproto_bytes(np.array([[[127.5, 255]]], dtype=np.float32))


def test_compute_image_mean_drop_in(mnist_pair, tmp_path: Path) -> None:
    ipath, lpath, images, _ = mnist_pair(12, 3, 4)
    convert(ipath, lpath, tmp_path / "db", backend="leveldb")
    out = tmp_path / "mean.binaryproto"
    out.write_bytes(b"old")  # Caffe's tool replaces its output file; so does the drop-in
    done = subprocess.run(
        [*MEAN_ENTRY, "--backend=leveldb", str(tmp_path / "db"), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    mean = sequential_mean(images)
    assert out.read_bytes() == blobproto_bytes(mean.reshape(1, 3, 4))
    logged = [line.split("] ", 1)[1] for line in done.stderr.splitlines()]
    channel = np.cumsum(mean, dtype=np.float32)[-1] / np.float32(12)
    assert logged == [
        f"Opened leveldb {tmp_path / 'db'}",
        "Starting iteration",
        "Processed 12 files.",
        f"Write to {out}",
        "Number of channels: 1",
        f"mean_value channel [0]: {float(channel):g}",
    ]
    # The default backend is LMDB, as Caffe's: a LevelDB database needs --backend.
    wrong = subprocess.run(
        [*MEAN_ENTRY, str(tmp_path / "db")], capture_output=True, text=True, check=False
    )
    assert wrong.returncode == 1
    assert wrong.stderr.rstrip().endswith(
        f"] {tmp_path / 'db'}: is a leveldb database (use --backend=leveldb)"
    )
    usage = subprocess.run(
        [*MEAN_ENTRY, "a", "b", "c"], capture_output=True, text=True, check=False
    )
    assert usage.returncode == 2
    assert "compute_image_mean [FLAGS] INPUT_DB [OUTPUT_FILE]" in usage.stderr


@pytest.mark.parametrize("entry", ["mnist2db", "compute_image_mean"])
def test_a_bad_mean_target_fails_before_the_database_is_read(
    entry: str, mnist_pair, tmp_path: Path
) -> None:
    """The target is checked first: a database that cannot be read is never reached."""
    broken = tmp_path / "db"
    broken.mkdir()
    (broken / "data.mdb").write_bytes(b"not an LMDB file")  # reading it would fail
    target = tmp_path / "nodir" / "mean.binaryproto"
    if entry == "mnist2db":
        result = CliRunner().invoke(cli, ["mean", str(broken), str(target)])
        code, stderr = result.exit_code, result.stderr
    else:
        done = subprocess.run(
            [sys.executable, "-c", "from mnist2db.caffe_tools.drop_ins import mean_main; mean_main()",
             str(broken), str(target)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        code, stderr = done.returncode, done.stderr
    assert code == 1
    assert stderr.rstrip().endswith(f"{target}: no directory {target.parent} to write it in")
    assert stderr.count("\n") == 1
    assert not (tmp_path / "nodir").exists()


def test_large_records_are_summed_in_bounded_memory(tmp_path: Path) -> None:
    """A batch is bounded by bytes, not by 1000 records whatever their size (PNG records of
    9000 × 9000 asked for GiBs). Six PNG records of 3000 × 3000 (81 MB of pixels): the
    process peaked at 1.2 GB; batched by bytes and summed a slice at a time, it stays
    within the running sum, a record and the work arrays."""
    n, rows, cols = 6, 3000, 3000
    ramp = ((np.arange(rows)[:, None] + np.arange(cols)[None, :]) % 256).astype(np.uint8)
    images = np.stack([np.roll(ramp, 7 * k, axis=1) for k in range(n)])
    ipath = write_idx(tmp_path / "i", images)
    lpath = write_idx(tmp_path / "l", np.arange(n, dtype=np.uint8))
    db = tmp_path / "png_db"
    convert(ipath, lpath, db, encoded="png")
    del images
    # VmHWM: the peak of the address space exec made (ru_maxrss carries the parent's over).
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from mnist2db.mean import compute_mean\n"
        "r = compute_mean(sys.argv[1])\n"
        "np.save(sys.argv[2], r.mean)\n"
        "status = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
        "print(r.count, repr(r.channel_means[0]), repr(r.channel_stds[0]), int(status) // 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(db), str(tmp_path / "mean.npy")],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    count, mean, std, peak_mb = done.stdout.split()
    assert int(count) == n
    assert int(peak_mb) < 400, f"peak resident memory {peak_mb} MB"
    images = np.stack([np.roll(ramp, 7 * k, axis=1) for k in range(n)])
    flat = images.reshape(n, -1).astype(np.int64)
    assert float(mean) == flat.sum() / flat.size
    assert float(std) == pytest.approx(np.sqrt((flat * flat).sum() / flat.size - float(mean) ** 2))
    expected = np.cumsum(images.reshape(n, -1), axis=0, dtype=np.float32)[-1] / np.float32(n)
    assert np.array_equal(np.load(tmp_path / "mean.npy").reshape(-1), expected)
