/* cpu_host.c: host machine facts for the cpu backend (see cpu_host.h). */
#define _GNU_SOURCE
#include "cpu_host.h"

#include <ctype.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#ifdef __linux__
#include <sys/syscall.h>
#endif

int cpu_host_count(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = 0;
    size_t lead = strspn(s, " \t");
    memmove(s, s + lead, strlen(s + lead) + 1);
}

/* Asks the host compiler (gcc's -Q --help=target) what -march=native means
 * here. Returns 0 when it could not tell (e.g. clang). */
static int compiler_native_arch(char *out, size_t cap)
{
    const char *cc = getenv("MOETUNE_CC");
    if (!cc || !*cc)
        cc = "cc";
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s -march=native -Q --help=target 2>/dev/null", cc);
    FILE *p = popen(cmd, "r");
    if (!p)
        return 0;
    char line[512];
    int found = 0;
    while (fgets(line, sizeof line, p)) {
        char *m = strstr(line, "-march=");
        if (!found && m && m == line + strspn(line, " \t")) {
            m += strlen("-march=");
            trim(m);
            if (*m && strlen(m) < cap) {
                snprintf(out, cap, "%s", m);
                found = 1;
            }
        }
    }
    pclose(p);
    return found;
}

/* The feature macros (__AVX2__, __SSE4_2__, __FMA__, ...) the host compiler
 * predefines for -march=<march>, as one space-separated string in out. */
static bool march_features(const char *march, char *out, size_t cap)
{
    const char *cc = getenv("MOETUNE_CC");
    if (!cc || !*cc)
        cc = "cc";
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s -march=%s -dM -E - </dev/null 2>/dev/null", cc, march);
    FILE *p = popen(cmd, "r");
    if (!p)
        return false;
    char line[512];
    size_t n = 0;
    out[0] = 0;
    static const char *const isa_prefix[] = {"__SSE", "__AVX", "__FMA", "__BMI", "__F16C",
                                             "__POPCNT", "__LZCNT", "__MOVBE", "__VPCLMUL",
                                             "__GFNI", "__VAES", "__SHA", "__AES", "__PCLMUL"};
    while (fgets(line, sizeof line, p)) {
        char name[128];
        if (sscanf(line, "#define %127s", name) != 1)
            continue;
        for (size_t i = 0; i < sizeof isa_prefix / sizeof *isa_prefix; i++)
            if (!strncmp(name, isa_prefix[i], strlen(isa_prefix[i])) && n + strlen(name) + 2 < cap) {
                n += (size_t)snprintf(out + n, cap - n, " %s ", name);
                break;
            }
    }
    return pclose(p) == 0 && n > 0;
}

bool cpu_host_march_ok(const char *march, char *why, size_t cap)
{
    char want[4096], have[4096];
    if (!march_features(march, want, sizeof want) ||
        !march_features("native", have, sizeof have)) {
        snprintf(why, cap, "the host compiler does not know -march=%s", march);
        return false;
    }
    for (char *w = want; (w = strstr(w, " __")) != NULL;) {
        char name[128];
        if (sscanf(w, " %127s", name) != 1)
            break;
        char key[140];
        snprintf(key, sizeof key, " %s ", name);
        if (!strstr(have, key)) {
            snprintf(why, cap, "this CPU lacks %s, which -march=%s assumes", name, march);
            return false;
        }
        w += strlen(key) - 1;
    }
    return true;
}

void cpu_host_arch(char *out, size_t cap)
{
    if (compiler_native_arch(out, cap))
        return;
#if defined(__x86_64__)
    __builtin_cpu_init();
    const char *level = "x86-64";
    if (__builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("popcnt"))
        level = "x86-64-v2";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("bmi2"))
        level = "x86-64-v3";
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        level = "x86-64-v4";
    snprintf(out, cap, "%s", level);
#elif defined(__aarch64__)
    snprintf(out, cap, "aarch64");
#else
    snprintf(out, cap, "unknown");
#endif
}

void cpu_host_name(char *out, size_t cap)
{
    snprintf(out, cap, "unknown cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        char *colon = strchr(line, ':');
        if (colon) {
            trim(colon + 1);
            if (colon[1])
                snprintf(out, cap, "%s", colon + 1);
        }
        break;
    }
    fclose(f);
}

static int read_line(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    if (ok)
        trim(buf);
    return ok;
}

size_t cpu_host_llc_bytes_sysfs(const char *sysfs_root)
{
    if (!sysfs_root)
        sysfs_root = "/sys";
    int best_level = 0;
    size_t best = 0;
    for (int i = 0; i < 16; i++) {
        char path[4096], buf[64];
        snprintf(path, sizeof path, "%s/devices/system/cpu/cpu0/cache/index%d/level",
                 sysfs_root, i);
        if (!read_line(path, buf, sizeof buf))
            break;
        int level = atoi(buf);
        snprintf(path, sizeof path, "%s/devices/system/cpu/cpu0/cache/index%d/size",
                 sysfs_root, i);
        if (!read_line(path, buf, sizeof buf))
            continue;
        char *end = NULL;
        unsigned long long v = strtoull(buf, &end, 10);
        if (end && (*end == 'K' || *end == 'k'))
            v <<= 10;
        else if (end && (*end == 'M' || *end == 'm'))
            v <<= 20;
        if (level > best_level || (level == best_level && v > best)) {
            best_level = level;
            best = (size_t)v;
        }
    }
    return best;
}

size_t cpu_host_llc_bytes_sysconf(void)
{
    /* glibc answers from cpuid on x86 and from the auxv/sysfs elsewhere;
     * an absent level is 0 (or -1 where the name is unknown). */
    static const int names[] = {
#ifdef _SC_LEVEL4_CACHE_SIZE
        _SC_LEVEL4_CACHE_SIZE,
#endif
#ifdef _SC_LEVEL3_CACHE_SIZE
        _SC_LEVEL3_CACHE_SIZE,
#endif
#ifdef _SC_LEVEL2_CACHE_SIZE
        _SC_LEVEL2_CACHE_SIZE,
#endif
#ifdef _SC_LEVEL1_DCACHE_SIZE
        _SC_LEVEL1_DCACHE_SIZE,
#endif
        -1,
    };
    for (size_t i = 0; names[i] != -1; i++) {
        long v = sysconf(names[i]);
        if (v > 0)
            return (size_t)v;
    }
    return 0;
}

size_t cpu_host_llc_bytes_cpuid(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d))
        return 0;
    unsigned max_basic = a;
    char vendor[13];
    memcpy(vendor, &b, 4);
    memcpy(vendor + 4, &d, 4);
    memcpy(vendor + 8, &c, 4);
    vendor[12] = 0;
    /* Both leaves list one cache per subleaf in the same layout, ending at
     * type 0. AMD's needs TOPOEXT (0x80000001 ECX bit 22). */
    unsigned leaf = 0;
    bool amd = !strcmp(vendor, "AuthenticAMD") || !strcmp(vendor, "HygonGenuine");
    unsigned max_ext = __get_cpuid(0x80000000, &a, &b, &c, &d) ? a : 0;
    if (amd) {
        if (max_ext >= 0x8000001D && __get_cpuid(0x80000001, &a, &b, &c, &d) &&
            (c & (1u << 22)))
            leaf = 0x8000001D;
    } else if (max_basic >= 4) {
        leaf = 4;
    }
    if (!leaf) {
        /* AMD's older leaf: L3 in 512 KiB units (EDX[31:18]), L2 in KiB
         * (ECX[31:16]). VMs often hide TOPOEXT but pass this one. */
        if (!amd || max_ext < 0x80000006)
            return 0;
        __cpuid(0x80000006, a, b, c, d);
        if (d >> 18)
            return (size_t)(d >> 18) << 19;
        return (size_t)(c >> 16) << 10;
    }
    unsigned best_level = 0;
    size_t best = 0;
    for (unsigned i = 0; i < 16; i++) {
        __cpuid_count(leaf, i, a, b, c, d);
        unsigned type = a & 0x1f, level = (a >> 5) & 0x7;
        if (type == 0)
            break;
        if (type == 2) /* instruction cache */
            continue;
        size_t ways = ((b >> 22) & 0x3ff) + 1, parts = ((b >> 12) & 0x3ff) + 1;
        size_t line = (b & 0xfff) + 1, sets = (size_t)c + 1;
        size_t v = ways * parts * line * sets;
        if (level > best_level || (level == best_level && v > best)) {
            best_level = level;
            best = v;
        }
    }
    return best;
#else
    return 0;
#endif
}

const char *cpu_cache_src_str(cpu_cache_src src)
{
    static const char *const names[] = {
        [CPU_CACHE_NONE] = "none",
        [CPU_CACHE_SYSFS] = "sysfs",
        [CPU_CACHE_SYSCONF] = "sysconf",
        [CPU_CACHE_CPUID] = "cpuid",
    };
    _Static_assert(sizeof names / sizeof names[0] == CPU_CACHE_SRC_COUNT, "cache sources");
    return (unsigned)src < CPU_CACHE_SRC_COUNT ? names[src] : "none";
}

size_t cpu_host_llc_bytes(const char *sysfs_root, cpu_cache_src *src)
{
    size_t v = cpu_host_llc_bytes_sysfs(sysfs_root);
    cpu_cache_src from = CPU_CACHE_SYSFS;
    if (!v) {
        v = cpu_host_llc_bytes_sysconf();
        from = CPU_CACHE_SYSCONF;
    }
    if (!v) {
        v = cpu_host_llc_bytes_cpuid();
        from = CPU_CACHE_CPUID;
    }
    if (src)
        *src = v ? from : CPU_CACHE_NONE;
    return v;
}

size_t cpu_host_mem_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
}

#if defined(__x86_64__) && defined(__linux__)
static cpu_amx amx_probe(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22)))
        return CPU_AMX_NONE; /* AMX-TILE: bit 24, AMX-BF16: bit 22 */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27)))
        return CPU_AMX_REFUSED; /* no OSXSAVE: no XCR0 to read */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17))
        return CPU_AMX_REFUSED; /* XTILECFG, XTILEDATA not enabled by the OS */
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
               ? CPU_AMX_USABLE
               : CPU_AMX_REFUSED;
}
#endif

cpu_amx cpu_host_amx(void)
{
#if defined(__x86_64__) && defined(__linux__)
    static int state = -1; /* the probe's answer never changes; asking twice is harmless */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s < 0) {
        s = (int)amx_probe();
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return (cpu_amx)s;
#else
    return CPU_AMX_NONE;
#endif
}
