import pytest


def _cuda_available():
    try:
        import cupy
    except ImportError:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


HAS_CUDA = _cuda_available()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA device and CuPy")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny random target/draft pair; vocab 48 keeps EOS (id 0) rare, so most requests run to
    their budget. Modules that need another pair define their own `pair`."""
    from models.build_tiny import build_tiny_pair
    return build_tiny_pair(str(tmp_path_factory.mktemp("tiny")), vocab_size=48, seed=3)
