/* tokenizer.c: tokenizer.json loading and byte-level BPE encode/decode
 * (see tokenizer.h). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/files.h"

const char model_glm_split_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* GPT-2's byte-level pre-tokenizer pattern (ByteLevel with use_regex). */
static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- UTF-8 and the byte-level alphabet ------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..n), or -k when only its first
 * k >= 1 bytes form a valid prefix (the maximal subpart to replace). */
static int utf8_seq(const unsigned char *s, size_t n)
{
    unsigned b = s[0];
    int need;
    unsigned lo = 0x80, hi = 0xbf;
    if (b < 0x80)
        return 1;
    if (b >= 0xc2 && b <= 0xdf)
        need = 2;
    else if (b >= 0xe0 && b <= 0xef) {
        need = 3;
        if (b == 0xe0)
            lo = 0xa0;
        if (b == 0xed)
            hi = 0x9f;
    } else if (b >= 0xf0 && b <= 0xf4) {
        need = 4;
        if (b == 0xf0)
            lo = 0x90;
        if (b == 0xf4)
            hi = 0x8f;
    } else {
        return -1;
    }
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= n || s[k] < lo || s[k] > hi)
            return -k;
        lo = 0x80;
        hi = 0xbf;
    }
    return need;
}

size_t model_utf8_check(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        int k = utf8_seq(u + i, len - i);
        if (k < 0)
            return i;
        i += (size_t)k;
    }
    return len;
}

/* Printable bytes stand for themselves; the other 68 (0x00-0x20,
 * 0x7f-0xa0, 0xad) take U+0100, U+0101, ... in byte order. */
static unsigned bytelevel_cp(uint8_t b)
{
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae)
        return b;
    if (b <= 0x20)
        return 256u + b;
    if (b <= 0xa0)
        return 256u + 33u + (b - 0x7fu);
    return 256u + 67u; /* 0xad */
}

/* The byte a stand-in code point represents, or -1. */
static int bytelevel_byte(unsigned cp)
{
    if (cp < 256)
        return bytelevel_cp((uint8_t)cp) == cp ? (int)cp : -1;
    unsigned n = cp - 256;
    return n < 33 ? (int)n : n < 67 ? (int)(0x7f + n - 33) : n == 67 ? 0xad : -1;
}

static int put_cp(unsigned cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2; /* every stand-in is below U+0800 */
}

int model_bytelevel_char(uint8_t b, char out[4])
{
    int n = put_cp(bytelevel_cp(b), out);
    out[n] = 0;
    return n;
}

/* ---- hash maps -------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

typedef struct merge_slot {
    uint64_t key; /* (a << 32 | b) + 1; 0 is empty */
    int32_t rank, id;
} merge_slot;

typedef struct tok_entry {
    char *text;   /* tokenizer.json spelling; owned */
    size_t len;
    bool special, added, present;
} tok_entry;

typedef struct added_tok {
    const char *content; /* points into tok_entry.text */
    size_t len;
    int32_t id;
} added_tok;

typedef struct pre_step {
    pcre2_code *re;  /* a split pattern */
    bool removed;    /* behavior "Removed": drop the matches */
} pre_step;

struct model_tokenizer {
    tok_entry *tok;       /* by id */
    int32_t ntok;
    int32_t *vmap;        /* open addressing over ids, by text; -1 empty */
    size_t vmap_cap;
    merge_slot *merges;
    size_t merge_cap;
    added_tok *added;     /* sorted by first byte, then longer first */
    size_t nadded;
    size_t added_first[257]; /* added[added_first[b] .. added_first[b+1]) start with byte b */
    pre_step steps[8];
    int nsteps;
    bool byte_level;      /* pieces are mapped to stand-in characters */
    bool ignore_merges;
    int32_t byte_id[256]; /* id of each byte's stand-in character */
};

static int32_t vocab_get(const model_tokenizer *t, const char *s, size_t n)
{
    if (!t->vmap_cap)
        return -1;
    size_t mask = t->vmap_cap - 1;
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        int32_t id = t->vmap[i];
        if (id < 0)
            return -1;
        if (t->tok[id].len == n && !memcmp(t->tok[id].text, s, n))
            return id;
    }
}

static void vocab_put(model_tokenizer *t, int32_t id)
{
    size_t mask = t->vmap_cap - 1;
    size_t i = hash_bytes(t->tok[id].text, t->tok[id].len) & mask;
    while (t->vmap[i] >= 0) {
        int32_t o = t->vmap[i];
        if (t->tok[o].len == t->tok[id].len && !memcmp(t->tok[o].text, t->tok[id].text, t->tok[id].len)) {
            /* Added tokens win over a vocab entry of the same text. */
            if (t->tok[id].added)
                t->vmap[i] = id;
            return;
        }
        i = (i + 1) & mask;
    }
    t->vmap[i] = id;
}

static const merge_slot *merge_get(const model_tokenizer *t, int32_t a, int32_t b)
{
    if (!t->merge_cap)
        return NULL;
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = t->merge_cap - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        if (t->merges[i].key == key)
            return &t->merges[i];
        if (!t->merges[i].key)
            return NULL;
    }
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

void model_tokenizer_destroy(model_tokenizer *t)
{
    if (!t)
        return;
    for (int32_t i = 0; i < t->ntok; i++)
        free(t->tok[i].text);
    free(t->tok);
    free(t->vmap);
    free(t->merges);
    free(t->added);
    for (int i = 0; i < t->nsteps; i++)
        pcre2_code_free(t->steps[i].re);
    free(t);
}

/* ---- loading ------------------------------------------------------------------ */

typedef struct lctx {
    model_tokenizer *t;
    const char *label;
    mt_err *err;
} lctx;

static bool is_false_or_absent(const cJSON *o, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return !j || cJSON_IsNull(j) || cJSON_IsFalse(j);
}

static bool is_null_or_absent(const cJSON *o, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return !j || cJSON_IsNull(j);
}

static const char *type_of(const cJSON *o)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(j) ? j->valuestring : "(no type)";
}

static mt_status add_step(lctx *c, const char *pattern, uint32_t options, bool removed)
{
    if (c->t->nsteps == (int)(sizeof c->t->steps / sizeof c->t->steps[0]))
        return mt_fail(c->err, MT_E_UNSUPPORTED, "%s: pre_tokenizer: too many Split steps",
                       c->label);
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | options, &code,
                                   &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return mt_fail(c->err, MT_E_FORMAT, "%s: pre_tokenizer pattern does not compile at offset "
                       "%zu: %s", c->label, (size_t)at, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* a speed-up when available */
    c->t->steps[c->t->nsteps].re = re;
    c->t->steps[c->t->nsteps].removed = removed;
    c->t->nsteps++;
    return MT_OK;
}

static mt_status parse_pre(lctx *c, const cJSON *p, bool last)
{
    const char *type = type_of(p);
    if (c->t->byte_level)
        return mt_fail(c->err, MT_E_UNSUPPORTED, "%s: pre_tokenizer: %s after ByteLevel "
                       "(ByteLevel must come last)", c->label, type);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list))
            return mt_fail(c->err, MT_E_FORMAT, "%s: pre_tokenizer.pretokenizers: expected a list",
                           c->label);
        for (const cJSON *e = list->child; e; e = e->next) {
            mt_status st = parse_pre(c, e, last && !e->next);
            if (st != MT_OK)
                return st;
        }
        return MT_OK;
    }
    if (!strcmp(type, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        if (!cJSON_IsString(re) && !cJSON_IsString(lit))
            return mt_fail(c->err, MT_E_FORMAT, "%s: pre_tokenizer Split: pattern must be "
                           "{\"Regex\": ...} or {\"String\": ...}", c->label);
        if (!cJSON_IsString(beh) ||
            (strcmp(beh->valuestring, "Isolated") && strcmp(beh->valuestring, "Removed")))
            return mt_fail(c->err, MT_E_UNSUPPORTED, "%s: pre_tokenizer Split: behavior \"%s\" "
                           "(this tokenizer does Isolated and Removed)", c->label,
                           cJSON_IsString(beh) ? beh->valuestring : "?");
        if (!is_false_or_absent(p, "invert"))
            return mt_fail(c->err, MT_E_UNSUPPORTED, "%s: pre_tokenizer Split: invert is true",
                           c->label);
        bool removed = !strcmp(beh->valuestring, "Removed");
        return cJSON_IsString(re) ? add_step(c, re->valuestring, 0, removed)
                                  : add_step(c, lit->valuestring, PCRE2_LITERAL, removed);
    }
    if (!strcmp(type, "ByteLevel")) {
        if (!is_false_or_absent(p, "add_prefix_space"))
            return mt_fail(c->err, MT_E_UNSUPPORTED, "%s: pre_tokenizer ByteLevel: "
                           "add_prefix_space is true", c->label);
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
        if (!ur || cJSON_IsTrue(ur)) {
            mt_status st = add_step(c, gpt2_regex, 0, false);
            if (st != MT_OK)
                return st;
        }
        c->t->byte_level = true;
        (void)last;
        return MT_OK;
    }
    return mt_fail(c->err, MT_E_UNSUPPORTED, "%s: pre_tokenizer type \"%s\" (this tokenizer "
                   "reads Sequence, Split and ByteLevel)", c->label, type);
}

static mt_status set_token(lctx *c, int64_t id, const char *text, bool added, bool special)
{
    model_tokenizer *t = c->t;
    if (id < 0 || id >= t->ntok)
        return mt_fail(c->err, MT_E_FORMAT, "%s: token id %" PRId64 " of '%s' is out of range",
                       c->label, id, text);
    tok_entry *e = &t->tok[id];
    if (e->present && !added)
        return mt_fail(c->err, MT_E_FORMAT, "%s: id %" PRId64 " is used by '%s' and '%s'",
                       c->label, id, e->text, text);
    if (e->present && strcmp(e->text, text))
        return mt_fail(c->err, MT_E_FORMAT, "%s: added token '%s' reuses id %" PRId64 " of '%s'",
                       c->label, text, id, e->text);
    free(e->text);
    if (!(e->text = strdup(text)))
        return mt_fail(c->err, MT_E_NOMEM, "out of memory");
    e->len = strlen(text);
    e->present = true;
    e->added = e->added || added;
    e->special = e->special || special;
    return MT_OK;
}

static bool json_id(const cJSON *j, int64_t *out)
{
    if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble > 2147483647.0 ||
        j->valuedouble != (double)(int64_t)j->valuedouble)
        return false;
    *out = (int64_t)j->valuedouble;
    return true;
}

static int added_order(const void *a, const void *b)
{
    const added_tok *x = a, *y = b;
    unsigned char fx = (unsigned char)x->content[0], fy = (unsigned char)y->content[0];
    if (fx != fy)
        return fx < fy ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static mt_status parse_merges(lctx *c, const cJSON *merges)
{
    model_tokenizer *t = c->t;
    size_t n = (size_t)cJSON_GetArraySize(merges);
    t->merge_cap = pow2_at_least(2 * n + 2);
    t->merges = calloc(t->merge_cap, sizeof *t->merges);
    if (!t->merges)
        return mt_fail(c->err, MT_E_NOMEM, "out of memory");
    int32_t rank = 0;
    char *buf = NULL;
    size_t bufcap = 0;
    mt_status st = MT_OK;
    for (const cJSON *m = merges->child; m && st == MT_OK; m = m->next, rank++) {
        const char *a, *b;
        size_t la, lb;
        if (cJSON_IsString(m)) {
            const char *sp = strchr(m->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = mt_fail(c->err, MT_E_FORMAT, "%s: model.merges[%d] \"%s\" is not two tokens "
                             "separated by one space", c->label, rank, m->valuestring);
                break;
            }
            a = m->valuestring;
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(m->child) && cJSON_IsString(m->child->next)) {
            a = m->child->valuestring;
            la = strlen(a);
            b = m->child->next->valuestring;
            lb = strlen(b);
        } else {
            st = mt_fail(c->err, MT_E_FORMAT, "%s: model.merges[%d] must be \"a b\" or [a, b]",
                         c->label, rank);
            break;
        }
        if (la + lb + 1 > bufcap) {
            bufcap = 2 * (la + lb + 1);
            char *nb = realloc(buf, bufcap);
            if (!nb) {
                st = mt_fail(c->err, MT_E_NOMEM, "out of memory");
                break;
            }
            buf = nb;
        }
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        int32_t ia = vocab_get(t, a, la), ib = vocab_get(t, b, lb), im = vocab_get(t, buf, la + lb);
        if (ia < 0 || ib < 0 || im < 0) {
            buf[la + lb] = 0;
            st = mt_fail(c->err, MT_E_FORMAT, "%s: model.merges[%d]: token '%.*s' is not in the "
                         "vocab", c->label, rank, ia < 0 ? (int)la : ib < 0 ? (int)lb : (int)(la + lb),
                         ia < 0 ? a : ib < 0 ? b : buf);
            break;
        }
        uint64_t key = (((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib) + 1;
        size_t mask = t->merge_cap - 1, i = mix64(key) & mask;
        while (t->merges[i].key && t->merges[i].key != key)
            i = (i + 1) & mask;
        if (!t->merges[i].key) /* the first (lowest-rank) duplicate wins */
            t->merges[i] = (merge_slot){key, rank, im};
    }
    free(buf);
    return st;
}

static mt_status parse_model(lctx *c, const cJSON *root)
{
    model_tokenizer *t = c->t;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model))
        return mt_fail(c->err, MT_E_FORMAT, "%s: missing \"model\"", c->label);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE")))
        return mt_fail(c->err, MT_E_UNSUPPORTED, "%s: model type \"%s\" (this tokenizer reads BPE)",
                       c->label, type_of(model));
    if (!is_null_or_absent(model, "dropout") || !is_false_or_absent(model, "byte_fallback") ||
        !is_null_or_absent(model, "continuing_subword_prefix") ||
        !is_null_or_absent(model, "end_of_word_suffix"))
        return mt_fail(c->err, MT_E_UNSUPPORTED, "%s: model: dropout, byte_fallback and subword "
                       "prefix/suffix are not supported", c->label);
    t->ignore_merges = !is_false_or_absent(model, "ignore_merges");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return mt_fail(c->err, MT_E_FORMAT, "%s: model.vocab must be an object and model.merges "
                       "a list", c->label);
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return mt_fail(c->err, MT_E_FORMAT, "%s: added_tokens must be a list", c->label);

    /* Size the id table from the largest id. */
    int64_t max_id = -1, id = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        if (!json_id(e, &id))
            return mt_fail(c->err, MT_E_FORMAT, "%s: model.vocab[\"%s\"] is not a token id",
                           c->label, e->string);
        max_id = id > max_id ? id : max_id;
    }
    for (const cJSON *e = cJSON_IsArray(added) ? added->child : NULL; e; e = e->next) {
        if (!json_id(cJSON_GetObjectItemCaseSensitive(e, "id"), &id) ||
            !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "content")))
            return mt_fail(c->err, MT_E_FORMAT, "%s: added_tokens entry without an id and content",
                           c->label);
        max_id = id > max_id ? id : max_id;
    }
    t->ntok = (int32_t)(max_id + 1);
    t->tok = calloc((size_t)t->ntok + 1, sizeof *t->tok);
    t->vmap_cap = pow2_at_least(2 * (size_t)t->ntok + 2);
    t->vmap = malloc(t->vmap_cap * sizeof *t->vmap);
    if (!t->tok || !t->vmap)
        return mt_fail(c->err, MT_E_NOMEM, "out of memory");
    memset(t->vmap, 0xff, t->vmap_cap * sizeof *t->vmap);
    mt_status st;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        json_id(e, &id);
        if ((st = set_token(c, id, e->string, false, false)) != MT_OK)
            return st;
    }
    size_t nadded = 0;
    for (const cJSON *e = cJSON_IsArray(added) ? added->child : NULL; e; e = e->next, nadded++) {
        const char *content = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        if (!is_false_or_absent(e, "single_word") || !is_false_or_absent(e, "lstrip") ||
            !is_false_or_absent(e, "rstrip"))
            return mt_fail(c->err, MT_E_UNSUPPORTED, "%s: added token '%s': single_word, lstrip "
                           "and rstrip are not supported", c->label, content);
        if (!content[0])
            return mt_fail(c->err, MT_E_FORMAT, "%s: an added token is empty", c->label);
        json_id(cJSON_GetObjectItemCaseSensitive(e, "id"), &id);
        bool special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"));
        if ((st = set_token(c, id, content, true, special)) != MT_OK)
            return st;
    }
    for (int32_t i = 0; i < t->ntok; i++)
        if (t->tok[i].present)
            vocab_put(t, i);
    /* Added tokens, grouped by first byte, longest first. */
    t->added = calloc(nadded + 1, sizeof *t->added);
    if (!t->added)
        return mt_fail(c->err, MT_E_NOMEM, "out of memory");
    for (int32_t i = 0; i < t->ntok; i++)
        if (t->tok[i].added)
            t->added[t->nadded++] = (added_tok){t->tok[i].text, t->tok[i].len, i};
    qsort(t->added, t->nadded, sizeof *t->added, added_order);
    size_t k = 0;
    for (int b = 0; b <= 256; b++) {
        while (b < 256 && k < t->nadded && (unsigned char)t->added[k].content[0] < b)
            k++;
        t->added_first[b] = b == 256 ? t->nadded : k;
    }
    return parse_merges(c, merges);
}

static mt_status parse_root(lctx *c, const cJSON *root)
{
    model_tokenizer *t = c->t;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm))
        return mt_fail(c->err, MT_E_UNSUPPORTED, "%s: normalizer \"%s\" (this tokenizer reads "
                       "tokenizers with no normalizer)", c->label, type_of(norm));
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    mt_status st;
    if (pre && !cJSON_IsNull(pre) && (st = parse_pre(c, pre, true)) != MT_OK)
        return st;
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (dec && !cJSON_IsNull(dec) && strcmp(type_of(dec), "ByteLevel"))
        return mt_fail(c->err, MT_E_UNSUPPORTED, "%s: decoder \"%s\" (this tokenizer decodes "
                       "ByteLevel)", c->label, type_of(dec));
    if ((st = parse_model(c, root)) != MT_OK)
        return st;
    for (int b = 0; b < 256; b++) {
        char s[4];
        int n = t->byte_level ? model_bytelevel_char((uint8_t)b, s) : (s[0] = (char)b, 1);
        t->byte_id[b] = vocab_get(t, s, (size_t)n);
        if (t->byte_id[b] < 0 && t->byte_level)
            return mt_fail(c->err, MT_E_FORMAT, "%s: the vocab has no token for byte 0x%02x "
                           "(byte-level character '%s')", c->label, b, s);
    }
    return MT_OK;
}

mt_status model_tokenizer_parse(const char *json, size_t len, const char *label,
                                model_tokenizer **out, mt_err *err)
{
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root)
        return mt_fail(err, MT_E_FORMAT, "%s: malformed JSON near byte %zu", label,
                       end ? (size_t)(end - json) : 0);
    model_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(root);
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    }
    lctx c = {t, label, err};
    mt_status st = cJSON_IsObject(root) ? parse_root(&c, root)
                                        : mt_fail(err, MT_E_FORMAT, "%s: not a JSON object", label);
    cJSON_Delete(root);
    if (st != MT_OK) {
        model_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return MT_OK;
}

mt_status model_tokenizer_load(const char *path, model_tokenizer **out, mt_err *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    mt_status st = mt_file_read(path, &text, &len, err);
    if (st != MT_OK)
        return st;
    st = model_tokenizer_parse(text, len, path, out, err);
    free(text);
    return st;
}

/* ---- encoding -------------------------------------------------------------- */

typedef struct ids_buf {
    int32_t *p;
    size_t n, cap;
} ids_buf;

static bool ids_push(ids_buf *b, int32_t id)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        int32_t *p = realloc(b->p, cap * sizeof *p);
        if (!p)
            return false;
        b->p = p;
        b->cap = cap;
    }
    b->p[b->n++] = id;
    return true;
}

/* A candidate merge of the symbol at pos with its right neighbour. */
typedef struct cand {
    int32_t rank, pos;
} cand;

static bool cand_less(cand a, cand b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    while (i && cand_less(c, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= *n)
            break;
        if (k + 1 < *n && cand_less(h[k + 1], h[k]))
            k++;
        if (!cand_less(h[k], last))
            break;
        h[i] = h[k];
        i = k;
    }
    h[i] = last;
    return top;
}

/* BPE over one piece of raw bytes: symbols start as the bytes' tokens and
 * the adjacent pair with the lowest merge rank merges first (leftmost on
 * ties) until no pair has a merge. */
static mt_status bpe_piece(const model_tokenizer *t, const char *s, size_t n, ids_buf *out,
                           mt_err *err)
{
    if (!n)
        return MT_OK;
    char stack_text[256];
    char *text = NULL;
    size_t tlen = 0;
    if (t->ignore_merges) {
        /* The piece as its vocab spelling: a whole-piece token wins. */
        text = 2 * n <= sizeof stack_text ? stack_text : malloc(2 * n);
        if (!text)
            return mt_fail(err, MT_E_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {
            char c[4];
            int k = t->byte_level ? model_bytelevel_char((uint8_t)s[i], c) : (c[0] = s[i], 1);
            memcpy(text + tlen, c, (size_t)k);
            tlen += (size_t)k;
        }
        int32_t whole = vocab_get(t, text, tlen);
        if (text != stack_text)
            free(text);
        if (whole >= 0)
            return ids_push(out, whole) ? MT_OK : mt_fail(err, MT_E_NOMEM, "out of memory");
    }
    /* Symbols as a linked list over the byte positions; a min-heap of
     * candidate merges ordered by (rank, position) gives the lowest rank,
     * leftmost first, in O(n log n) even for one long piece. */
    enum { SMALL = 64 };
    int32_t s_sym[SMALL], s_next[SMALL], s_prev[SMALL];
    cand s_heap[3 * SMALL];
    bool small = n <= SMALL;
    int32_t *sym = small ? s_sym : malloc(n * sizeof *sym);
    int32_t *next = small ? s_next : malloc(n * sizeof *next);
    int32_t *prev = small ? s_prev : malloc(n * sizeof *prev);
    cand *heap = small ? s_heap : malloc(3 * n * sizeof *heap);
    mt_status st = MT_OK;
    if (!sym || !next || !prev || !heap)
        st = mt_fail(err, MT_E_NOMEM, "out of memory");
    size_t hn = 0;
    for (size_t i = 0; i < n && st == MT_OK; i++) {
        sym[i] = t->byte_id[(unsigned char)s[i]];
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        prev[i] = (int32_t)i - 1;
        if (sym[i] < 0)
            st = mt_fail(err, MT_E_FORMAT, "the vocab has no token for byte 0x%02x",
                         (unsigned char)s[i]);
    }
    for (size_t i = 0; i + 1 < n && st == MT_OK; i++) {
        const merge_slot *ms = merge_get(t, sym[i], sym[i + 1]);
        if (ms)
            heap_push(heap, &hn, (cand){ms->rank, (int32_t)i});
    }
    while (hn && st == MT_OK) {
        cand c = heap_pop(heap, &hn);
        int32_t i = c.pos, j = next[i];
        /* Skip entries made stale by an earlier merge (i merged away, or
         * the pair at i is no longer the one with this rank). */
        if (sym[i] < 0 || j < 0)
            continue;
        const merge_slot *ms = merge_get(t, sym[i], sym[j]);
        if (!ms || ms->rank != c.rank)
            continue;
        sym[i] = ms->id;
        sym[j] = -1;
        next[i] = next[j];
        if (next[j] >= 0)
            prev[next[j]] = i;
        if (prev[i] >= 0 && (ms = merge_get(t, sym[prev[i]], sym[i])))
            heap_push(heap, &hn, (cand){ms->rank, prev[i]});
        if (next[i] >= 0 && (ms = merge_get(t, sym[i], sym[next[i]])))
            heap_push(heap, &hn, (cand){ms->rank, i});
    }
    for (int32_t i = 0; st == MT_OK && n && i >= 0; i = next[i])
        if (!ids_push(out, sym[i]))
            st = mt_fail(err, MT_E_NOMEM, "out of memory");
    if (!small) {
        free(sym);
        free(next);
        free(prev);
        free(heap);
    }
    return st;
}

/* Runs split step k (and the ones after it) over s[0..n), then BPE. */
static mt_status pre_split(const model_tokenizer *t, int k, const char *s, size_t n,
                           pcre2_match_data **md, ids_buf *out, mt_err *err)
{
    if (k == t->nsteps)
        return bpe_piece(t, s, n, out, err);
    const pre_step *step = &t->steps[k];
    size_t at = 0, last = 0;
    mt_status st = MT_OK;
    while (at <= n && st == MT_OK) {
        int rc = pcre2_match(step->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, md[k], NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0)
            return mt_fail(err, MT_E_INVALID, "pre-tokenizer match failed at byte %zu (PCRE2 "
                           "error %d)", at, rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md[k]);
        size_t b = ov[0], e = ov[1];
        if (e == b) {
            /* Empty match: step over one character. */
            if (b >= n)
                break;
            int len = utf8_seq((const unsigned char *)s + b, n - b);
            at = b + (size_t)(len > 0 ? len : 1);
            continue;
        }
        if (b > last)
            st = pre_split(t, k + 1, s + last, b - last, md, out, err);
        if (st == MT_OK && !step->removed)
            st = pre_split(t, k + 1, s + b, e - b, md, out, err);
        last = at = e;
    }
    if (st == MT_OK && last < n)
        st = pre_split(t, k + 1, s + last, n - last, md, out, err);
    return st;
}

static mt_status encode(const model_tokenizer *t, const char *text, size_t len, bool parse_added,
                        int32_t **ids, size_t *n, mt_err *err)
{
    *ids = NULL;
    *n = 0;
    size_t bad = model_utf8_check(text, len);
    if (bad != len)
        return mt_fail(err, MT_E_INVALID, "text is not valid UTF-8 at byte %zu", bad);
    pcre2_match_data *md[sizeof t->steps / sizeof t->steps[0]] = {0};
    for (int k = 0; k < t->nsteps; k++)
        if (!(md[k] = pcre2_match_data_create_from_pattern(t->steps[k].re, NULL))) {
            for (int j = 0; j < k; j++)
                pcre2_match_data_free(md[j]);
            return mt_fail(err, MT_E_NOMEM, "out of memory");
        }
    ids_buf out = {0};
    mt_status st = MT_OK;
    size_t start = 0, i = 0;
    while (parse_added && i < len && st == MT_OK) {
        unsigned char b = (unsigned char)text[i];
        const added_tok *hit = NULL;
        for (size_t a = t->added_first[b]; a < t->added_first[b + 1]; a++)
            if (t->added[a].len <= len - i && !memcmp(text + i, t->added[a].content, t->added[a].len)) {
                hit = &t->added[a];
                break; /* longest first */
            }
        if (!hit) {
            i++;
            continue;
        }
        if (i > start)
            st = pre_split(t, 0, text + start, i - start, md, &out, err);
        if (st == MT_OK && !ids_push(&out, hit->id))
            st = mt_fail(err, MT_E_NOMEM, "out of memory");
        i += hit->len;
        start = i;
    }
    if (st == MT_OK && start < len)
        st = pre_split(t, 0, text + start, len - start, md, &out, err);
    for (int k = 0; k < t->nsteps; k++)
        pcre2_match_data_free(md[k]);
    if (st != MT_OK) {
        free(out.p);
        return st;
    }
    *ids = out.p ? out.p : malloc(sizeof(int32_t));
    if (!*ids)
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    *n = out.n;
    return MT_OK;
}

mt_status model_tokenizer_encode(const model_tokenizer *t, const char *text, size_t len,
                                 int32_t **ids, size_t *n, mt_err *err)
{
    return encode(t, text, len, true, ids, n, err);
}

mt_status model_tokenizer_encode_plain(const model_tokenizer *t, const char *text, size_t len,
                                       int32_t **ids, size_t *n, mt_err *err)
{
    return encode(t, text, len, false, ids, n, err);
}

/* ---- decoding -------------------------------------------------------------- */

/* The stand-in character at s (UTF-8) as a byte, or -1. */
static int standin_byte(const char *s, size_t n, int *used)
{
    unsigned cp;
    unsigned char c0 = (unsigned char)s[0];
    if (c0 < 0x80) {
        cp = c0;
        *used = 1;
    } else if ((c0 & 0xe0) == 0xc0 && n >= 2) {
        cp = ((c0 & 0x1fu) << 6) | ((unsigned char)s[1] & 0x3fu);
        *used = 2;
    } else {
        return -1;
    }
    return bytelevel_byte(cp);
}

int64_t model_tokenizer_token_bytes(const model_tokenizer *t, int32_t id, char *buf, size_t cap)
{
    if (id < 0 || id >= t->ntok || !t->tok[id].present)
        return -1;
    const tok_entry *e = &t->tok[id];
    /* As the reference ByteLevel decoder: a token whose characters are all
     * stand-ins decodes to their bytes, any other token to its own text. */
    size_t n = 0;
    bool mapped = t->byte_level;
    for (size_t i = 0; mapped && i < e->len;) {
        int used, b = standin_byte(e->text + i, e->len - i, &used);
        if (b < 0)
            mapped = false;
        else if (n++ < cap)
            buf[n - 1] = (char)b;
        i += mapped ? (size_t)used : 0;
    }
    if (!mapped) {
        memcpy(buf, e->text, e->len < cap ? e->len : cap);
        n = e->len;
    }
    return (int64_t)n;
}

mt_status model_tokenizer_decode(const model_tokenizer *t, const int32_t *ids, size_t n,
                                 bool skip_special, char **text, size_t *len, mt_err *err)
{
    *text = NULL;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->ntok || !t->tok[ids[i]].present)
            return mt_fail(err, MT_E_INVALID, "token id %" PRId32 " (position %zu) is not in the "
                           "vocab", ids[i], i);
        total += t->tok[ids[i]].len;
    }
    char *raw = malloc(total + 1);
    if (!raw)
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    size_t r = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip_special && t->tok[ids[i]].special)
            continue;
        r += (size_t)model_tokenizer_token_bytes(t, ids[i], raw + r, total - r);
    }
    /* Lossy UTF-8: each maximal invalid subpart becomes U+FFFD (3 bytes). */
    char *o = malloc(3 * r + 1);
    if (!o) {
        free(raw);
        return mt_fail(err, MT_E_NOMEM, "out of memory");
    }
    size_t w = 0;
    for (size_t i = 0; i < r;) {
        int k = utf8_seq((const unsigned char *)raw + i, r - i);
        if (k > 0) {
            memcpy(o + w, raw + i, (size_t)k);
            w += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(o + w, "\xef\xbf\xbd", 3);
            w += 3;
            i += (size_t)-k;
        }
    }
    o[w] = 0;
    free(raw);
    *text = o;
    if (len)
        *len = w;
    return MT_OK;
}

int32_t model_tokenizer_vocab_size(const model_tokenizer *t) { return t->ntok; }

int32_t model_tokenizer_token_id(const model_tokenizer *t, const char *token)
{
    return vocab_get(t, token, strlen(token));
}

const char *model_tokenizer_token_text(const model_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->ntok && t->tok[id].present ? t->tok[id].text : NULL;
}

bool model_tokenizer_is_special(const model_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->ntok && t->tok[id].special;
}
