/* serve_prefix.c: the prefix cache index (see serve_prefix.h): a linear-
 * probing table from chained block hashes to lists of holders, and the
 * holders themselves in an array indexed by sequence id. */
#include "serve_prefix.h"

#include <stdlib.h>
#include <string.h>

typedef struct holder {
    bool used, pinned;
    int32_t *tokens;
    int64_t n, n_valid;
    uint64_t *hashes; /* chained hash of each indexed block */
    int64_t n_blocks; /* blocks indexed */
    uint64_t last_used;
} holder;

typedef struct node {
    int seq;
    int next; /* next node with the same hash, -1 at the end */
} node;

typedef struct slot {
    uint64_t key;
    int head; /* first node, -1 when the slot is empty */
} slot;

struct serve_prefix {
    int block;
    holder *h;
    int nh;
    slot *tab;
    size_t tab_cap, tab_used; /* cap is a power of two */
    node *nodes;
    int n_nodes, cap_nodes, free_node;
};

static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Hash of block k given the hash of blocks 0..k-1 (prev). */
static uint64_t block_hash(uint64_t prev, const int32_t *t, int n)
{
    uint64_t h = prev ^ 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint32_t)t[i]) * 0x100000001b3ull;
    return mix(h);
}

#define HASH_ROOT 0x6d6f6574756e6500ull

mt_status serve_prefix_create(int block_size, serve_prefix **out, mt_err *err)
{
    if (block_size < 1)
        return mt_fail(err, MT_E_INVALID, "serve_prefix_create: block size %d", block_size);
    serve_prefix *p = calloc(1, sizeof *p);
    if (!p)
        return mt_fail(err, MT_E_NOMEM, "serve_prefix_create: out of memory");
    p->block = block_size;
    p->free_node = -1;
    *out = p;
    return MT_OK;
}

static void holder_clear(holder *h)
{
    free(h->tokens);
    free(h->hashes);
    memset(h, 0, sizeof *h);
}

void serve_prefix_destroy(serve_prefix *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->nh; i++)
        holder_clear(&p->h[i]);
    free(p->h);
    free(p->tab);
    free(p->nodes);
    free(p);
}

static long find(const serve_prefix *p, uint64_t key)
{
    if (!p->tab_cap)
        return -1;
    size_t mask = p->tab_cap - 1;
    for (size_t i = key & mask;; i = (i + 1) & mask) {
        if (p->tab[i].head < 0)
            return -1;
        if (p->tab[i].key == key)
            return (long)i;
    }
}

static bool grow_table(serve_prefix *p)
{
    size_t cap = p->tab_cap ? p->tab_cap * 2 : 64;
    slot *t = malloc(cap * sizeof *t);
    if (!t)
        return false;
    for (size_t i = 0; i < cap; i++)
        t[i].head = -1;
    for (size_t i = 0; i < p->tab_cap; i++) {
        if (p->tab[i].head < 0)
            continue;
        size_t j = p->tab[i].key & (cap - 1);
        while (t[j].head >= 0)
            j = (j + 1) & (cap - 1);
        t[j] = p->tab[i];
    }
    free(p->tab);
    p->tab = t;
    p->tab_cap = cap;
    return true;
}

static int new_node(serve_prefix *p)
{
    if (p->free_node >= 0) {
        int i = p->free_node;
        p->free_node = p->nodes[i].next;
        return i;
    }
    if (p->n_nodes == p->cap_nodes) {
        int cap = p->cap_nodes ? p->cap_nodes * 2 : 256;
        node *n = realloc(p->nodes, (size_t)cap * sizeof *n);
        if (!n)
            return -1;
        p->nodes = n;
        p->cap_nodes = cap;
    }
    return p->n_nodes++;
}

static bool insert(serve_prefix *p, uint64_t key, int seq)
{
    if ((p->tab_used + 1) * 2 > p->tab_cap && !grow_table(p))
        return false;
    int nd = new_node(p);
    if (nd < 0)
        return false;
    p->nodes[nd].seq = seq;
    long s = find(p, key);
    if (s >= 0) {
        p->nodes[nd].next = p->tab[s].head;
        p->tab[s].head = nd;
        return true;
    }
    size_t mask = p->tab_cap - 1, i = key & mask;
    while (p->tab[i].head >= 0)
        i = (i + 1) & mask;
    p->nodes[nd].next = -1;
    p->tab[i] = (slot){key, nd};
    p->tab_used++;
    return true;
}

/* Empties slot i and shifts later entries of its probe run back. */
static void delete_slot(serve_prefix *p, size_t i)
{
    size_t mask = p->tab_cap - 1, j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (p->tab[j].head < 0)
            break;
        size_t k = p->tab[j].key & mask; /* where the entry at j wants to be */
        bool movable = (j > i) ? (k <= i || k > j) : (k <= i && k > j);
        if (movable) {
            p->tab[i] = p->tab[j];
            i = j;
        }
    }
    p->tab[i].head = -1;
    p->tab_used--;
}

static void unlink_seq(serve_prefix *p, uint64_t key, int seq)
{
    long s = find(p, key);
    if (s < 0)
        return;
    int *link = &p->tab[s].head;
    while (*link >= 0) {
        int nd = *link;
        if (p->nodes[nd].seq == seq) {
            *link = p->nodes[nd].next;
            p->nodes[nd].next = p->free_node;
            p->free_node = nd;
            break;
        }
        link = &p->nodes[nd].next;
    }
    if (p->tab[s].head < 0)
        delete_slot(p, (size_t)s);
}

static holder *get(const serve_prefix *p, int seq)
{
    return seq >= 0 && seq < p->nh && p->h[seq].used ? &p->h[seq] : NULL;
}

bool serve_prefix_has(const serve_prefix *p, int seq) { return get(p, seq) != NULL; }

/* Indexes the holder's whole computed blocks not indexed yet. */
static void index_blocks(serve_prefix *p, int seq)
{
    holder *h = &p->h[seq];
    int64_t want = h->n_valid / p->block;
    while (h->n_blocks < want) {
        int64_t k = h->n_blocks;
        uint64_t prev = k ? h->hashes[k - 1] : HASH_ROOT;
        uint64_t key = block_hash(prev, h->tokens + k * p->block, p->block);
        if (!insert(p, key, seq))
            return; /* out of memory: the rest stays unindexed (a cache miss later) */
        h->hashes[k] = key;
        h->n_blocks++;
    }
}

mt_status serve_prefix_add(serve_prefix *p, int seq, const int32_t *tokens, int64_t n,
                           int64_t n_valid, bool pinned, uint64_t now, mt_err *err)
{
    if (seq < 0 || n < 0 || get(p, seq))
        return mt_fail(err, MT_E_INVALID, "serve_prefix_add: sequence %d is %s", seq,
                       seq < 0 ? "negative" : "already a holder");
    if (seq >= p->nh) {
        int nh = p->nh ? p->nh : 16;
        while (nh <= seq)
            nh *= 2;
        holder *hs = realloc(p->h, (size_t)nh * sizeof *hs);
        if (!hs)
            return mt_fail(err, MT_E_NOMEM, "serve_prefix_add: out of memory");
        memset(hs + p->nh, 0, (size_t)(nh - p->nh) * sizeof *hs);
        p->h = hs;
        p->nh = nh;
    }
    holder *h = &p->h[seq];
    h->tokens = malloc((size_t)(n ? n : 1) * sizeof *h->tokens);
    h->hashes = malloc((size_t)(n / p->block + 1) * sizeof *h->hashes);
    if (!h->tokens || !h->hashes) {
        holder_clear(h);
        return mt_fail(err, MT_E_NOMEM, "serve_prefix_add: out of memory for %lld tokens",
                       (long long)n);
    }
    if (n)
        memcpy(h->tokens, tokens, (size_t)n * sizeof *tokens);
    h->used = true;
    h->pinned = pinned;
    h->n = n;
    h->n_valid = n_valid < n ? n_valid : n;
    h->last_used = now;
    index_blocks(p, seq);
    return MT_OK;
}

void serve_prefix_grow(serve_prefix *p, int seq, int64_t n_valid)
{
    holder *h = get(p, seq);
    if (!h || n_valid <= h->n_valid)
        return;
    h->n_valid = n_valid < h->n ? n_valid : h->n;
    index_blocks(p, seq);
}

void serve_prefix_unpin(serve_prefix *p, int seq, uint64_t now)
{
    holder *h = get(p, seq);
    if (h) {
        h->pinned = false;
        h->last_used = now;
    }
}

void serve_prefix_remove(serve_prefix *p, int seq)
{
    holder *h = get(p, seq);
    if (!h)
        return;
    for (int64_t k = 0; k < h->n_blocks; k++)
        unlink_seq(p, h->hashes[k], seq);
    holder_clear(h);
}

int64_t serve_prefix_match(serve_prefix *p, const int32_t *tokens, int64_t n, int64_t max,
                           uint64_t now, int *seq)
{
    *seq = -1;
    int64_t limit = n < max ? n : max, blocks = 0;
    uint64_t h = HASH_ROOT;
    /* Walk down while the chained hash is known; remember each level's slot. */
    int64_t cap = limit / p->block;
    long *slots = cap ? malloc((size_t)cap * sizeof *slots) : NULL;
    if (cap && !slots)
        return 0;
    while (blocks < cap) {
        h = block_hash(h, tokens + blocks * p->block, p->block);
        long s = find(p, h);
        if (s < 0)
            break;
        slots[blocks++] = s;
    }
    /* The deepest level with a holder whose tokens really match. */
    int64_t got = 0;
    for (int64_t k = blocks; k > 0 && *seq < 0; k--) {
        size_t len = (size_t)(k * p->block) * sizeof *tokens;
        for (int nd = p->tab[slots[k - 1]].head; nd >= 0; nd = p->nodes[nd].next) {
            holder *hd = get(p, p->nodes[nd].seq);
            if (hd && !memcmp(hd->tokens, tokens, len)) {
                *seq = p->nodes[nd].seq;
                hd->last_used = now;
                got = k * p->block;
                break;
            }
        }
    }
    free(slots);
    return got;
}

bool serve_prefix_evict(serve_prefix *p, int *seq)
{
    return serve_prefix_evict_if(p, NULL, NULL, seq);
}

bool serve_prefix_evict_if(serve_prefix *p, bool (*ok)(void *ctx, int seq), void *ctx, int *seq)
{
    int best = -1;
    for (int i = 0; i < p->nh; i++) {
        holder *h = &p->h[i];
        if (h->used && !h->pinned && (best < 0 || h->last_used < p->h[best].last_used) &&
            (!ok || ok(ctx, i)))
            best = i;
    }
    if (best < 0)
        return false;
    serve_prefix_remove(p, best);
    *seq = best;
    return true;
}

int serve_prefix_retained(const serve_prefix *p)
{
    int c = 0;
    for (int i = 0; i < p->nh; i++)
        c += p->h[i].used && !p->h[i].pinned;
    return c;
}

int serve_prefix_holders(const serve_prefix *p)
{
    int c = 0;
    for (int i = 0; i < p->nh; i++)
        c += p->h[i].used;
    return c;
}
