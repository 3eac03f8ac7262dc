/* cpu_compat.h - force-included into the clang compile of the library for
 * the libFuzzer targets, only when that clang rejects
 * __builtin_cpu_supports("f16c") (clang < 16 does): answers the same
 * questions from cpuid, so codec/codec.c builds unchanged. */
#ifndef KVT_FUZZ_CPU_COMPAT_H
#define KVT_FUZZ_CPU_COMPAT_H

#include <cpuid.h>
#include <string.h>

static inline int kvt_fuzz_cpu_supports(const char *f) {
  unsigned a, b, c, d, b7 = 0, x0 = 0, x1 = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  if (__get_cpuid_max(0, 0) >= 7) {
    unsigned a7, c7, d7;
    __cpuid_count(7, 0, a7, b7, c7, d7);
  }
  int osxsave = (c >> 27) & 1;
  if (osxsave) __asm__("xgetbv" : "=a"(x0), "=d"(x1) : "c"(0));
  int avx_os = osxsave && (x0 & 6) == 6; /* the OS saves SSE and AVX state */
  if (!strcmp(f, "avx")) return avx_os && ((c >> 28) & 1);
  if (!strcmp(f, "avx2")) return avx_os && ((b7 >> 5) & 1);
  if (!strcmp(f, "fma")) return avx_os && ((c >> 12) & 1);
  if (!strcmp(f, "f16c")) return avx_os && ((c >> 29) & 1);
  return 0;
}
#define __builtin_cpu_init() ((void)0)
#define __builtin_cpu_supports(f) kvt_fuzz_cpu_supports(f)

#endif
