/* tokenizer_train.c: learns byte-level BPE merges on a small corpus and
 * writes a complete tokenizer.json (used by make-tiny-model). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

typedef struct piece {
    const char *s;
    size_t n;
} piece;

typedef struct word {
    int32_t *sym;
    size_t n;
    int64_t count;
} word;

typedef struct pair_count {
    uint64_t key; /* a << 32 | b */
    int64_t count;
} pair_count;

static int piece_cmp(const void *a, const void *b)
{
    const piece *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static int pair_cmp(const void *a, const void *b)
{
    uint64_t x = ((const pair_count *)a)->key, y = ((const pair_count *)b)->key;
    return (x > y) - (x < y);
}

typedef struct trainer {
    piece *pieces;
    size_t npieces, cap;
    word *words;
    size_t nwords;
    char **tok; /* token spellings by id */
    int32_t ntok;
    uint64_t *merges;
    int nmerges;
} trainer;

static void trainer_free(trainer *t)
{
    free(t->pieces);
    for (size_t i = 0; i < t->nwords; i++)
        free(t->words[i].sym);
    free(t->words);
    for (int32_t i = 0; i < t->ntok; i++)
        free(t->tok[i]);
    free(t->tok);
    free(t->merges);
}

static mt_status split_corpus(trainer *t, const char *text, size_t len, const char *regex,
                              mt_err *err)
{
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)regex, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &code, &at, NULL);
    if (!re)
        return mt_fail(err, MT_E_INVALID, "training regex does not compile at offset %zu",
                       (size_t)at);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    mt_status st = md ? MT_OK : mt_fail(err, MT_E_NOMEM, "out of memory");
    size_t pos = 0;
    while (st == MT_OK && pos < len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)text, len, pos, 0, md, NULL);
        if (rc < 0)
            break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) {
            pos = ov[0] + 1;
            continue;
        }
        if (t->npieces == t->cap) {
            t->cap = t->cap ? 2 * t->cap : 1024;
            piece *p = realloc(t->pieces, t->cap * sizeof *p);
            if (!p) {
                st = mt_fail(err, MT_E_NOMEM, "out of memory");
                break;
            }
            t->pieces = p;
        }
        t->pieces[t->npieces++] = (piece){text + ov[0], ov[1] - ov[0]};
        pos = ov[1];
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return st;
}

/* Unique pieces with their counts, as byte-token sequences. */
static mt_status make_words(trainer *t, mt_err *err)
{
    qsort(t->pieces, t->npieces, sizeof *t->pieces, piece_cmp);
    t->words = calloc(t->npieces + 1, sizeof *t->words);
    if (!t->words)
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    for (size_t i = 0; i < t->npieces;) {
        size_t j = i;
        while (j < t->npieces && !piece_cmp(&t->pieces[i], &t->pieces[j]))
            j++;
        word *w = &t->words[t->nwords++];
        w->n = t->pieces[i].n;
        w->count = (int64_t)(j - i);
        if (!(w->sym = malloc(w->n * sizeof *w->sym)))
            return mt_fail(err, MT_E_NOMEM, "out of memory");
        for (size_t k = 0; k < w->n; k++)
            w->sym[k] = (unsigned char)t->pieces[i].s[k];
        i = j;
    }
    return MT_OK;
}

/* The most frequent adjacent pair (ties: smallest key); count 0 if none. */
static mt_status best_pair(const trainer *t, pair_count *best, mt_err *err)
{
    size_t n = 0;
    for (size_t i = 0; i < t->nwords; i++)
        n += t->words[i].n ? t->words[i].n - 1 : 0;
    best->count = 0;
    if (!n)
        return MT_OK;
    pair_count *p = malloc(n * sizeof *p);
    if (!p)
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < t->nwords; i++)
        for (size_t j = 0; j + 1 < t->words[i].n; j++)
            p[k++] = (pair_count){((uint64_t)(uint32_t)t->words[i].sym[j] << 32) |
                                      (uint32_t)t->words[i].sym[j + 1],
                                  t->words[i].count};
    qsort(p, n, sizeof *p, pair_cmp);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        int64_t c = 0;
        while (j < n && p[j].key == p[i].key)
            c += p[j++].count;
        if (c > best->count)
            *best = (pair_count){p[i].key, c};
        i = j;
    }
    free(p);
    return MT_OK;
}

static mt_status learn(trainer *t, int vocab_size, mt_err *err)
{
    t->tok = calloc((size_t)vocab_size + 256, sizeof *t->tok);
    t->merges = calloc((size_t)vocab_size + 1, sizeof *t->merges);
    if (!t->tok || !t->merges)
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    for (int b = 0; b < 256; b++) {
        char c[4];
        model_bytelevel_char((uint8_t)b, c);
        if (!(t->tok[t->ntok++] = strdup(c)))
            return mt_fail(err, MT_E_NOMEM, "out of memory");
    }
    while (t->ntok < vocab_size) {
        pair_count best;
        mt_status st = best_pair(t, &best, err);
        if (st != MT_OK)
            return st;
        if (best.count < 2)
            break;
        int32_t a = (int32_t)(best.key >> 32), b = (int32_t)(uint32_t)best.key;
        size_t la = strlen(t->tok[a]), lb = strlen(t->tok[b]);
        char *s = malloc(la + lb + 1);
        if (!s)
            return mt_fail(err, MT_E_NOMEM, "out of memory");
        memcpy(s, t->tok[a], la);
        memcpy(s + la, t->tok[b], lb + 1);
        int32_t id = -1;
        for (int32_t i = 0; i < t->ntok && id < 0; i++)
            if (!strcmp(t->tok[i], s))
                id = i;
        if (id < 0)
            t->tok[id = t->ntok++] = s;
        else
            free(s);
        t->merges[t->nmerges++] = best.key;
        for (size_t i = 0; i < t->nwords; i++) {
            word *w = &t->words[i];
            size_t o = 0;
            for (size_t j = 0; j < w->n; j++) {
                if (j + 1 < w->n && w->sym[j] == a && w->sym[j + 1] == b) {
                    w->sym[o++] = id;
                    j++;
                } else {
                    w->sym[o++] = w->sym[j];
                }
            }
            w->n = o;
        }
    }
    return MT_OK;
}

static cJSON *build_json(const trainer *t, const char *regex, const char *const *added,
                         const bool *special, int added_count)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *at = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < added_count; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", t->ntok + i);
        cJSON_AddStringToObject(e, "content", added[i]);
        cJSON_AddBoolToObject(e, "single_word", 0);
        cJSON_AddBoolToObject(e, "lstrip", 0);
        cJSON_AddBoolToObject(e, "rstrip", 0);
        cJSON_AddBoolToObject(e, "normalized", 0);
        cJSON_AddBoolToObject(e, "special", special[i]);
        cJSON_AddItemToArray(at, e);
    }
    cJSON_AddNullToObject(root, "normalizer");
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "Sequence");
    cJSON *list = cJSON_AddArrayToObject(pre, "pretokenizers");
    cJSON *split = cJSON_CreateObject();
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(split, "pattern"), "Regex", regex);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddBoolToObject(split, "invert", 0);
    cJSON_AddItemToArray(list, split);
    cJSON *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddBoolToObject(bl, "add_prefix_space", 0);
    cJSON_AddBoolToObject(bl, "trim_offsets", 1);
    cJSON_AddBoolToObject(bl, "use_regex", 0);
    cJSON_AddItemToArray(list, bl);
    cJSON_AddNullToObject(root, "post_processor");
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    cJSON_AddBoolToObject(dec, "add_prefix_space", 1);
    cJSON_AddBoolToObject(dec, "trim_offsets", 1);
    cJSON_AddBoolToObject(dec, "use_regex", 1);
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", 0);
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    cJSON_AddBoolToObject(model, "ignore_merges", 0);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int32_t i = 0; i < t->ntok; i++)
        cJSON_AddNumberToObject(vocab, t->tok[i], i);
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    for (int i = 0; i < t->nmerges; i++) {
        cJSON *m = cJSON_CreateArray();
        cJSON_AddItemToArray(m, cJSON_CreateString(t->tok[t->merges[i] >> 32]));
        cJSON_AddItemToArray(m, cJSON_CreateString(t->tok[(uint32_t)t->merges[i]]));
        cJSON_AddItemToArray(merges, m);
    }
    return root;
}

mt_status model_tokenizer_train(const char *corpus, size_t len, const char *split_regex,
                                int vocab_size, const char *const *added, const bool *special,
                                int added_count, char **json, mt_err *err)
{
    *json = NULL;
    if (vocab_size < 256)
        return mt_fail(err, MT_E_INVALID, "vocab size %d is below the 256 byte tokens",
                       vocab_size);
    size_t bad = model_utf8_check(corpus, len);
    if (bad != len)
        return mt_fail(err, MT_E_INVALID, "training text is not valid UTF-8 at byte %zu", bad);
    trainer t = {0};
    mt_status st = split_corpus(&t, corpus, len, split_regex, err);
    if (st == MT_OK)
        st = make_words(&t, err);
    if (st == MT_OK)
        st = learn(&t, vocab_size, err);
    if (st == MT_OK) {
        cJSON *root = build_json(&t, split_regex, added, special, added_count);
        *json = root ? cJSON_Print(root) : NULL;
        cJSON_Delete(root);
        if (!*json)
            st = mt_fail(err, MT_E_NOMEM, "out of memory writing tokenizer.json");
    }
    trainer_free(&t);
    return st;
}
