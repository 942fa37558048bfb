/* emu_mem.c: device buffers of the emu backend. Each buffer is its own
 * mapping with a PROT_NONE page on both sides and its data (rounded up to
 * 16 bytes) ending flush against the trailing one, so a kernel that runs off
 * either end faults at once, and the fault can be named by buffer. */
#define _GNU_SOURCE
#include "emu_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef MOETUNE_ASAN
#include <sanitizer/asan_interface.h>
#endif

void emu_mem_init(emu_mem *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->page = (size_t)sysconf(_SC_PAGESIZE);
}

void emu_mem_destroy(emu_mem *m)
{
    for (int i = 0; i < m->n; i++)
        munmap(m->v[i].map, m->v[i].map_len);
    free(m->v);
    pthread_mutex_destroy(&m->mu);
    memset(m, 0, sizeof *m);
}

mt_status emu_mem_alloc(emu_mem *m, size_t bytes, void **ptr, mt_err *err)
{
    *ptr = NULL;
    size_t page = m->page;
    size_t data = (bytes + 15) & ~(size_t)15;
    if (data < bytes || data > SIZE_MAX - 3 * page)
        return mt_fail(err, MT_E_NOMEM, "emu: cannot allocate %zu bytes", bytes);
    size_t data_pages = (data + page - 1) / page * page;
    if (data_pages == 0)
        data_pages = page; /* a zero-byte buffer still gets a page to point into */
    size_t len = data_pages + 2 * page;
    char *map = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (map == MAP_FAILED)
        return mt_fail(err, MT_E_NOMEM, "emu: cannot map %zu bytes for a buffer: %s",
                       bytes, strerror(errno));
    if (mprotect(map + page, data_pages, PROT_READ | PROT_WRITE) != 0) {
        int e = errno;
        munmap(map, len);
        return mt_fail(err, MT_E_NOMEM, "emu: mprotect of a %zu-byte buffer failed: %s",
                       bytes, strerror(e));
    }
#ifdef MOETUNE_ASAN
    /* A fresh mapping may sit where a freed fiber stack kept poison. */
    ASAN_UNPOISON_MEMORY_REGION(map, len);
#endif
    emu_buf b = {
        .user = (uintptr_t)(map + page + data_pages - data),
        .size = bytes,
        .map = map,
        .map_len = len,
    };
    pthread_mutex_lock(&m->mu);
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        emu_buf *v = realloc(m->v, (size_t)cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&m->mu);
            munmap(map, len);
            return mt_fail(err, MT_E_NOMEM, "emu: out of memory for the buffer table");
        }
        m->v = v;
        m->cap = cap;
    }
    m->v[m->n++] = b;
    pthread_mutex_unlock(&m->mu);
    *ptr = (void *)b.user;
    return MT_OK;
}

void emu_mem_free(emu_mem *m, void *ptr)
{
    if (!ptr)
        return;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n; i++) {
        if (m->v[i].user == (uintptr_t)ptr) {
            munmap(m->v[i].map, m->v[i].map_len);
            m->v[i] = m->v[--m->n];
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

mt_status emu_mem_check(emu_mem *m, const void *p, size_t n, const char *what,
                        mt_err *err)
{
    uintptr_t a = (uintptr_t)p;
    mt_status st = MT_OK;
    pthread_mutex_lock(&m->mu);
    int hit = -1;
    for (int i = 0; i < m->n; i++) {
        const emu_buf *b = &m->v[i];
        if (a >= b->user && a <= b->user + b->size) {
            hit = i;
            break;
        }
    }
    if (hit < 0) {
        st = mt_fail(err, MT_E_INVALID, "emu: %s of %zu bytes at %p: not an emu buffer",
                     what, n, p);
    } else {
        const emu_buf *b = &m->v[hit];
        size_t off = a - b->user;
        if (n > b->size - off)
            st = mt_fail(err, MT_E_INVALID,
                         "emu: %s of %zu bytes at offset %zu of buffer %p runs %zu "
                         "bytes past its end (%zu bytes)",
                         what, n, off, (void *)b->user, n - (b->size - off), b->size);
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}

void emu_mem_describe(const emu_mem *m, uintptr_t addr, char *out, size_t cap)
{
    const emu_buf *best = NULL;
    uintptr_t best_d = UINTPTR_MAX;
    for (int i = 0; i < m->n; i++) {
        const emu_buf *b = &m->v[i];
        uintptr_t lo = (uintptr_t)b->map, hi = lo + b->map_len;
        if (addr >= lo && addr < hi) {
            best = b;
            best_d = UINTPTR_MAX;
            break;
        }
        uintptr_t d = addr < lo ? lo - addr : addr - hi;
        if (d < best_d) {
            best_d = d;
            best = b;
        }
    }
    if (addr < m->page * 16) {
        snprintf(out, cap, "a NULL pointer dereference (offset %" PRIuPTR ")", addr);
        return;
    }
    if (!best || (best_d != UINTPTR_MAX && best_d > ((uintptr_t)1 << 20))) {
        snprintf(out, cap, "not inside or next to any emu buffer");
        return;
    }
    uintptr_t end = best->user + best->size;
    if (addr >= end)
        snprintf(out, cap, "%" PRIuPTR " bytes past the end of buffer %p (%zu bytes)",
                 addr - end, (void *)best->user, best->size);
    else if (addr < best->user)
        snprintf(out, cap, "%" PRIuPTR " bytes before the start of buffer %p (%zu bytes)",
                 best->user - addr, (void *)best->user, best->size);
    else
        snprintf(out, cap, "at offset %" PRIuPTR " inside buffer %p (%zu bytes)",
                 addr - best->user, (void *)best->user, best->size);
}
