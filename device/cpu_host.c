/* cpu_host.c: host machine facts for the cpu backend (see cpu_host.h). */
#define _GNU_SOURCE
#include "cpu_host.h"

#include <ctype.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

size_t cpu_host_llc_bytes(void)
{
    int best_level = 0;
    size_t best = 0;
    for (int i = 0; i < 16; i++) {
        char path[128], buf[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        if (!read_line(path, buf, sizeof buf))
            break;
        int level = atoi(buf);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
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

size_t cpu_host_mem_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
}
