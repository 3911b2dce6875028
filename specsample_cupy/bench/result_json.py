"""Benchmark results as compact JSON: floats to 4 significant digits (beyond what the timings resolve),
no spaces, and per-seed runs without the fields their row already states."""
import json
import statistics

RUN_FIELDS_IN_ROW = ("loop", "tokens_per_request")


def compact(value):
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, dict):
        if "seed" in value:   # one seed's run inside a row
            value = {k: v for k, v in value.items() if k not in RUN_FIELDS_IN_ROW}
        return {k: compact(v) for k, v in value.items()}
    return value


def write(path, data) -> None:
    with open(path, "w") as f:
        json.dump(compact(data), f, separators=(",", ":"), ensure_ascii=False)


def median_range(values) -> dict:
    """{median, min, max} of a row's per-seed values: how every benchmark states a spread."""
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def gpu_name(device_id: int | None = None) -> str:
    """The CUDA device's name, as result files record it (the current device by default)."""
    import cupy
    device_id = cupy.cuda.Device().id if device_id is None else device_id
    return cupy.cuda.runtime.getDeviceProperties(device_id)["name"].decode()
