"""The IDX file format of MNIST and Fashion-MNIST: reading, writing and content hashes.

An IDX file is a 4-byte magic number ``0x00 0x00 T D`` (``T`` the element type code, ``D`` the number of
dimensions), then ``D`` big-endian ``uint32`` sizes, then the elements in row-major order, big-endian. The files may
be gzipped (Fashion-MNIST's are; Debian recompressed them, so only the *decoded* arrays are checksummed, never the
``.gz`` bytes).

Reference:
  LeCun, Cortes, Burges, "The MNIST database of handwritten digits" (file-format section of the data set's page).

Example:
  >>> import numpy as np, tempfile, os
  >>> path = os.path.join(tempfile.mkdtemp(), "x-idx1-ubyte.gz")
  >>> write_idx(path, np.arange(6, dtype=np.uint8).reshape(2, 3))
  >>> read_idx(path).tolist()
  [[0, 1, 2], [3, 4, 5]]
"""
from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from pathlib import Path

import numpy as np

from trustfl.errors import DataError

# IDX type code → big-endian NumPy dtype.
_TYPE_CODES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODE_OF: dict[str, int] = {dt.newbyteorder("=").str: code for code, dt in _TYPE_CODES.items()}
_GZIP_MAGIC = b"\x1f\x8b"

PathLike = str | os.PathLike


def _gunzip(path: Path, raw: bytes) -> bytes:
    """``raw`` (the whole file, gzip magic included) decompressed."""
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(
            f"IDX file {str(path)!r} is a corrupt or truncated gzip stream ({exc}); delete it and run `make data`."
        ) from exc


def _layout(path: Path, head: bytes, length: int) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, big-endian dtype, header length) from the first bytes ``head`` of a decoded file ``length`` long."""
    if length < 4:
        raise DataError(f"IDX file {str(path)!r} is {length} bytes long; an IDX header needs at least 4.")
    zero0, zero1, code, ndim = head[0], head[1], head[2], head[3]
    if zero0 != 0 or zero1 != 0:
        raise DataError(
            f"IDX file {str(path)!r} has magic number {head[:4].hex()}; an IDX file starts with two zero bytes."
        )
    if code not in _TYPE_CODES:
        valid = ", ".join(f"0x{c:02x}" for c in _TYPE_CODES)
        raise DataError(f"IDX file {str(path)!r} has element type code 0x{code:02x}; valid codes: {valid}.")
    if ndim < 1:
        raise DataError(f"IDX file {str(path)!r} declares {ndim} dimensions; at least 1 is required.")
    header = 4 + 4 * ndim
    if length < header:
        raise DataError(f"IDX file {str(path)!r} is truncated inside its header ({length} < {header} bytes).")
    shape = tuple(int(s) for s in np.frombuffer(head, dtype=">u4", count=ndim, offset=4))
    dtype = _TYPE_CODES[code]
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if length != expected:
        raise DataError(
            f"IDX file {str(path)!r} holds {length} bytes but its header (shape {shape}, {dtype.name}) needs "
            f"{expected}; the file is truncated or corrupt. Delete it and run `make data`."
        )
    return shape, dtype, header


def read_idx(path: PathLike) -> np.ndarray:
    """Read an IDX file (raw or gzipped; detected from the content, not the name).

    A raw file is read straight into the returned array (no intermediate copy: MNIST's 47 MB of training images
    load in milliseconds).

    Args:
      path: the file.

    Returns:
      A C-contiguous, writable array in native byte order with the file's shape and element type (``uint8`` for
      MNIST's ``*-ubyte`` files).

    Raises:
      DataError: the file is missing, is not valid gzip, has a bad magic number or type code, or its length does
        not match the sizes in its header (truncated or padded).
    """
    path = Path(path)
    try:
        with path.open("rb") as file:
            head = file.read(4 + 4 * 255)  # the longest possible header
            if head[:2] == _GZIP_MAGIC:
                data = _gunzip(path, head + file.read())
                shape, dtype, header = _layout(path, data, len(data))
                arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
                return arr.astype(dtype.newbyteorder("="), copy=True)
            shape, dtype, header = _layout(path, head, os.fstat(file.fileno()).st_size)
            # a bytearray, not np.empty: NumPy asks for transparent huge pages for large arrays, and where the kernel
            # must compact memory to find them, MNIST's 47 MB took 0.1 s to fault in instead of 0.02 s
            arr = np.frombuffer(bytearray(int(np.prod(shape)) * dtype.itemsize), dtype=dtype).reshape(shape)
            file.seek(header)
            read = file.readinto(memoryview(arr).cast("B")) if arr.size else 0
    except FileNotFoundError as exc:
        raise DataError(f"IDX file {str(path)!r} does not exist.") from exc
    except OSError as exc:
        raise DataError(f"Cannot read IDX file {str(path)!r}: {exc}.") from exc
    if read != arr.nbytes:
        raise DataError(f"IDX file {str(path)!r} changed while it was read ({read} of {arr.nbytes} bytes).")
    return arr if arr.dtype.isnative else arr.astype(dtype.newbyteorder("="))


def write_idx(path: PathLike, arr: np.ndarray) -> None:
    """Write ``arr`` as an IDX file, gzipped when ``path`` ends in ``.gz``.

    Args:
      path: the destination.
      arr: an array of at least one dimension with dtype uint8, int8, int16, int32, float32 or float64.

    Raises:
      DataError: the dtype or dimensionality cannot be stored in IDX.
    """
    arr = np.asarray(arr)
    native = arr.dtype.newbyteorder("=").str
    if native not in _CODE_OF:
        raise DataError(f"`arr` has dtype {arr.dtype}; IDX stores uint8, int8, int16, int32, float32, float64.")
    if not 1 <= arr.ndim <= 255:
        raise DataError(f"`arr` has {arr.ndim} dimensions; IDX stores 1 to 255.")
    code = _CODE_OF[native]
    header = bytes([0, 0, code, arr.ndim]) + np.asarray(arr.shape, dtype=">u4").tobytes()
    body = np.ascontiguousarray(arr, dtype=_TYPE_CODES[code]).tobytes()
    payload = header + body
    path = Path(path)
    if path.suffix == ".gz":
        payload = gzip.compress(payload, compresslevel=6, mtime=0)
    path.write_bytes(payload)


def array_sha256(arr: np.ndarray) -> str:
    """SHA-256 of an array's dtype, shape and bytes, so equal arrays hash equal whatever file they came from.

    The digest is ``sha256(f"{dtype.str}{shape}".encode() + bytes)`` with the array in C order and native byte
    order, e.g. ``"|u1(60000, 28, 28)"`` followed by the 47,040,000 pixel bytes of MNIST's training images.

    Args:
      arr: any NumPy array.

    Returns:
      The hex digest (64 characters).

    Example:
      >>> array_sha256(np.zeros(2, np.uint8)) == array_sha256(np.zeros(2, np.uint8))
      True
      >>> array_sha256(np.zeros(2, np.uint8)) == array_sha256(np.zeros((1, 2), np.uint8))
      False
    """
    arr = np.ascontiguousarray(arr)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    digest = hashlib.sha256(f"{arr.dtype.str}{tuple(arr.shape)}".encode())
    digest.update(arr.reshape(-1).view(np.uint8).data)
    return digest.hexdigest()
