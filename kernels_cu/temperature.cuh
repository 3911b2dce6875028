// The per-request temperature rule every kernel applies (specsample_cupy/verification/cpu_numpy.py has it too).
#pragma once

// Request b's temperature (temps[b], or the scalar when temps is null). A negative or non-finite
// value is an error (bad = true) and the request is then treated at temperature 1; 0 means greedy
// where the method has a greedy mode.
__device__ __forceinline__ float request_temperature(const float* temps, float scalar, int b, bool& bad) {
  const float t = temps ? temps[b] : scalar;
  bad = !(t >= 0.f && t < __int_as_float(0x7f800000));
  return bad ? 1.f : t;
}
