// The per-row record warp_rows_kernel writes and verify_kernel's warped mode reads (floats):
// [M / T, E (kept mass), first argmax (int bits), M, dmax, unused]. An entry z of the row is kept
// iff M - z <= dmax (float32); E sums exp((z - M) / T) over the kept entries.
#pragma once
#define SS_RECORD 6
#define SS_REC_M 0
#define SS_REC_S 1
#define SS_REC_ARG 2
#define SS_REC_MAX 3
#define SS_REC_DMAX 4
