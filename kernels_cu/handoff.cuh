#pragma once

// Hand-offs between blocks: a full fence, then a relaxed atomic (and volatile polling followed by
// a fence on the reading side).
__device__ __forceinline__ int publish_add(int* p, int v) {  // release my earlier writes, then add
  __threadfence();
  const int old = atomicAdd(p, v);
  __threadfence();
  return old;
}
__device__ __forceinline__ int poll(const int* p) {  // the caller fences after the value it waits for
  return *(volatile const int*)p;
}

// One warp, converged: wait until *p >= target, then fence. Lane 0 reads and broadcasts, so the warp
// spins in lock-step and reaches the caller's next barrier converged (a lone spinning lane would let
// its warp arrive split).
__device__ __forceinline__ void warp_wait_at_least(const int* p, int target) {
  int ready;
  do {
    ready = __shfl_sync(0xffffffffu, (threadIdx.x & 31) == 0 ? poll(p) : 0, 0);
    if (ready < target) __nanosleep(32);
  } while (ready < target);
  __threadfence();
}

// The next work item of this block, broadcast to every thread: tickets are taken in increasing
// order, so an item is only ever held by a block that is running. `slot` is a shared int; the
// caller's barrier after the item protects it.
__device__ __forceinline__ unsigned take_ticket(unsigned* ticket, int* slot) {
  if (threadIdx.x == 0) *slot = (int)atomicAdd(ticket, 1u);
  __syncthreads();
  return (unsigned)*slot;
}
