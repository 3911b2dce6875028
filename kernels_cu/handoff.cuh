#pragma once

// Hand-offs between blocks. The default is the classic pair: a full fence, then a relaxed
// atomic (and volatile polling followed by a fence). With SS_FAST_HANDOFF the same orderings come
// from a release/acquire atomic and acquire loads, which avoid the sequentially consistent fence.
__device__ __forceinline__ int publish_add(int* p, int v) {  // release my earlier writes, then add
#ifdef SS_FAST_HANDOFF
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
#else
  __threadfence();
  const int old = atomicAdd(p, v);
  __threadfence();
  return old;
#endif
}
__device__ __forceinline__ int poll(const int* p) {  // acquire: later reads see what was published
#ifdef SS_FAST_HANDOFF
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#else
  return *(volatile const int*)p;
#endif
}

