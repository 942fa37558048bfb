/* cpu_host.h: facts about the host machine for the cpu backend's properties
 * (private to device/). Each reads /proc, /sys or the host compiler once per
 * call; none fails: unknown values come back as 0 or a generic name. */
#ifndef MT_CPU_HOST_H
#define MT_CPU_HOST_H

#include <stddef.h>

/* CPUs this process may run on (its affinity mask), at least 1. */
int cpu_host_count(void);

/* The target the host compiler picks for -march=native ("znver3",
 * "sapphirerapids"), else the x86-64 level from cpuid ("x86-64-v3"). */
void cpu_host_arch(char *out, size_t cap);

/* /proc/cpuinfo's model name, else "unknown cpu". */
void cpu_host_name(char *out, size_t cap);

/* Size of the highest cache level of cpu0 in bytes, 0 if unknown. */
size_t cpu_host_llc_bytes(void);

/* Physical memory in bytes. */
size_t cpu_host_mem_bytes(void);

#endif
