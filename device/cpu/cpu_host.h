/* cpu_host.h: facts about the host machine for the cpu backend's properties
 * (private to device/). Each reads /proc, /sys or the host compiler once per
 * call; none fails: unknown values come back as 0 or a generic name. */
#ifndef MT_CPU_HOST_H
#define MT_CPU_HOST_H

#include <stdbool.h>
#include <stddef.h>

/* CPUs this process may run on (its affinity mask), at least 1. */
int cpu_host_count(void);

/* The target the host compiler picks for -march=native ("znver3",
 * "sapphirerapids"), else the x86-64 level from cpuid ("x86-64-v3"). */
void cpu_host_arch(char *out, size_t cap);

/* True when every instruction-set feature the host compiler enables for
 * -march=<march> it also enables for -march=native (so code built for march
 * runs here); else false with the first missing feature in why. */
bool cpu_host_march_ok(const char *march, char *why, size_t cap);

/* /proc/cpuinfo's model name, else "unknown cpu". */
void cpu_host_name(char *out, size_t cap);

/* Where a cache size came from. */
typedef enum cpu_cache_src {
    CPU_CACHE_NONE = 0,
    CPU_CACHE_SYSFS = 1,   /* <root>/devices/system/cpu/cpu0/cache/index*    */
    CPU_CACHE_SYSCONF = 2, /* glibc's sysconf(_SC_LEVEL{3,2,1}_..CACHE_SIZE) */
    CPU_CACHE_CPUID = 3,   /* deterministic cache parameters: leaf 4 (Intel),
                            * 0x8000001D (AMD, Hygon)                        */
    CPU_CACHE_SRC_COUNT
} cpu_cache_src;

/* "sysfs", "sysconf", "cpuid" or "none". */
const char *cpu_cache_src_str(cpu_cache_src src);

/* Size in bytes of the highest cache level of cpu0, 0 if unknown. Asks sysfs
 * under sysfs_root (NULL: "/sys"; tests pass a fake tree), then sysconf, then
 * cpuid: containers and VMs often hide sysfs's cache directories. *src, when
 * not NULL, names the source that answered. */
size_t cpu_host_llc_bytes(const char *sysfs_root, cpu_cache_src *src);

/* One source alone (0 when it has no answer), for tests and for
 * cpu_host_llc_bytes. cpuid is 0 off x86. */
size_t cpu_host_llc_bytes_sysfs(const char *sysfs_root);
size_t cpu_host_llc_bytes_sysconf(void);
size_t cpu_host_llc_bytes_cpuid(void);

/* AMX tiles for this process. */
typedef enum cpu_amx {
    CPU_AMX_NONE = 0,   /* the cpu lacks AMX-TILE or AMX-BF16 */
    CPU_AMX_USABLE = 1, /* and the OS saves tile state and let this process use it */
    CPU_AMX_REFUSED = 2 /* the cpu has them, the OS does not enable or permit them */
} cpu_amx;

/* Whether this process may run AMX tile instructions (AMX-TILE and
 * AMX-BF16 in cpuid, tile state in XCR0, and on Linux the tile data
 * permission, asked for once with arch_prctl(ARCH_REQ_XCOMP_PERM): without
 * it the first tile instruction raises SIGILL). The permission is the
 * process's, so every pool thread has it once this returned USABLE. */
cpu_amx cpu_host_amx(void);

/* Physical memory in bytes. */
size_t cpu_host_mem_bytes(void);

#endif
