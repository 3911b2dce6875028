"""The wheel installs only the package: kernels_cu/ and models/ ride inside it, nothing named cli, models
or kernels_cu reaches the top of site-packages, and the package finds its kernels and embedded pair there."""
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_top_level_names(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q",
                    "-w", str(tmp_path)], check=True, capture_output=True)
    wheel, = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"specsample_cupy", wheel.name.split("-")[0] + "-0.1.0.dist-info"}
    assert "specsample_cupy/kernels_cu/verify.cu" in names
    assert "specsample_cupy/models/stdlib-code/draft/tokenizer.json" in names
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "specsample = specsample_cupy.cli.main:main" in entry
