/* serve_mask.c: the vocabulary index, the token mask of a grammar state and
 * the cache of masks by state (see serve_mask.h). */
#include "serve_mask.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* A trie node: its children are nodes [child, child + n_child), sorted by
 * byte; the tokens whose bytes end here are ids[tok, tok + n_tok). */
typedef struct tnode {
    uint32_t child, tok;
    uint16_t n_child, n_tok;
    uint8_t byte;
} tnode;

/* String bodies (serve_grammar_in_string kinds 1 JSON, 2 raw), by the
 * UTF-8 continuation they wait for (serve_grammar_utf8_class). */
enum { KINDS = 3, CLASSES = SERVE_GRAMMAR_UTF8_CLASSES };

/* A token that may leave a string body: `chars` characters inside the
 * string, then a special byte at `off` ('"' or '\\' in JSON, '<' in raw
 * text). Tokens whose bytes from `off` on are equal and whose fate does not
 * depend on the string's count (a closing quote, a "</" terminator) share a
 * group, decided once per mask; the others (escapes, a '<' of content) are
 * stepped alone. */
typedef struct xent {
    const char *sfx;  /* the token's bytes from off on (in the vocabulary's storage) */
    uint32_t sfx_len;
    int32_t id;
    uint32_t chars, off;
    uint32_t group;   /* UINT32_MAX: alone */
} xent;

struct serve_vocab {
    int32_t n;
    size_t words;
    char *bytes;     /* all tokens' bytes */
    uint64_t *off;   /* token i: bytes[off[i] .. off[i + 1]) */
    bool *text;
    tnode *nodes;
    uint32_t n_nodes;
    int32_t *ids;
    uint32_t max_len; /* longest token, in bytes */
    /* Per string kind and class: in[k][c][r * words ...] the tokens that
     * stay inside the string with at most r characters (r <= max_chars);
     * exits the tokens that may leave it. */
    uint64_t *in[KINDS][CLASSES];
    uint32_t max_chars[KINDS][CLASSES];
    xent *exits[KINDS][CLASSES];
    int32_t n_exits[KINDS][CLASSES];
    uint32_t n_groups[KINDS][CLASSES], max_groups;
    pthread_mutex_t mu;    /* guards the scratch below */
    serve_gstate *scratch; /* max_len + 1 states for the trie walk */
    uint32_t *memo_gen;    /* per group: the mask computation that decided it */
    uint8_t *memo_ok;
    uint32_t gen;
};

/* ---- building ------------------------------------------------------------------ */

typedef struct bsort {
    const uint8_t *p;
    uint32_t n;
    int32_t id;
} bsort;

static int bsort_cmp(const void *a, const void *b)
{
    const bsort *x = a, *y = b;
    uint32_t n = x->n < y->n ? x->n : y->n;
    int c = n ? memcmp(x->p, y->p, n) : 0;
    if (c)
        return c;
    if (x->n != y->n)
        return x->n < y->n ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The trie over the sorted byte strings, breadth first so that each node's
 * children are contiguous. */
static mt_status build_trie(serve_vocab *v, const bsort *t, uint32_t nt, mt_err *err)
{
    typedef struct qi {
        uint32_t node, lo, hi, depth;
    } qi;
    /* A node per distinct prefix: at most the total bytes plus the root. */
    uint64_t total = 1;
    for (uint32_t i = 0; i < nt; i++)
        total += t[i].n;
    if (total > UINT32_MAX / 2)
        return mt_fail(err, MT_E_INVALID, "vocabulary of %llu bytes is too large",
                       (unsigned long long)total);
    v->nodes = calloc((size_t)total, sizeof *v->nodes);
    v->ids = malloc(((size_t)nt + 1) * sizeof *v->ids);
    qi *q = malloc((size_t)total * sizeof *q);
    if (!v->nodes || !v->ids || !q) {
        free(q);
        return mt_fail(err, MT_E_NOMEM, "vocabulary index");
    }
    uint32_t nn = 1, qh = 0, qt = 0, ni = 0;
    q[qt++] = (qi){0, 0, nt, 0};
    while (qh < qt) {
        qi it = q[qh++];
        tnode *nd = &v->nodes[it.node];
        uint32_t i = it.lo;
        nd->tok = ni;
        while (i < it.hi && t[i].n == it.depth) {
            v->ids[ni++] = t[i].id;
            nd->n_tok++;
            i++;
        }
        nd->child = nn;
        while (i < it.hi) {
            uint8_t b = t[i].p[it.depth];
            uint32_t j = i;
            while (j < it.hi && t[j].p[it.depth] == b)
                j++;
            tnode *c = &v->nodes[nn];
            c->byte = b;
            q[qt++] = (qi){nn, i, j, it.depth + 1};
            nn++;
            v->nodes[it.node].n_child++;
            i = j;
        }
    }
    v->n_nodes = nn;
    free(q);
    return MT_OK;
}

enum { SCAN_BAD = 0, SCAN_IN = 1, SCAN_EXIT = 2 };

static bool special_byte(int k, uint8_t b) { return k == 1 ? b == '"' || b == '\\' : b == '<'; }

/* Token bytes p[0..n) read in a string body of kind k that waits for the
 * UTF-8 continuation of class cls: SCAN_IN when they all stay inside
 * (*chars characters), SCAN_EXIT when a special byte comes at *at after
 * *chars characters, SCAN_BAD when the string refuses them before. */
static int scan(int k, int cls, const uint8_t *p, uint32_t n, uint32_t *chars, uint32_t *at)
{
    int pending;
    uint8_t lo, hi;
    serve_grammar_utf8_expect(cls, &pending, &lo, &hi);
    uint32_t c = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t b = p[i];
        if (pending) {
            if (b < lo || b > hi)
                return SCAN_BAD;
            pending--;
            lo = 0x80;
            hi = 0xBF;
            continue;
        }
        if (special_byte(k, b)) {
            *chars = c;
            *at = i;
            return SCAN_EXIT;
        }
        if ((k == 1 && b < 0x20) || (k == 2 && b == 0))
            return SCAN_BAD;
        c++;
        if (b < 0x80)
            continue;
        if (b >= 0xC2 && b <= 0xDF)
            pending = 1;
        else if (b >= 0xE0 && b <= 0xEF)
            pending = 2, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
        else if (b >= 0xF0 && b <= 0xF4)
            pending = 3, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
        else
            return SCAN_BAD;
    }
    *chars = c;
    return SCAN_IN;
}

static void set_bit(uint64_t *m, int32_t i) { m[i >> 6] |= 1ull << (i & 63); }

/* Whether an exit's fate is the same for every count that lets its prefix
 * in: a JSON closing quote, or a raw "</" (the terminator). */
static bool groupable(int k, const uint8_t *p, uint32_t n, uint32_t at)
{
    return k == 1 ? p[at] == '"' : at + 1 < n && p[at + 1] == '/';
}

/* Groupable exits first, by their bytes from off on; the rest after. */
static int xent_cmp(const void *a, const void *b)
{
    const xent *x = a, *y = b;
    if ((x->group == UINT32_MAX) != (y->group == UINT32_MAX))
        return x->group == UINT32_MAX ? 1 : -1;
    uint32_t n = x->sfx_len < y->sfx_len ? x->sfx_len : y->sfx_len;
    int c = n ? memcmp(x->sfx, y->sfx, n) : 0;
    if (c)
        return c;
    return x->sfx_len < y->sfx_len ? -1 : x->sfx_len > y->sfx_len;
}

static mt_status build_class(serve_vocab *v, int k, int cls, uint32_t *chars, mt_err *err)
{
    uint32_t maxc = 0;
    int32_t ne = 0;
    for (int32_t i = 0; i < v->n; i++) {
        const uint8_t *p = (const uint8_t *)v->bytes + v->off[i];
        uint32_t n = (uint32_t)(v->off[i + 1] - v->off[i]), at;
        chars[i] = UINT32_MAX;
        if (!v->text[i] || !n)
            continue;
        int r = scan(k, cls, p, n, &chars[i], &at);
        if (r == SCAN_IN)
            maxc = chars[i] > maxc ? chars[i] : maxc;
        else if (r == SCAN_EXIT)
            ne++;
        if (r != SCAN_IN)
            chars[i] = r == SCAN_EXIT ? UINT32_MAX - 1 : UINT32_MAX;
    }
    v->max_chars[k][cls] = maxc;
    v->in[k][cls] = calloc(((size_t)maxc + 1) * v->words, sizeof(uint64_t));
    v->exits[k][cls] = malloc(((size_t)ne + 1) * sizeof(xent));
    if (!v->in[k][cls] || !v->exits[k][cls])
        return mt_fail(err, MT_E_NOMEM, "vocabulary index (string masks)");
    xent *x = v->exits[k][cls];
    int32_t nx = 0;
    for (int32_t i = 0; i < v->n; i++) {
        if (chars[i] < UINT32_MAX - 1) {
            set_bit(v->in[k][cls] + (size_t)chars[i] * v->words, i);
        } else if (chars[i] == UINT32_MAX - 1) {
            const uint8_t *p = (const uint8_t *)v->bytes + v->off[i];
            uint32_t n = (uint32_t)(v->off[i + 1] - v->off[i]), c, at;
            scan(k, cls, p, n, &c, &at);
            x[nx++] = (xent){(const char *)p + at, n - at, i, c, at,
                             groupable(k, p, n, at) ? 0 : UINT32_MAX};
        }
    }
    for (uint32_t r = 1; r <= maxc; r++) /* at most r characters: cumulative */
        for (size_t w = 0; w < v->words; w++)
            v->in[k][cls][r * v->words + w] |= v->in[k][cls][(r - 1) * v->words + w];
    qsort(x, (size_t)nx, sizeof *x, xent_cmp);
    uint32_t groups = 0;
    for (int32_t i = 0; i < nx && x[i].group != UINT32_MAX; i++) {
        if (i > 0 && xent_cmp(&x[i - 1], &x[i]))
            groups++;
        x[i].group = groups;
    }
    v->n_exits[k][cls] = nx;
    v->n_groups[k][cls] = nx && x[0].group != UINT32_MAX ? groups + 1 : 0;
    if (v->n_groups[k][cls] > v->max_groups)
        v->max_groups = v->n_groups[k][cls];
    return MT_OK;
}

static mt_status build_strings(serve_vocab *v, mt_err *err)
{
    uint32_t *chars = malloc((size_t)v->n * sizeof *chars);
    if (!chars)
        return mt_fail(err, MT_E_NOMEM, "vocabulary index");
    mt_status st = MT_OK;
    for (int k = 1; k < KINDS && st == MT_OK; k++)
        for (int c = 0; c < CLASSES && st == MT_OK; c++)
            st = build_class(v, k, c, chars, err);
    free(chars);
    if (st == MT_OK && (!(v->memo_gen = calloc((size_t)v->max_groups + 1, sizeof *v->memo_gen)) ||
                        !(v->memo_ok = calloc((size_t)v->max_groups + 1, 1))))
        st = mt_fail(err, MT_E_NOMEM, "vocabulary index");
    return st;
}

mt_status serve_vocab_create(int32_t n, const char *const *bytes, const uint32_t *lens,
                             const bool *is_text, serve_vocab **out, mt_err *err)
{
    *out = NULL;
    serve_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return mt_fail(err, MT_E_NOMEM, "vocabulary index");
    pthread_mutex_init(&v->mu, NULL);
    v->n = n;
    v->words = ((size_t)n + 63) / 64;
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++)
        total += is_text[i] ? lens[i] : 0;
    v->off = malloc(((size_t)n + 1) * sizeof *v->off);
    v->text = malloc((size_t)n + 1);
    v->bytes = malloc((size_t)total + 1);
    bsort *t = malloc(((size_t)n + 1) * sizeof *t);
    mt_status st = v->off && v->text && v->bytes && t ? MT_OK
                                                      : mt_fail(err, MT_E_NOMEM, "vocabulary index");
    uint32_t nt = 0;
    if (st == MT_OK) {
        uint64_t at = 0;
        for (int32_t i = 0; i < n; i++) {
            v->off[i] = at;
            v->text[i] = is_text[i] && lens[i] > 0;
            if (v->text[i]) {
                memcpy(v->bytes + at, bytes[i], lens[i]);
                at += lens[i];
                v->max_len = lens[i] > v->max_len ? lens[i] : v->max_len;
            }
        }
        v->off[n] = at;
        for (int32_t i = 0; i < n; i++)
            if (v->text[i])
                t[nt++] = (bsort){(const uint8_t *)v->bytes + v->off[i],
                                  (uint32_t)(v->off[i + 1] - v->off[i]), i};
        qsort(t, nt, sizeof *t, bsort_cmp);
        st = build_trie(v, t, nt, err);
    }
    if (st == MT_OK)
        st = build_strings(v, err);
    if (st == MT_OK && !(v->scratch = malloc(((size_t)v->max_len + 2) * sizeof *v->scratch)))
        st = mt_fail(err, MT_E_NOMEM, "vocabulary index (scratch)");
    free(t);
    if (st != MT_OK) {
        serve_vocab_destroy(v);
        return st;
    }
    *out = v;
    return MT_OK;
}

mt_status serve_vocab_from_tokenizer(const model_tokenizer *tok, int32_t vocab,
                                     serve_vocab **out, mt_err *err)
{
    *out = NULL;
    char **b = calloc((size_t)vocab + 1, sizeof *b);
    uint32_t *lens = calloc((size_t)vocab + 1, sizeof *lens);
    bool *text = calloc((size_t)vocab + 1, sizeof *text);
    mt_status st = b && lens && text ? MT_OK : mt_fail(err, MT_E_NOMEM, "vocabulary index");
    char buf[1024];
    for (int32_t i = 0; st == MT_OK && i < vocab; i++) {
        int64_t n = model_tokenizer_token_bytes(tok, i, buf, sizeof buf);
        if (n <= 0 || n > (int64_t)sizeof buf || model_tokenizer_is_special(tok, i))
            continue;
        if (!(b[i] = malloc((size_t)n))) {
            st = mt_fail(err, MT_E_NOMEM, "vocabulary index");
            break;
        }
        memcpy(b[i], buf, (size_t)n);
        lens[i] = (uint32_t)n;
        text[i] = true;
    }
    if (st == MT_OK)
        st = serve_vocab_create(vocab, (const char *const *)b, lens, text, out, err);
    for (int32_t i = 0; b && i < vocab; i++)
        free(b[i]);
    free(b);
    free(lens);
    free(text);
    return st;
}

void serve_vocab_destroy(serve_vocab *v)
{
    if (!v)
        return;
    free(v->bytes);
    free(v->off);
    free(v->text);
    free(v->nodes);
    free(v->ids);
    for (int k = 0; k < KINDS; k++)
        for (int c = 0; c < CLASSES; c++) {
            free(v->in[k][c]);
            free(v->exits[k][c]);
        }
    free(v->memo_gen);
    free(v->memo_ok);
    free(v->scratch);
    pthread_mutex_destroy(&v->mu);
    free(v);
}

int32_t serve_vocab_size(const serve_vocab *v) { return v->n; }

const char *serve_vocab_token(const serve_vocab *v, int32_t id, size_t *len)
{
    if (id < 0 || id >= v->n || !v->text[id])
        return NULL;
    *len = (size_t)(v->off[id + 1] - v->off[id]);
    return v->bytes + v->off[id];
}
size_t serve_mask_words(const serve_vocab *v) { return v->words; }

/* ---- masks ------------------------------------------------------------------------ */

static void copy_state(serve_gstate *to, const serve_gstate *from)
{
    to->depth = from->depth;
    memcpy(to->f, from->f, from->depth * sizeof *from->f);
}

/* The trie walk below node, whose prefix took the grammar to scratch[d]. */
static void walk(serve_vocab *v, const serve_grammar *g, uint32_t node, uint32_t d,
                 uint64_t *mask)
{
    const tnode *nd = &v->nodes[node];
    const serve_gstate *s = &v->scratch[d];
    serve_gstate *t = &v->scratch[d + 1];
    for (uint32_t c = nd->child; c < nd->child + nd->n_child; c++) {
        const tnode *ch = &v->nodes[c];
        copy_state(t, s);
        if (!serve_grammar_step(g, t, ch->byte))
            continue;
        for (uint32_t k = ch->tok; k < ch->tok + ch->n_tok; k++)
            set_bit(mask, v->ids[k]);
        if (ch->n_child)
            walk(v, g, c, d + 1, mask);
    }
}

/* The mask of a state inside a string body: the precomputed in-string
 * tokens of its class that fit its room, and the exits that go on. */
static void string_mask(serve_vocab *v, const serve_grammar *g, const serve_gstate *s, int k,
                        uint32_t room, uint32_t need, uint8_t pending, uint64_t *mask)
{
    int cls = serve_grammar_utf8_class(pending);
    uint32_t r = room < v->max_chars[k][cls] ? room : v->max_chars[k][cls];
    memcpy(mask, v->in[k][cls] + (size_t)r * v->words, v->words * sizeof *mask);
    if (++v->gen == 0) { /* wrapped: forget every decision */
        memset(v->memo_gen, 0, ((size_t)v->max_groups + 1) * sizeof *v->memo_gen);
        v->gen = 1;
    }
    serve_gstate *t = &v->scratch[0];
    const xent *x = v->exits[k][cls];
    for (int32_t i = 0; i < v->n_exits[k][cls]; i++) {
        if (x[i].chars > room)
            continue;
        bool ok;
        if (x[i].group != UINT32_MAX) {
            if (x[i].chars < need)
                continue; /* the string may not close yet */
            uint32_t gi = x[i].group;
            if (v->memo_gen[gi] != v->gen) {
                copy_state(t, s);
                serve_grammar_string_advance(g, t, x[i].chars);
                v->memo_ok[gi] = serve_grammar_feed(g, t, x[i].sfx, x[i].sfx_len);
                v->memo_gen[gi] = v->gen;
            }
            ok = v->memo_ok[gi];
        } else {
            copy_state(t, s);
            ok = serve_grammar_feed(g, t, x[i].sfx - x[i].off, x[i].off + x[i].sfx_len);
        }
        if (ok)
            set_bit(mask, x[i].id);
    }
}

bool serve_mask_compute(serve_vocab *v, const serve_grammar *g, const serve_gstate *s,
                        uint64_t *mask)
{
    uint32_t room, need;
    uint8_t pending;
    int k = serve_grammar_in_string(g, s, &room, &need, &pending);
    pthread_mutex_lock(&v->mu);
    if (k) {
        string_mask(v, g, s, k, room, need, pending, mask);
    } else {
        memset(mask, 0, v->words * sizeof *mask);
        copy_state(&v->scratch[0], s);
        walk(v, g, 0, 0, mask);
    }
    pthread_mutex_unlock(&v->mu);
    return serve_grammar_accepting(g, s);
}

void serve_mask_apply(const uint64_t *mask, float *logits, int32_t vocab)
{
    size_t words = ((size_t)vocab + 63) / 64;
    for (size_t w = 0; w < words; w++) {
        uint64_t m = mask[w];
        size_t base = w * 64, n = base + 64 < (size_t)vocab ? 64 : (size_t)vocab - base;
        if (n < 64)
            m |= ~0ull << n; /* past the vocabulary: nothing to do */
        if (m == ~0ull)
            continue;
        float *l = logits + base;
        int ones = __builtin_popcountll(m & (n < 64 ? ~(~0ull << n) : ~0ull));
        if (ones <= 8) { /* mostly refused: fill the word's range, put the few back */
            float keep[8];
            int at[8], k = 0;
            for (uint64_t x = m & (n < 64 ? ~(~0ull << n) : ~0ull); x; x &= x - 1) {
                at[k] = __builtin_ctzll(x);
                keep[k] = l[at[k]];
                k++;
            }
            for (size_t i = 0; i < n; i++)
                l[i] = -INFINITY;
            for (int i = 0; i < k; i++)
                l[at[i]] = keep[i];
            continue;
        }
        for (uint64_t z = ~m; z; z &= z - 1) /* the refused ones */
            l[__builtin_ctzll(z)] = -INFINITY;
    }
}

/* ---- the cache ---------------------------------------------------------------------- */

typedef struct centry {
    uint64_t hash;
    serve_gstate state;
    bool accepting;
    struct centry *next_hash;  /* bucket chain */
    struct centry *prev, *next; /* recency list, most recent first */
    uint64_t mask[];
} centry;

struct serve_mask_cache {
    pthread_mutex_t mu;
    size_t max_bytes, bytes;
    centry **buckets;
    size_t n_buckets;
    centry *head, *tail;
    uint64_t hits, misses;
};

mt_status serve_mask_cache_create(size_t max_bytes, serve_mask_cache **out, mt_err *err)
{
    *out = NULL;
    serve_mask_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->buckets = calloc(4096, sizeof *c->buckets))) {
        free(c);
        return mt_fail(err, MT_E_NOMEM, "mask cache");
    }
    c->n_buckets = 4096;
    c->max_bytes = max_bytes ? max_bytes : (32u << 20);
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return MT_OK;
}

void serve_mask_cache_destroy(serve_mask_cache *c)
{
    if (!c)
        return;
    for (centry *e = c->head; e;) {
        centry *n = e->next;
        free(e);
        e = n;
    }
    free(c->buckets);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void lru_unlink(serve_mask_cache *c, centry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_front(serve_mask_cache *c, centry *e)
{
    e->next = c->head;
    e->prev = NULL;
    if (c->head)
        c->head->prev = e;
    c->head = e;
    if (!c->tail)
        c->tail = e;
}

static void evict(serve_mask_cache *c, size_t entry_bytes)
{
    centry *e = c->tail;
    lru_unlink(c, e);
    centry **p = &c->buckets[e->hash % c->n_buckets];
    while (*p != e)
        p = &(*p)->next_hash;
    *p = e->next_hash;
    free(e);
    c->bytes -= entry_bytes;
}

bool serve_mask_get(serve_vocab *v, const serve_grammar *g, serve_mask_cache *c,
                    const serve_gstate *s, uint64_t *mask, bool *hit)
{
    if (hit)
        *hit = false;
    if (!c)
        return serve_mask_compute(v, g, s, mask);
    uint64_t h = serve_grammar_state_hash(s);
    size_t mbytes = v->words * sizeof *mask, entry_bytes = sizeof(centry) + mbytes;
    pthread_mutex_lock(&c->mu);
    for (centry *e = c->buckets[h % c->n_buckets]; e; e = e->next_hash)
        if (e->hash == h && serve_grammar_state_equal(&e->state, s)) {
            memcpy(mask, e->mask, mbytes);
            bool acc = e->accepting;
            lru_unlink(c, e);
            lru_front(c, e);
            c->hits++;
            pthread_mutex_unlock(&c->mu);
            if (hit)
                *hit = true;
            return acc;
        }
    c->misses++;
    pthread_mutex_unlock(&c->mu);
    bool acc = serve_mask_compute(v, g, s, mask);
    if (entry_bytes > c->max_bytes)
        return acc;
    centry *e = malloc(entry_bytes);
    if (!e)
        return acc; /* not cached: the answer stands */
    e->hash = h;
    copy_state(&e->state, s);
    e->accepting = acc;
    memcpy(e->mask, mask, mbytes);
    pthread_mutex_lock(&c->mu);
    while (c->bytes + entry_bytes > c->max_bytes && c->tail)
        evict(c, entry_bytes);
    e->next_hash = c->buckets[h % c->n_buckets];
    c->buckets[h % c->n_buckets] = e;
    lru_front(c, e);
    c->bytes += entry_bytes;
    pthread_mutex_unlock(&c->mu);
    return acc;
}

void serve_mask_cache_stats(serve_mask_cache *c, uint64_t *hits, uint64_t *misses)
{
    pthread_mutex_lock(&c->mu);
    *hits = c->hits;
    *misses = c->misses;
    pthread_mutex_unlock(&c->mu);
}
