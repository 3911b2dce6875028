"""Where the project's two data folders are: kernels_cu/ (CUDA sources) and models/ (the embedded pair and
the model recipes). In the repository they sit beside specsample_cupy/; an installed wheel carries them
inside it (specsample_cupy.kernels_cu, specsample_cupy.models), so that nothing but specsample_cupy
lands at the top of site-packages.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
from pathlib import Path


@functools.lru_cache(maxsize=None)
def package_name(folder: str) -> str:
    """The importable name of `folder` ("kernels_cu" or "models"): inside the package when installed
    from a wheel, else the repository's top-level folder."""
    try:
        importlib.import_module(f"specsample_cupy.{folder}")
        return f"specsample_cupy.{folder}"
    except ModuleNotFoundError:
        return folder


def models_module(name: str):
    """models/<name>.py as a module, wherever models/ is."""
    return importlib.import_module(f"{package_name('models')}.{name}")


def derived_folder(kind: str, source, *extra) -> Path:
    """~/.cache/specsample/<kind>/<key>: where a file derived from `source` (a model file) is kept, the
    key from the source's resolved path, size and modification time (and `extra`), so that a changed
    source is derived again."""
    source = Path(source)
    stat = source.stat()
    text = "|".join(map(str, (source.resolve(), stat.st_size, stat.st_mtime_ns, *extra)))
    return Path.home() / ".cache" / "specsample" / kind / hashlib.sha256(text.encode()).hexdigest()[:16]
