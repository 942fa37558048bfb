/* serve_grammar.c: JSON schemas and GLM's tool-call format compiled into a
 * byte-level pushdown automaton (see serve_grammar.h).
 *
 * The grammar is a table of nodes; a state is a stack of frames, one per
 * node being matched, the innermost on top. A byte goes to the top frame,
 * which consumes it, refuses it, pushes a child (that gets the byte), or,
 * when complete without it, pops and hands it to its parent. A frame that
 * completes on a byte (a string's closing quote, a literal's last byte)
 * pops at once, so equal positions have equal states (the mask cache keys
 * on them). Literal sets (enums, keys, tags) are sorted byte strings: the
 * candidates sharing the bytes read so far are a contiguous range. */
#include "serve_grammar.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_buf.h"
#include "serve_glmout.h"

enum gkind {
    K_LIT = 0,   /* one of a set of byte strings */
    K_STR = 1,   /* a JSON string */
    K_RAW = 2,   /* a tool argument's raw text, up to and including its terminator */
    K_NUM = 3,   /* a JSON number (or integer) */
    K_ARR = 4,   /* a JSON array */
    K_OBJ = 5,   /* a JSON object of listed properties, in order */
    K_MAP = 6,   /* a JSON object of any keys */
    K_ANY = 7,   /* any JSON value */
    K_UNION = 8, /* one of several nodes, told apart by their first byte */
    K_SEQ = 9,   /* nodes one after the other */
    K_CALLS = 10, /* GLM tool calls */
    K_ARGS = 11, /* one tool's arguments, up to and including "</tool_call>" */
};

#define MAX_INT_DIGITS 15
#define MAX_FRAC_DIGITS 15
#define MAX_EXP_DIGITS 2
#define MAX_NODES 65000
#define MAX_ENTRIES 65000  /* literal strings in one set (frame lo/hi are 16 bits) */
#define MAX_PROPERTIES 256 /* per object: slot literals grow with the square */
#define NO_LIMIT UINT32_MAX
#define ARG_END "</arg_value>"

typedef struct lit_ent {
    uint32_t off, len; /* bytes in the pool */
    int32_t payload;   /* what the literal's parent learns (property index, tool, -1 close) */
} lit_ent;

typedef struct gprop {
    uint32_t value; /* node of its value */
} gprop;

typedef struct gnode {
    uint8_t kind;
    bool int_only; /* NUM */
    bool parallel; /* CALLS */
    uint32_t min, max; /* STR/RAW characters; ARR items */
    uint32_t e0, ne;   /* LIT: entries */
    uint32_t k0, nk;   /* UNION alternatives, SEQ parts, CALLS per-tool ARGS: kids */
    uint32_t p0, np;   /* OBJ/ARGS: props[p0..p0+np), slot literals slots[p0 + i] for i <= np */
    int32_t last_req;  /* OBJ/ARGS: index of the last required property, -1 none */
    uint32_t item;     /* ARR items; MAP values */
    uint32_t key;      /* MAP keys; CALLS: the "<tool_call>NAME" literal */
    uint32_t term, term_len; /* RAW: terminator bytes in the pool */
    uint8_t first[32]; /* bytes the node may start with */
} gnode;

struct serve_grammar {
    atomic_int refs;
    gnode *nodes;
    uint32_t n_nodes, cap_nodes;
    lit_ent *ents;
    uint32_t n_ents, cap_ents;
    char *pool;
    uint32_t pool_len, pool_cap;
    uint32_t *kids;
    uint32_t n_kids, cap_kids;
    gprop *props;
    uint32_t *slots; /* parallel to props, one more per object (its slot np) */
    uint32_t n_props, cap_props;
    uint32_t root;
    /* Shared nodes of any JSON value. */
    uint32_t any, str_any, num_any, arr_any, map_any, lit_bool, lit_null;
};

/* ---- the automaton ---------------------------------------------------------- */

enum { R_FAIL, R_OK, R_OK_POP, R_RETRY, R_POP_RETRY };

/* STR/RAW phases */
enum { S_OPEN = 0, S_BODY = 1, S_ESC = 2, S_HEX = 3, S_LT = 4, S_TERM = 5 };
/* NUM phases */
enum { N_START = 0, N_SIGN, N_ZERO, N_INT, N_FRAC0, N_FRAC, N_EXP0, N_EXPS, N_EXP };
/* ARR phases */
enum { A_OPEN = 0, A_FIRST, A_ITEM, A_AFTER, A_NEXT };
/* OBJ phases (a key literal includes its quotes and the colon; O_SLOT is
 * right after '{', O_COMMA after ',', where a key must follow) */
enum { O_OPEN = 0, O_SLOT, O_KEY, O_VALPUSH, O_VAL, O_AFTER, O_COMMA };
/* MAP phases */
enum { M_OPEN = 0, M_FIRST, M_KEY, M_COLON, M_VALPUSH, M_VAL, M_AFTER, M_NEXT };
/* CALLS phases */
enum { C_START = 0, C_NAME, C_ARGSPUSH, C_ARGS, C_AFTER };
/* ARGS phases */
enum { G_SLOT = 0, G_KEY, G_VALPUSH, G_VAL };

static void frame_init(const serve_grammar *g, serve_gframe *f, uint32_t node)
{
    memset(f, 0, sizeof *f);
    f->node = (uint16_t)node;
    if (g->nodes[node].kind == K_LIT)
        f->hi = (uint16_t)g->nodes[node].ne;
    if (g->nodes[node].kind == K_RAW)
        f->phase = S_BODY; /* no opening character */
}

static bool push(const serve_grammar *g, serve_gstate *s, uint32_t node)
{
    if (s->depth >= SERVE_GRAMMAR_MAX_DEPTH)
        return false;
    frame_init(g, &s->f[s->depth++], node);
    return true;
}

static bool has_first(const gnode *n, uint8_t b) { return (n->first[b >> 3] >> (b & 7)) & 1; }

/* UTF-8: u8 holds the continuation bytes still expected (low 2 bits) and
 * the range of the next one (the rest): 0 80-BF, 1 A0-BF, 2 80-9F, 3 90-BF,
 * 4 80-8F. */
static bool utf8_lead(serve_gframe *f, uint8_t b)
{
    if (b >= 0xC2 && b <= 0xDF)
        f->u8 = 1;
    else if (b == 0xE0)
        f->u8 = 2 | 1 << 2;
    else if (b == 0xED)
        f->u8 = 2 | 2 << 2;
    else if (b >= 0xE1 && b <= 0xEF)
        f->u8 = 2;
    else if (b == 0xF0)
        f->u8 = 3 | 3 << 2;
    else if (b == 0xF4)
        f->u8 = 3 | 4 << 2;
    else if (b >= 0xF1 && b <= 0xF3)
        f->u8 = 3;
    else
        return false;
    return true;
}

static bool utf8_cont(serve_gframe *f, uint8_t b)
{
    static const uint8_t lo[5] = {0x80, 0xA0, 0x80, 0x90, 0x80};
    static const uint8_t hi[5] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
    int r = f->u8 >> 2, rem = f->u8 & 3;
    if (b < lo[r] || b > hi[r])
        return false;
    f->u8 = (uint8_t)(rem - 1);
    return true;
}

static int hexval(uint8_t b)
{
    return b >= '0' && b <= '9' ? b - '0' : b >= 'a' && b <= 'f' ? b - 'a' + 10
                                         : b >= 'A' && b <= 'F' ? b - 'A' + 10 : -1;
}

static int step_lit(const serve_grammar *g, const gnode *nd, serve_gframe *f, uint8_t b, int *res)
{
    const lit_ent *E = g->ents + nd->e0;
    uint32_t pos = f->n, lo = f->lo, hi = f->hi, i = lo;
    bool exact = E[lo].len == pos;
    if (exact)
        i++;
    while (i < hi && (uint8_t)g->pool[E[i].off + pos] < b)
        i++;
    uint32_t j = i;
    while (j < hi && (uint8_t)g->pool[E[j].off + pos] == b)
        j++;
    if (i == j) {
        if (exact) {
            *res = E[lo].payload;
            return R_POP_RETRY;
        }
        return R_FAIL;
    }
    f->lo = (uint16_t)i;
    f->hi = (uint16_t)j;
    f->n = pos + 1;
    if (j - i == 1 && E[i].len == pos + 1) {
        *res = E[i].payload;
        return R_OK_POP;
    }
    return R_OK;
}

/* A character of a string body (JSON or raw), b not the closing byte. */
static int body_char(const gnode *nd, serve_gframe *f, uint8_t b)
{
    if (f->n >= nd->max)
        return R_FAIL;
    if (b >= 0x80 && !utf8_lead(f, b))
        return R_FAIL;
    f->n++;
    return R_OK;
}

static int step_str(const gnode *nd, serve_gframe *f, uint8_t b)
{
    switch (f->phase) {
    case S_OPEN:
        if (b != '"')
            return R_FAIL;
        f->phase = S_BODY;
        return R_OK;
    case S_BODY:
        if (f->u8)
            return utf8_cont(f, b) ? R_OK : R_FAIL;
        if (b == '"')
            return f->n >= nd->min ? R_OK_POP : R_FAIL;
        if (b == '\\') {
            if (f->n >= nd->max)
                return R_FAIL;
            f->n++;
            f->phase = S_ESC;
            return R_OK;
        }
        if (b < 0x20)
            return R_FAIL;
        return body_char(nd, f, b);
    case S_ESC:
        if (b == 'u') {
            f->phase = S_HEX;
            f->u8 = 0;
            f->lo = 0;
            return R_OK;
        }
        if (!strchr("\"\\/bfnrt", b) || !b)
            return R_FAIL;
        f->phase = S_BODY;
        return R_OK;
    case S_HEX: {
        int h = hexval(b);
        if (h < 0)
            return R_FAIL;
        if (f->u8 == 1 && f->lo == 0xD && h >= 8)
            return R_FAIL; /* D800-DFFF: a surrogate alone is no character */
        if (f->u8 == 3 && f->lo == 0 && h == 0)
            return R_FAIL; /* \u0000: many readers end the string there */
        f->lo = (uint16_t)(f->lo * 16 + h);
        if (++f->u8 == 4) {
            f->phase = S_BODY;
            f->u8 = 0;
            f->lo = 0;
        }
        return R_OK;
    }
    default:
        return R_FAIL;
    }
}

/* A raw argument: text without "</" and without NUL, then the terminator
 * (which starts with "</"). A '<' is content until a '/' follows it. */
static int step_raw(const serve_grammar *g, const gnode *nd, serve_gframe *f, uint8_t b)
{
    const char *term = g->pool + nd->term;
    switch (f->phase) {
    case S_LT:
        if (b == '/') {
            f->n--; /* the '<' was the terminator's */
            if (f->n < nd->min)
                return R_FAIL;
            f->phase = S_TERM;
            f->lo = 2;
            return R_OK;
        }
        f->phase = S_BODY; /* b is content */
        /* fall through */
    case S_BODY:
        if (f->u8)
            return utf8_cont(f, b) ? R_OK : R_FAIL;
        if (b == '<') {
            if (f->n < nd->max) {
                f->n++;
                f->phase = S_LT;
            } else {
                f->phase = S_TERM;
                f->lo = 1;
            }
            return R_OK;
        }
        if (b == 0)
            return R_FAIL;
        return body_char(nd, f, b);
    case S_TERM:
        if (b != (uint8_t)term[f->lo])
            return R_FAIL;
        return ++f->lo == nd->term_len ? R_OK_POP : R_OK;
    default:
        return R_FAIL;
    }
}

static int step_num(const gnode *nd, serve_gframe *f, uint8_t b)
{
    bool digit = b >= '0' && b <= '9', exp = b == 'e' || b == 'E';
    switch (f->phase) {
    case N_START:
        if (b == '-') {
            f->phase = N_SIGN;
            return R_OK;
        }
        /* fall through */
    case N_SIGN:
        if (b == '0')
            f->phase = N_ZERO;
        else if (digit)
            f->phase = N_INT, f->n = 1;
        else
            return R_FAIL;
        return R_OK;
    case N_ZERO:
    case N_INT:
        if (f->phase == N_INT && digit && f->n < MAX_INT_DIGITS) {
            f->n++;
            return R_OK;
        }
        if (!nd->int_only && (b == '.' || exp)) {
            f->phase = b == '.' ? N_FRAC0 : N_EXP0;
            f->n = 0;
            return R_OK;
        }
        return R_POP_RETRY;
    case N_FRAC0:
        if (!digit)
            return R_FAIL;
        f->phase = N_FRAC;
        f->n = 1;
        return R_OK;
    case N_FRAC:
        if (digit && f->n < MAX_FRAC_DIGITS) {
            f->n++;
            return R_OK;
        }
        if (exp) {
            f->phase = N_EXP0;
            f->n = 0;
            return R_OK;
        }
        return R_POP_RETRY;
    case N_EXP0:
        if (b == '+' || b == '-') {
            f->phase = N_EXPS;
            return R_OK;
        }
        /* fall through */
    case N_EXPS:
        if (!digit)
            return R_FAIL;
        f->phase = N_EXP;
        f->n = 1;
        return R_OK;
    case N_EXP:
        if (digit && f->n < MAX_EXP_DIGITS) {
            f->n++;
            return R_OK;
        }
        return R_POP_RETRY;
    default:
        return R_FAIL;
    }
}

/* Replaces an ANY or UNION frame by the node its first byte selects. */
static int dispatch(const serve_grammar *g, const gnode *nd, serve_gframe *f, uint8_t b)
{
    if (nd->kind == K_UNION) {
        for (uint32_t k = 0; k < nd->nk; k++) {
            uint32_t alt = g->kids[nd->k0 + k];
            if (has_first(&g->nodes[alt], b)) {
                frame_init(g, f, alt);
                return R_RETRY;
            }
        }
        return R_FAIL;
    }
    uint32_t to;
    if (b == '{')
        to = g->map_any;
    else if (b == '[')
        to = g->arr_any;
    else if (b == '"')
        to = g->str_any;
    else if (b == '-' || (b >= '0' && b <= '9'))
        to = g->num_any;
    else if (b == 't' || b == 'f')
        to = g->lit_bool;
    else if (b == 'n')
        to = g->lit_null;
    else
        return R_FAIL;
    frame_init(g, f, to);
    return R_RETRY;
}

static bool required_from(const gnode *nd, uint32_t i) { return nd->last_req >= (int32_t)i; }

static int step_frame(const serve_grammar *g, serve_gstate *s, serve_gframe *f, uint8_t b,
                      int *res)
{
    const gnode *nd = &g->nodes[f->node];
    switch (nd->kind) {
    case K_LIT:
        return step_lit(g, nd, f, b, res);
    case K_STR:
        return step_str(nd, f, b);
    case K_RAW:
        return step_raw(g, nd, f, b);
    case K_NUM:
        return step_num(nd, f, b);
    case K_ANY:
    case K_UNION:
        return dispatch(g, nd, f, b);
    case K_ARR:
        switch (f->phase) {
        case A_OPEN:
            if (b != '[')
                return R_FAIL;
            f->phase = A_FIRST;
            return R_OK;
        case A_FIRST:
            if (b == ']')
                return nd->min == 0 ? R_OK_POP : R_FAIL;
            if (nd->max == 0)
                return R_FAIL;
            /* fall through */
        case A_NEXT:
            f->phase = A_ITEM;
            return push(g, s, nd->item) ? R_RETRY : R_FAIL;
        case A_AFTER:
            if (b == ',' && f->n < nd->max) {
                f->phase = A_NEXT;
                return R_OK;
            }
            return b == ']' && f->n >= nd->min ? R_OK_POP : R_FAIL;
        default:
            return R_FAIL;
        }
    case K_OBJ:
        switch (f->phase) {
        case O_OPEN:
            if (b != '{')
                return R_FAIL;
            f->phase = O_SLOT;
            f->lo = 0;
            return R_OK;
        case O_SLOT:
        case O_COMMA:
            if (b == '}')
                return required_from(nd, f->lo) || f->phase == O_COMMA ? R_FAIL : R_OK_POP;
            if (f->lo >= nd->np)
                return R_FAIL;
            f->phase = O_KEY;
            return push(g, s, g->slots[nd->p0 + f->lo]) ? R_RETRY : R_FAIL;
        case O_VALPUSH:
            f->phase = O_VAL;
            return push(g, s, g->props[nd->p0 + f->hi].value) ? R_RETRY : R_FAIL;
        case O_AFTER:
            if (b == ',' && f->hi + 1u < nd->np) {
                f->phase = O_COMMA;
                f->lo = (uint16_t)(f->hi + 1);
                return R_OK;
            }
            return b == '}' && !required_from(nd, f->hi + 1u) ? R_OK_POP : R_FAIL;
        default:
            return R_FAIL;
        }
    case K_MAP:
        switch (f->phase) {
        case M_OPEN:
            if (b != '{')
                return R_FAIL;
            f->phase = M_FIRST;
            return R_OK;
        case M_FIRST:
            if (b == '}')
                return R_OK_POP;
            /* fall through */
        case M_NEXT:
            f->phase = M_KEY;
            return push(g, s, nd->key) ? R_RETRY : R_FAIL;
        case M_COLON:
            if (b != ':')
                return R_FAIL;
            f->phase = M_VALPUSH;
            return R_OK;
        case M_VALPUSH:
            f->phase = M_VAL;
            return push(g, s, nd->item) ? R_RETRY : R_FAIL;
        case M_AFTER:
            if (b == ',') {
                f->phase = M_NEXT;
                return R_OK;
            }
            return b == '}' ? R_OK_POP : R_FAIL;
        default:
            return R_FAIL;
        }
    case K_SEQ:
        return push(g, s, g->kids[nd->k0 + f->n]) ? R_RETRY : R_FAIL;
    case K_CALLS:
        switch (f->phase) {
        case C_START:
        case C_AFTER:
            if (f->phase == C_AFTER && !nd->parallel)
                return R_FAIL;
            f->phase = C_NAME;
            return push(g, s, nd->key) ? R_RETRY : R_FAIL;
        case C_ARGSPUSH:
            f->phase = C_ARGS;
            return push(g, s, g->kids[nd->k0 + f->lo]) ? R_RETRY : R_FAIL;
        default:
            return R_FAIL;
        }
    case K_ARGS:
        switch (f->phase) {
        case G_SLOT:
            f->phase = G_KEY;
            return push(g, s, g->slots[nd->p0 + f->lo]) ? R_RETRY : R_FAIL;
        case G_VALPUSH:
            f->phase = G_VAL;
            return push(g, s, g->props[nd->p0 + f->hi].value) ? R_RETRY : R_FAIL;
        default:
            return R_FAIL;
        }
    default:
        return R_FAIL;
    }
}

/* The child of frame f completed with result res: true when f completes
 * with it too. */
static bool child_done(const serve_grammar *g, serve_gframe *f, int res)
{
    const gnode *nd = &g->nodes[f->node];
    switch (nd->kind) {
    case K_ARR:
        f->n++;
        f->phase = A_AFTER;
        return false;
    case K_OBJ:
        if (f->phase == O_KEY) {
            f->hi = (uint16_t)res;
            f->phase = O_VALPUSH;
        } else {
            f->phase = O_AFTER;
        }
        return false;
    case K_MAP:
        f->phase = f->phase == M_KEY ? M_COLON : M_AFTER;
        return false;
    case K_SEQ:
        return ++f->n == nd->nk;
    case K_CALLS:
        if (f->phase == C_NAME) {
            f->lo = (uint16_t)res;
            f->phase = C_ARGSPUSH;
            return false;
        }
        f->n++;
        f->phase = C_AFTER;
        return !nd->parallel;
    case K_ARGS:
        if (f->phase == G_KEY) {
            if (res < 0)
                return true; /* "</tool_call>" */
            f->hi = (uint16_t)res;
            f->phase = G_VALPUSH;
            return false;
        }
        f->lo = (uint16_t)(f->hi + 1);
        f->phase = G_SLOT;
        return false;
    default:
        return false;
    }
}

static void pop(const serve_grammar *g, serve_gstate *s, int res)
{
    s->depth--;
    while (s->depth > 0 && child_done(g, &s->f[s->depth - 1], res)) {
        s->depth--;
        res = 0;
    }
}

static bool frame_accepting(const serve_grammar *g, const serve_gframe *f, int *res)
{
    const gnode *nd = &g->nodes[f->node];
    switch (nd->kind) {
    case K_LIT:
        *res = g->ents[nd->e0 + f->lo].payload;
        return f->lo < f->hi && g->ents[nd->e0 + f->lo].len == f->n;
    case K_NUM:
        *res = 0;
        return f->phase == N_ZERO || f->phase == N_INT || f->phase == N_FRAC ||
               f->phase == N_EXP;
    case K_CALLS:
        *res = 0;
        return f->phase == C_AFTER;
    default:
        return false;
    }
}

void serve_grammar_start(const serve_grammar *g, serve_gstate *s)
{
    s->depth = 0;
    push(g, s, g->root);
}

bool serve_grammar_step(const serve_grammar *g, serve_gstate *s, uint8_t b)
{
    for (int guard = 0; guard < 4 * SERVE_GRAMMAR_MAX_DEPTH + 8; guard++) {
        if (s->depth == 0)
            return false;
        int res = 0;
        switch (step_frame(g, s, &s->f[s->depth - 1], b, &res)) {
        case R_OK:
            return true;
        case R_OK_POP:
            pop(g, s, res);
            return true;
        case R_RETRY:
            continue;
        case R_POP_RETRY:
            pop(g, s, res);
            continue;
        default:
            return false;
        }
    }
    return false;
}

bool serve_grammar_feed(const serve_grammar *g, serve_gstate *s, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!serve_grammar_step(g, s, (uint8_t)p[i]))
            return false;
    return true;
}

bool serve_grammar_accepting(const serve_grammar *g, const serve_gstate *s)
{
    serve_gstate t;
    t.depth = s->depth;
    memcpy(t.f, s->f, s->depth * sizeof *s->f);
    while (t.depth > 0) {
        int res = 0;
        if (!frame_accepting(g, &t.f[t.depth - 1], &res))
            return false;
        pop(g, &t, res);
    }
    return true;
}

int serve_grammar_in_string(const serve_grammar *g, const serve_gstate *s, uint32_t *room,
                            uint32_t *need, uint8_t *pending)
{
    if (s->depth == 0)
        return 0;
    const serve_gframe *f = &s->f[s->depth - 1];
    const gnode *nd = &g->nodes[f->node];
    if ((nd->kind != K_STR && nd->kind != K_RAW) || f->phase != S_BODY)
        return 0;
    *room = nd->max == NO_LIMIT ? NO_LIMIT : nd->max - f->n;
    *need = f->n < nd->min ? nd->min - f->n : 0;
    *pending = f->u8;
    return nd->kind == K_STR ? 1 : 2;
}

void serve_grammar_string_advance(const serve_grammar *g, serve_gstate *s, uint32_t chars)
{
    (void)g;
    serve_gframe *f = &s->f[s->depth - 1];
    f->u8 = 0;
    f->n += chars;
}

/* u8 codes (remaining | range << 2) of the pending classes 1-7. */
static const uint8_t utf8_codes[SERVE_GRAMMAR_UTF8_CLASSES] = {0, 1, 2, 2 | 1 << 2, 2 | 2 << 2,
                                                               3, 3 | 3 << 2, 3 | 4 << 2};

int serve_grammar_utf8_class(uint8_t pending)
{
    for (int c = 0; c < SERVE_GRAMMAR_UTF8_CLASSES; c++)
        if (utf8_codes[c] == pending)
            return c;
    return 0;
}

void serve_grammar_utf8_expect(int c, int *bytes, uint8_t *lo, uint8_t *hi)
{
    static const uint8_t los[5] = {0x80, 0xA0, 0x80, 0x90, 0x80};
    static const uint8_t his[5] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
    *bytes = utf8_codes[c] & 3;
    *lo = los[utf8_codes[c] >> 2];
    *hi = his[utf8_codes[c] >> 2];
}

uint64_t serve_grammar_state_hash(const serve_gstate *s)
{
    uint64_t h = 1469598103934665603ull ^ s->depth;
    const unsigned char *p = (const unsigned char *)s->f;
    for (size_t i = 0; i < s->depth * sizeof *s->f; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

bool serve_grammar_state_equal(const serve_gstate *a, const serve_gstate *b)
{
    return a->depth == b->depth && !memcmp(a->f, b->f, a->depth * sizeof *a->f);
}

/* ---- building the tables -------------------------------------------------------- */

typedef struct cc {
    serve_grammar *g;
    serve_error *e;
    char path[384]; /* the field at fault: param and the path inside the schema */
    bool oom;       /* out of memory, or too_big */
    bool too_big;   /* past MAX_NODES or MAX_ENTRIES */
} cc;

#define GROW(arr, n, cap, extra)                                                                 \
    do {                                                                                         \
        if ((n) + (extra) > (cap)) {                                                             \
            uint32_t nc_ = (cap) ? (cap) * 2 : 64;                                               \
            while (nc_ < (n) + (extra))                                                          \
                nc_ *= 2;                                                                        \
            void *p_ = realloc((arr), (size_t)nc_ * sizeof *(arr));                              \
            if (!p_)                                                                             \
                return c->oom = true, 0;                                                         \
            (arr) = p_;                                                                          \
            (cap) = nc_;                                                                         \
        }                                                                                        \
    } while (0)

/* A new node (index + 1, 0 out of memory or too many nodes). */
static uint32_t node_new(cc *c, uint8_t kind)
{
    serve_grammar *g = c->g;
    if (g->n_nodes >= MAX_NODES)
        return c->too_big = c->oom = true, 0;
    GROW(g->nodes, g->n_nodes, g->cap_nodes, 1);
    gnode *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->max = NO_LIMIT;
    n->last_req = -1;
    return ++g->n_nodes;
}

static uint32_t pool_add(cc *c, const char *p, size_t n)
{
    serve_grammar *g = c->g;
    GROW(g->pool, g->pool_len, g->pool_cap, (uint32_t)n + 1);
    memcpy(g->pool + g->pool_len, p, n);
    uint32_t at = g->pool_len;
    g->pool_len += (uint32_t)n;
    return at + 1; /* 0 is failure */
}

/* Room for n more properties (and their slots). */
static bool props_reserve(cc *c, uint32_t n)
{
    serve_grammar *g = c->g;
    if (g->n_props + n <= g->cap_props)
        return true;
    uint32_t cap = g->cap_props ? g->cap_props * 2 : 64;
    while (cap < g->n_props + n)
        cap *= 2;
    gprop *p = realloc(g->props, cap * sizeof *p);
    if (!p)
        return false;
    g->props = p;
    uint32_t *sl = realloc(g->slots, cap * sizeof *sl);
    if (!sl)
        return false; /* props grew; cap_props stays: the next call grows both again */
    g->slots = sl;
    g->cap_props = cap;
    return true;
}

static void set_first(gnode *n, uint8_t b) { n->first[b >> 3] |= (uint8_t)(1u << (b & 7)); }

static void set_first_str(gnode *n, const char *bytes)
{
    for (const char *p = bytes; *p; p++)
        set_first(n, (uint8_t)*p);
}

/* A literal set under construction: strings and payloads. */
typedef struct litb {
    serve_buf *s;
    int32_t *pay;
    uint32_t n, cap;
} litb;

static bool litb_add(litb *l, const char *p, size_t n, int32_t payload)
{
    if (l->n == l->cap) {
        uint32_t cap = l->cap ? l->cap * 2 : 8;
        serve_buf *s = realloc(l->s, cap * sizeof *s);
        if (!s)
            return false;
        l->s = s;
        int32_t *q = realloc(l->pay, cap * sizeof *q);
        if (!q)
            return false;
        l->pay = q;
        l->cap = cap;
    }
    l->s[l->n] = (serve_buf)SERVE_BUF_INIT;
    if (serve_buf_append(&l->s[l->n], p, n) != MT_OK)
        return false;
    l->pay[l->n++] = payload;
    return true;
}

static void litb_free(litb *l)
{
    for (uint32_t i = 0; i < l->n; i++)
        serve_buf_release(&l->s[i]);
    free(l->s);
    free(l->pay);
    memset(l, 0, sizeof *l);
}

typedef struct lsort {
    const char *p;
    size_t n;
    int32_t payload;
} lsort;

static int lsort_cmp(const void *a, const void *b)
{
    const lsort *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = n ? memcmp(x->p, y->p, n) : 0;
    if (c)
        return c;
    return x->n < y->n ? -1 : x->n > y->n;
}

/* A literal node from l (sorted; a string given twice is kept once). */
static uint32_t lit_node(cc *c, const litb *l)
{
    serve_grammar *g = c->g;
    if (l->n == 0 || l->n > MAX_ENTRIES)
        return c->too_big = l->n > MAX_ENTRIES, c->oom = true, 0;
    lsort *v = malloc(l->n * sizeof *v);
    if (!v)
        return c->oom = true, 0;
    for (uint32_t i = 0; i < l->n; i++)
        v[i] = (lsort){l->s[i].data ? l->s[i].data : "", l->s[i].len, l->pay[i]};
    qsort(v, l->n, sizeof *v, lsort_cmp);
    uint32_t n = 0;
    for (uint32_t i = 0; i < l->n; i++)
        if (!n || lsort_cmp(&v[n - 1], &v[i]))
            v[n++] = v[i];
    if (g->n_ents + n > g->cap_ents) {
        uint32_t cap = g->cap_ents ? g->cap_ents * 2 : 64;
        while (cap < g->n_ents + n)
            cap *= 2;
        lit_ent *p = realloc(g->ents, cap * sizeof *p);
        if (!p) {
            free(v);
            return c->oom = true, 0;
        }
        g->ents = p;
        g->cap_ents = cap;
    }
    uint32_t e0 = g->n_ents;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t off = pool_add(c, v[i].p, v[i].n);
        if (!off) {
            free(v);
            return 0;
        }
        g->ents[e0 + i] = (lit_ent){off - 1, (uint32_t)v[i].n, v[i].payload};
    }
    free(v);
    g->n_ents = e0 + n;
    uint32_t id = node_new(c, K_LIT);
    if (!id)
        return 0;
    gnode *nd = &g->nodes[id - 1];
    nd->e0 = e0;
    nd->ne = n;
    for (uint32_t i = 0; i < n; i++)
        if (g->ents[e0 + i].len)
            set_first(nd, (uint8_t)g->pool[g->ents[e0 + i].off]);
    return id;
}

static uint32_t lit_one(cc *c, const char *s, int32_t payload)
{
    litb l = {0};
    uint32_t id = litb_add(&l, s, strlen(s), payload) ? lit_node(c, &l) : (c->oom = true, 0);
    litb_free(&l);
    return id;
}

static uint32_t kids_add(cc *c, const uint32_t *k, uint32_t n)
{
    serve_grammar *g = c->g;
    GROW(g->kids, g->n_kids, g->cap_kids, n);
    memcpy(g->kids + g->n_kids, k, n * sizeof *k);
    uint32_t at = g->n_kids;
    g->n_kids += n;
    return at + 1;
}

static uint32_t seq_node(cc *c, const uint32_t *parts, uint32_t n)
{
    uint32_t k0 = kids_add(c, parts, n);
    uint32_t id = k0 ? node_new(c, K_SEQ) : 0;
    if (!id)
        return 0;
    gnode *nd = &c->g->nodes[id - 1];
    nd->k0 = k0 - 1;
    nd->nk = n;
    memcpy(nd->first, c->g->nodes[parts[0]].first, sizeof nd->first);
    return id;
}

static uint32_t str_node(cc *c, uint8_t kind, uint32_t min, uint32_t max)
{
    uint32_t id = node_new(c, kind);
    if (!id)
        return 0;
    gnode *nd = &c->g->nodes[id - 1];
    nd->min = min;
    nd->max = max;
    if (kind == K_STR) {
        set_first(nd, '"');
    } else {
        uint32_t at = pool_add(c, ARG_END, strlen(ARG_END));
        if (!at)
            return 0;
        nd = &c->g->nodes[id - 1];
        nd->term = at - 1;
        nd->term_len = (uint32_t)strlen(ARG_END);
        for (int b = 1; b < 256; b++)
            set_first(nd, (uint8_t)b);
    }
    return id;
}

static uint32_t num_node(cc *c, bool int_only)
{
    uint32_t id = node_new(c, K_NUM);
    if (!id)
        return 0;
    gnode *nd = &c->g->nodes[id - 1];
    nd->int_only = int_only;
    set_first_str(nd, "-0123456789");
    return id;
}

static uint32_t arr_node(cc *c, uint32_t item, uint32_t min, uint32_t max)
{
    uint32_t id = node_new(c, K_ARR);
    if (!id)
        return 0;
    gnode *nd = &c->g->nodes[id - 1];
    nd->item = item;
    nd->min = min;
    nd->max = max;
    set_first(nd, '[');
    return id;
}

static uint32_t map_node(cc *c, uint32_t key, uint32_t value)
{
    uint32_t id = node_new(c, K_MAP);
    if (!id)
        return 0;
    gnode *nd = &c->g->nodes[id - 1];
    nd->key = key;
    nd->item = value;
    set_first(nd, '{');
    return id;
}

/* The shared nodes of any JSON value. */
static bool any_nodes(cc *c)
{
    serve_grammar *g = c->g;
    uint32_t any = node_new(c, K_ANY);
    if (!any)
        return false;
    set_first_str(&g->nodes[any - 1], "{[\"-0123456789tfn");
    uint32_t str = str_node(c, K_STR, 0, NO_LIMIT), num = num_node(c, false);
    litb l = {0};
    bool ok = litb_add(&l, "true", 4, 0) && litb_add(&l, "false", 5, 0);
    uint32_t bools = ok ? lit_node(c, &l) : 0;
    litb_free(&l);
    uint32_t null = lit_one(c, "null", 0);
    uint32_t arr = str && num && bools && null ? arr_node(c, any - 1, 0, NO_LIMIT) : 0;
    uint32_t map = arr ? map_node(c, str - 1, any - 1) : 0;
    if (!map)
        return false;
    g->any = any - 1;
    g->str_any = str - 1;
    g->num_any = num - 1;
    g->lit_bool = bools - 1;
    g->lit_null = null - 1;
    g->arr_any = arr - 1;
    g->map_any = map - 1;
    return true;
}

/* ---- JSON text of values (enums, keys) ------------------------------------------- */

/* s as a JSON string: '"', '\\' and control characters escaped, the rest as is. */
static mt_status json_str(serve_buf *b, const char *s, size_t n)
{
    MT_CHECK(serve_buf_puts(b, "\""));
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            MT_CHECK(serve_buf_printf(b, "\\%c", ch));
        else if (ch == '\n')
            MT_CHECK(serve_buf_puts(b, "\\n"));
        else if (ch == '\t')
            MT_CHECK(serve_buf_puts(b, "\\t"));
        else if (ch == '\r')
            MT_CHECK(serve_buf_puts(b, "\\r"));
        else if (ch < 0x20)
            MT_CHECK(serve_buf_printf(b, "\\u%04x", ch));
        else
            MT_CHECK(serve_buf_append(b, &s[i], 1));
    }
    return serve_buf_puts(b, "\"");
}

/* A value as compact JSON that this grammar's own rules accept (numbers in
 * the shortest form that reads back). */
static mt_status json_text(serve_buf *b, const cJSON *v)
{
    if (cJSON_IsNull(v))
        return serve_buf_puts(b, "null");
    if (cJSON_IsTrue(v))
        return serve_buf_puts(b, "true");
    if (cJSON_IsFalse(v))
        return serve_buf_puts(b, "false");
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d == floor(d) && fabs(d) < 1e15)
            return serve_buf_printf(b, "%.0f", d);
        char t[40];
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(t, sizeof t, "%.*g", prec, d);
            if (strtod(t, NULL) == d)
                break;
        }
        return serve_buf_puts(b, t);
    }
    if (cJSON_IsString(v))
        return json_str(b, v->valuestring, strlen(v->valuestring));
    bool obj = cJSON_IsObject(v);
    MT_CHECK(serve_buf_puts(b, obj ? "{" : "["));
    const cJSON *k;
    bool first = true;
    cJSON_ArrayForEach(k, v)
    {
        if (!first)
            MT_CHECK(serve_buf_puts(b, ","));
        first = false;
        if (obj) {
            MT_CHECK(json_str(b, k->string, strlen(k->string)));
            MT_CHECK(serve_buf_puts(b, ":"));
        }
        MT_CHECK(json_text(b, k));
    }
    return serve_buf_puts(b, obj ? "}" : "]");
}

/* ---- schemas ---------------------------------------------------------------------- */

static mt_status refuse(cc *c, const char *fmt, const char *what)
{
    return serve_reject(c->e, 400, c->path, "unsupported_schema", fmt, c->path, what);
}

/* Appends fmt with s (or i) to the path for a nested call; the returned
 * length restores it. */
static size_t path_push(cc *c, const char *fmt, const char *s)
{
    size_t at = strlen(c->path);
    snprintf(c->path + at, sizeof c->path - at, fmt, s);
    return at;
}

static size_t path_push_i(cc *c, const char *fmt, int i)
{
    size_t at = strlen(c->path);
    snprintf(c->path + at, sizeof c->path - at, fmt, i);
    return at;
}

static const char *const supported_kw[] = {
    "type", "properties", "required", "additionalProperties", "items", "enum", "const",
    "minLength", "maxLength", "minItems", "maxItems", "anyOf", NULL};
static const char *const annotation_kw[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "$defs",
    "definitions", "deprecated", "readOnly", "writeOnly", NULL};

static bool in_list(const char *const *l, const char *s)
{
    for (; *l; l++)
        if (!strcmp(*l, s))
            return true;
    return false;
}

enum { T_STRING = 1, T_NUMBER = 2, T_INTEGER = 4, T_BOOLEAN = 8, T_NULL = 16, T_OBJECT = 32,
       T_ARRAY = 64 };

static int type_bit(const char *t)
{
    static const char *const names[] = {"string", "number", "integer", "boolean", "null",
                                        "object", "array"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(t, names[i]))
            return 1 << i;
    return 0;
}

static int value_type(const cJSON *v)
{
    if (cJSON_IsString(v))
        return T_STRING;
    if (cJSON_IsNumber(v))
        return v->valuedouble == floor(v->valuedouble) ? T_NUMBER | T_INTEGER : T_NUMBER;
    if (cJSON_IsBool(v))
        return T_BOOLEAN;
    if (cJSON_IsNull(v))
        return T_NULL;
    return cJSON_IsObject(v) ? T_OBJECT : T_ARRAY;
}

/* A count keyword (minLength, ...): a non-negative integer, else 400. */
static mt_status count_kw(cc *c, const cJSON *sch, const char *kw, uint32_t dflt, uint32_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(sch, kw);
    *out = dflt;
    if (!v)
        return MT_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble > 1e9)
        return serve_reject(c->e, 400, c->path, "invalid_schema",
                            "'%s': %s must be a non-negative integer", c->path, kw);
    *out = (uint32_t)v->valuedouble;
    return MT_OK;
}

static mt_status compile_value(cc *c, const cJSON *sch, int nest, uint32_t *out);

/* The types a schema allows (its type keyword, or what its keywords imply;
 * 0: any value). */
static mt_status schema_types(cc *c, const cJSON *sch, int *types)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(sch, "type");
    *types = 0;
    if (cJSON_IsString(t)) {
        if (!(*types = type_bit(t->valuestring)))
            return refuse(c, "'%s': type '%s' is not a JSON schema type", t->valuestring);
    } else if (cJSON_IsArray(t)) {
        const cJSON *x;
        cJSON_ArrayForEach(x, t)
        {
            int b = cJSON_IsString(x) ? type_bit(x->valuestring) : 0;
            if (!b)
                return refuse(c, "'%s': type lists hold type names%s", "");
            *types |= b;
        }
        if (!*types)
            return refuse(c, "'%s': an empty type list allows nothing%s", "");
    } else if (t) {
        return refuse(c, "'%s': type must be a name or a list of names%s", "");
    } else {
#define HAS(k) cJSON_GetObjectItemCaseSensitive(sch, k)
        if (HAS("properties") || HAS("additionalProperties") || HAS("required"))
            *types |= T_OBJECT;
        if (HAS("items") || HAS("minItems") || HAS("maxItems"))
            *types |= T_ARRAY;
        if (HAS("minLength") || HAS("maxLength"))
            *types |= T_STRING;
#undef HAS
    }
    if ((*types & T_NUMBER) && (*types & T_INTEGER))
        *types &= ~T_INTEGER; /* number holds every integer */
    return MT_OK;
}

static mt_status compile_enum(cc *c, const cJSON *sch, int types, uint32_t *out)
{
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(sch, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(sch, "const");
    if (en && !cJSON_IsArray(en))
        return refuse(c, "'%s': enum must be a list%s", "");
    litb l = {0};
    serve_buf b = SERVE_BUF_INIT;
    mt_status st = MT_OK;
    const cJSON *v = cn ? cn : en->child;
    for (; v && st == MT_OK; v = cn ? NULL : v->next) {
        if (types && !(value_type(v) & types))
            continue; /* not of the schema's type: never valid */
        if (en && cn && !cJSON_Compare(v, cn, true))
            continue;
        serve_buf_reset(&b);
        if (cJSON_IsString(v) && (size_t)v->valueint > strlen(v->valuestring))
            continue; /* holds U+0000 (the request parser keeps decoded lengths here) */
        if (json_text(&b, v) != MT_OK || !litb_add(&l, b.data, b.len, 0))
            st = MT_E_NOMEM;
    }
    if (st == MT_OK && l.n == 0)
        st = refuse(c, "'%s': no value of enum/const fits the schema%s", "");
    if (st == MT_OK && !(*out = lit_node(c, &l)))
        st = MT_E_NOMEM;
    else if (st == MT_OK)
        (*out)--;
    serve_buf_release(&b);
    litb_free(&l);
    return st;
}

/* The node of an object (K_OBJ, first '{') or of a tool call's arguments
 * (K_ARGS, first '<') over np properties: keys[k] (klen[k] bytes, the key
 * as written up to its value), its value node vals[k], required[k]. Slot s
 * (0..np) offers the keys s.. up to the first required one at or after s,
 * and the literal `close` once no required key is left at or after s
 * (NULL: the node closes itself, as an object's '}', and slot np offers
 * nothing). Frees the arrays; st: the caller's status so far (nothing is
 * made unless MT_OK). */
static mt_status props_node(cc *c, mt_status st, int np, char **keys, size_t *klen,
                            uint32_t *vals, bool *required, const char *close, int kind,
                            char first, uint32_t *out)
{
    serve_grammar *g = c->g;
    uint32_t p0 = 0;
    if (st == MT_OK && !props_reserve(c, (uint32_t)np + 1))
        st = MT_E_NOMEM;
    if (st == MT_OK) {
        p0 = g->n_props;
        g->n_props += (uint32_t)np + 1;
    }
    int32_t last_req = -1;
    for (int k = 0; k < np && st == MT_OK; k++)
        if (required[k])
            last_req = k;
    for (int s = 0; st == MT_OK && s <= np; s++) {
        if (s < np)
            g->props[p0 + (uint32_t)s].value = vals[s];
        g->slots[p0 + (uint32_t)s] = 0;
        if (s == np && !close)
            continue; /* only the node's own close there */
        litb l = {0};
        if (close && last_req < s && !litb_add(&l, close, strlen(close), -1))
            st = MT_E_NOMEM;
        for (int k = s; k < np && st == MT_OK; k++) {
            if (!litb_add(&l, keys[k], klen[k], k))
                st = MT_E_NOMEM;
            if (required[k])
                break;
        }
        uint32_t id = st == MT_OK ? lit_node(c, &l) : 0;
        litb_free(&l);
        if (!id)
            st = MT_E_NOMEM;
        else
            g->slots[p0 + (uint32_t)s] = id - 1;
    }
    uint32_t id = st == MT_OK ? node_new(c, kind) : 0;
    if (st == MT_OK && !id)
        st = MT_E_NOMEM;
    if (st == MT_OK) {
        gnode *nd = &g->nodes[id - 1];
        nd->p0 = p0;
        nd->np = (uint32_t)np;
        nd->last_req = last_req;
        set_first(nd, first);
        *out = id - 1;
    }
    for (int k = 0; k < np; k++)
        if (keys)
            free(keys[k]);
    free(keys);
    free(klen);
    free(vals);
    free(required);
    return st;
}

static mt_status compile_object(cc *c, const cJSON *sch, int nest, uint32_t *out)
{
    serve_grammar *g = c->g;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(sch, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(sch, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(sch, "additionalProperties");
    if (props && !cJSON_IsObject(props))
        return refuse(c, "'%s': properties must be an object%s", "");
    if (req && !cJSON_IsArray(req))
        return refuse(c, "'%s': required must be a list of names%s", "");
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl))
        return refuse(c, "'%s': additionalProperties must be a boolean or a schema%s", "");
    int np = props ? cJSON_GetArraySize(props) : 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, req)
    {
        if (!cJSON_IsString(x))
            return refuse(c, "'%s': required must be a list of names%s", "");
        if (!props || !cJSON_GetObjectItemCaseSensitive(props, x->valuestring))
            return refuse(c, "'%s': required property '%s' is not in properties (it could never "
                             "be written)",
                          x->valuestring);
    }
    if (np == 0) {
        if (cJSON_IsFalse(addl)) { /* only {} */
            *out = lit_one(c, "{}", 0);
            return *out ? ((*out)--, MT_OK) : MT_E_NOMEM;
        }
        uint32_t value = g->any;
        if (cJSON_IsObject(addl)) {
            size_t at = path_push(c, ".%s", "additionalProperties");
            MT_CHECK(compile_value(c, addl, nest + 1, &value));
            c->path[at] = 0;
        }
        *out = map_node(c, g->str_any, value);
        return *out ? ((*out)--, MT_OK) : MT_E_NOMEM;
    }
    if (np > MAX_PROPERTIES)
        return refuse(c, "'%s' has more than 256 properties%s", "");
    uint32_t *vals = calloc((size_t)np, sizeof *vals);
    char **keys = calloc((size_t)np, sizeof *keys);
    size_t *klen = calloc((size_t)np, sizeof *klen);
    bool *required = calloc((size_t)np, sizeof *required);
    mt_status st = vals && keys && klen && required ? MT_OK : MT_E_NOMEM;
    int i = 0;
    cJSON_ArrayForEach(x, props)
    {
        if (st != MT_OK)
            break;
        size_t at = path_push(c, ".properties.%s", x->string);
        st = compile_value(c, x, nest + 1, &vals[i]);
        c->path[at] = 0;
        serve_buf kb = SERVE_BUF_INIT;
        if (st == MT_OK && (json_str(&kb, x->string, strlen(x->string)) != MT_OK ||
                            serve_buf_puts(&kb, ":") != MT_OK))
            st = MT_E_NOMEM;
        klen[i] = kb.len;
        keys[i] = serve_buf_detach(&kb, NULL);
        required[i] = false;
        const cJSON *r;
        cJSON_ArrayForEach(r, req) required[i] |= !strcmp(r->valuestring, x->string);
        i++;
    }
    return props_node(c, st, np, keys, klen, vals, required, NULL, K_OBJ, '{', out);
}

static mt_status compile_type(cc *c, const cJSON *sch, int type, int nest, uint32_t *out)
{
    switch (type) {
    case T_STRING: {
        uint32_t min, max;
        MT_CHECK(count_kw(c, sch, "minLength", 0, &min));
        MT_CHECK(count_kw(c, sch, "maxLength", NO_LIMIT, &max));
        if (min > max)
            return refuse(c, "'%s': minLength is above maxLength%s", "");
        *out = str_node(c, K_STR, min, max);
        break;
    }
    case T_NUMBER:
    case T_INTEGER:
        *out = num_node(c, type == T_INTEGER);
        break;
    case T_BOOLEAN:
        *out = c->g->lit_bool + 1;
        break;
    case T_NULL:
        *out = c->g->lit_null + 1;
        break;
    case T_ARRAY: {
        uint32_t min, max, item = c->g->any;
        MT_CHECK(count_kw(c, sch, "minItems", 0, &min));
        MT_CHECK(count_kw(c, sch, "maxItems", NO_LIMIT, &max));
        if (min > max)
            return refuse(c, "'%s': minItems is above maxItems%s", "");
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(sch, "items");
        if (items && !cJSON_IsTrue(items)) {
            size_t at = path_push(c, ".%s", "items");
            MT_CHECK(compile_value(c, items, nest + 1, &item));
            c->path[at] = 0;
        }
        *out = arr_node(c, item, min, max);
        break;
    }
    default:
        return compile_object(c, sch, nest, out);
    }
    if (!*out)
        return MT_E_NOMEM;
    (*out)--;
    return MT_OK;
}

static uint32_t union_node(cc *c, const uint32_t *alts, uint32_t n)
{
    uint32_t k0 = kids_add(c, alts, n);
    uint32_t id = k0 ? node_new(c, K_UNION) : 0;
    if (!id)
        return 0;
    gnode *nd = &c->g->nodes[id - 1];
    nd->k0 = k0 - 1;
    nd->nk = n;
    for (uint32_t k = 0; k < n; k++)
        for (int w = 0; w < 32; w++)
            nd->first[w] |= c->g->nodes[alts[k]].first[w];
    return id;
}

/* A union of alts, refused when two of them may start with the same byte
 * (the automaton picks the member by its first byte). */
static mt_status make_union(cc *c, const uint32_t *alts, uint32_t n, const char *kw, uint32_t *out)
{
    if (n == 1) {
        *out = alts[0];
        return MT_OK;
    }
    for (uint32_t a = 0; a < n; a++)
        for (uint32_t b = a + 1; b < n; b++)
            for (int w = 0; w < 32; w++)
                if (c->g->nodes[alts[a]].first[w] & c->g->nodes[alts[b]].first[w])
                    return refuse(c, "'%s': %s members that can start with the same character "
                                     "are not supported (e.g. two objects)",
                                  kw);
    uint32_t id = union_node(c, alts, n);
    if (!id)
        return MT_E_NOMEM;
    *out = id - 1;
    return MT_OK;
}

static mt_status compile_value(cc *c, const cJSON *sch, int nest, uint32_t *out)
{
    if (nest > SERVE_GRAMMAR_MAX_NESTING)
        return refuse(c, "'%s' nests deeper than the %s levels structured outputs support",
                      "24");
    if (cJSON_IsTrue(sch)) {
        *out = c->g->any;
        return MT_OK;
    }
    if (cJSON_IsFalse(sch))
        return refuse(c, "'%s' is the schema false, which nothing satisfies%s", "");
    if (!cJSON_IsObject(sch))
        return refuse(c, "'%s' must be a JSON schema object%s", "");
    const cJSON *k;
    cJSON_ArrayForEach(k, sch)
    {
        if (in_list(supported_kw, k->string) || in_list(annotation_kw, k->string))
            continue;
        return refuse(c, "'%s': the keyword '%s' is not supported by structured outputs "
                         "(supported: type, properties, required, additionalProperties, items, "
                         "enum, const, minLength, maxLength, minItems, maxItems, anyOf)",
                      k->string);
    }
    int types;
    MT_CHECK(schema_types(c, sch, &types));
    if (cJSON_GetObjectItemCaseSensitive(sch, "enum") ||
        cJSON_GetObjectItemCaseSensitive(sch, "const"))
        return compile_enum(c, sch, types, out);
    const cJSON *any_of = cJSON_GetObjectItemCaseSensitive(sch, "anyOf");
    if (any_of) {
        if (!cJSON_IsArray(any_of) || !any_of->child)
            return refuse(c, "'%s': anyOf must be a non-empty list of schemas%s", "");
        if (types)
            return refuse(c, "'%s': anyOf next to %s keywords is not supported", "type");
        uint32_t alts[16], n = 0;
        const cJSON *m;
        cJSON_ArrayForEach(m, any_of)
        {
            if (n == 16)
                return refuse(c, "'%s': anyOf has more than %s members", "16");
            size_t at = path_push_i(c, ".anyOf[%d]", (int)n);
            MT_CHECK(compile_value(c, m, nest + 1, &alts[n]));
            c->path[at] = 0;
            n++;
        }
        return make_union(c, alts, n, "anyOf", out);
    }
    if (!types) {
        *out = c->g->any;
        return MT_OK;
    }
    uint32_t alts[7], n = 0;
    for (int b = 1; b <= T_ARRAY; b <<= 1)
        if (types & b)
            MT_CHECK(compile_type(c, sch, b, nest, &alts[n++]));
    return make_union(c, alts, n, "type", out);
}

/* ---- tool calls --------------------------------------------------------------------- */

/* Whether glmout reads the raw text back as exactly the value v under the
 * property's schema (a string stays a string unless the type converts it). */
static bool reads_back(const cJSON *sch, const char *raw, size_t n, const cJSON *v)
{
    serve_buf b = SERVE_BUF_INIT;
    bool ok = false;
    if (serve_glmout_arg_json(sch, raw, n, &b) == MT_OK && b.data) {
        cJSON *j = cJSON_Parse(b.data);
        ok = j && cJSON_Compare(j, v, true);
        cJSON_Delete(j);
    }
    serve_buf_release(&b);
    return ok;
}

/* A tool argument's value, up to and including "</arg_value>": a string
 * type (or no type) is raw text, any other type compact JSON. */
static mt_status compile_arg(cc *c, const cJSON *sch, uint32_t *out)
{
    if (cJSON_IsTrue(sch) || (cJSON_IsObject(sch) && !sch->child)) {
        *out = str_node(c, K_RAW, 0, NO_LIMIT);
        return *out ? ((*out)--, MT_OK) : MT_E_NOMEM;
    }
    uint32_t value;
    MT_CHECK(compile_value(c, sch, 1, &value)); /* checks the keywords */
    int types;
    MT_CHECK(schema_types(c, sch, &types));
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(sch, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(sch, "const");
    if (en || cn) { /* raw forms, each checked to read back as its value */
        litb l = {0};
        serve_buf b = SERVE_BUF_INIT;
        mt_status st = MT_OK;
        const cJSON *v = cn ? cn : en->child;
        for (; v && st == MT_OK; v = cn ? NULL : v->next) {
            if (types && !(value_type(v) & types))
                continue;
            serve_buf_reset(&b);
            if ((cJSON_IsString(v) ? serve_buf_puts(&b, v->valuestring) : json_text(&b, v)) !=
                MT_OK) {
                st = MT_E_NOMEM;
                break;
            }
            if (strstr(b.data ? b.data : "", "</"))
                continue; /* its text would end the value early */
            if (!reads_back(sch, b.data ? b.data : "", b.len, v))
                continue; /* the type would convert it to something else */
            if (serve_buf_puts(&b, ARG_END) != MT_OK || !litb_add(&l, b.data, b.len, 0))
                st = MT_E_NOMEM;
        }
        if (st == MT_OK && l.n == 0)
            st = refuse(c, "'%s': no enum/const value of this tool argument can be written so "
                           "that it reads back as itself (give the property a type)%s",
                        "");
        uint32_t id = st == MT_OK ? lit_node(c, &l) : 0;
        serve_buf_release(&b);
        litb_free(&l);
        if (st == MT_OK && !id)
            st = MT_E_NOMEM;
        *out = id - 1;
        return st;
    }
    if (!types || (types & T_STRING)) { /* raw text (a typed union reads back as one member) */
        uint32_t min = 0, max = NO_LIMIT;
        if (types & T_STRING) {
            MT_CHECK(count_kw(c, sch, "minLength", 0, &min));
            MT_CHECK(count_kw(c, sch, "maxLength", NO_LIMIT, &max));
        }
        *out = str_node(c, K_RAW, min, max);
        return *out ? ((*out)--, MT_OK) : MT_E_NOMEM;
    }
    uint32_t end = lit_one(c, ARG_END, 0);
    if (!end)
        return MT_E_NOMEM;
    uint32_t parts[2] = {value, end - 1};
    *out = seq_node(c, parts, 2);
    return *out ? ((*out)--, MT_OK) : MT_E_NOMEM;
}

/* One tool's arguments: slot s offers "</tool_call>" when no required
 * argument is left, and the keys s.. up to the first required one. */
static mt_status compile_args(cc *c, const cJSON *params, uint32_t *out)
{
    const cJSON *props = NULL, *req = NULL;
    if (params && !cJSON_IsNull(params)) {
        if (!cJSON_IsObject(params))
            return refuse(c, "'%s' must be a JSON schema object%s", "");
        const cJSON *k;
        cJSON_ArrayForEach(k, params)
        {
            if (!in_list(supported_kw, k->string) && !in_list(annotation_kw, k->string))
                return refuse(c, "'%s': the keyword '%s' is not supported by structured "
                                 "outputs",
                              k->string);
        }
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(params, "type");
        if (t && !(cJSON_IsString(t) && !strcmp(t->valuestring, "object")))
            return refuse(c, "'%s': a tool's parameters must be of type %s", "object");
        props = cJSON_GetObjectItemCaseSensitive(params, "properties");
        req = cJSON_GetObjectItemCaseSensitive(params, "required");
        if (props && !cJSON_IsObject(props))
            return refuse(c, "'%s': properties must be an object%s", "");
        if (req && !cJSON_IsArray(req))
            return refuse(c, "'%s': required must be a list of names%s", "");
        const cJSON *r;
        cJSON_ArrayForEach(r, req)
        {
            if (!cJSON_IsString(r) || !props ||
                !cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
                return refuse(c, "'%s': required argument '%s' is not in properties",
                              cJSON_IsString(r) ? r->valuestring : "?");
        }
    }
    int np = props ? cJSON_GetArraySize(props) : 0;
    if (np > MAX_PROPERTIES)
        return refuse(c, "'%s' has more than 256 properties%s", "");
    uint32_t *vals = calloc((size_t)np + 1, sizeof *vals);
    bool *required = calloc((size_t)np + 1, sizeof *required);
    char **keys = calloc((size_t)np + 1, sizeof *keys);
    size_t *klen = calloc((size_t)np + 1, sizeof *klen);
    mt_status st = vals && required && keys && klen ? MT_OK : MT_E_NOMEM;
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, props)
    {
        if (st != MT_OK)
            break;
        size_t at = path_push(c, ".properties.%s", x->string);
        if (strchr(x->string, '<'))
            st = refuse(c, "'%s': an argument name with '%s' cannot be written in GLM's "
                           "tool-call format",
                        "<");
        if (st == MT_OK)
            st = compile_arg(c, x, &vals[i]);
        c->path[at] = 0;
        serve_buf kb = SERVE_BUF_INIT;
        if (st == MT_OK && serve_buf_printf(&kb, "<arg_key>%s</arg_key><arg_value>", x->string))
            st = MT_E_NOMEM;
        klen[i] = kb.len;
        keys[i] = serve_buf_detach(&kb, NULL);
        const cJSON *r;
        cJSON_ArrayForEach(r, req) required[i] |= !strcmp(r->valuestring, x->string);
        i++;
    }
    return props_node(c, st, np, keys, klen, vals, required, "</tool_call>", K_ARGS, '<', out);
}

static mt_status compile_calls(cc *c, const serve_grammar_opts *o, uint32_t *out)
{
    uint32_t *args = calloc((size_t)o->n_tools, sizeof *args);
    litb names = {0};
    mt_status st = args ? MT_OK : MT_E_NOMEM;
    for (int t = 0; t < o->n_tools && st == MT_OK; t++) {
        if (o->tool_params && o->tool_params[t])
            snprintf(c->path, sizeof c->path, "%s", o->tool_params[t]);
        else
            snprintf(c->path, sizeof c->path, "tools[%d].function.parameters", t);
        const char *nm = o->tools[t].name ? o->tools[t].name : "";
        size_t nl = strlen(nm);
        if (!nl || strpbrk(nm, "<\n\r\t") || nm[0] == ' ' || nm[nl - 1] == ' ') {
            snprintf(c->path, sizeof c->path, "tools[%d].function.name", t);
            st = refuse(c, "'%s': a tool name with '<', a line break, a tab or outer spaces "
                           "cannot be called in GLM's format%s",
                        "");
            break;
        }
        st = compile_args(c, o->tools[t].parameters, &args[t]);
        serve_buf b = SERVE_BUF_INIT;
        if (st == MT_OK && (serve_buf_printf(&b, "<tool_call>%s", nm) != MT_OK ||
                            !litb_add(&names, b.data, b.len, t)))
            st = MT_E_NOMEM;
        serve_buf_release(&b);
    }
    uint32_t lit = st == MT_OK ? lit_node(c, &names) : 0;
    uint32_t k0 = lit ? kids_add(c, args, (uint32_t)o->n_tools) : 0;
    uint32_t id = k0 ? node_new(c, K_CALLS) : 0;
    if (st == MT_OK && !id)
        st = MT_E_NOMEM;
    if (st == MT_OK) {
        gnode *nd = &c->g->nodes[id - 1];
        nd->key = lit - 1;
        nd->k0 = k0 - 1;
        nd->nk = (uint32_t)o->n_tools;
        nd->parallel = o->parallel;
        set_first(nd, '<');
        *out = id - 1;
    }
    litb_free(&names);
    free(args);
    return st;
}

mt_status serve_grammar_compile(const serve_grammar_opts *o, serve_grammar **out, serve_error *e)
{
    *out = NULL;
    cc c = {.e = e};
    c.g = calloc(1, sizeof *c.g);
    if (!c.g)
        return serve_reject(e, 500, NULL, NULL, "out of memory compiling a grammar");
    atomic_init(&c.g->refs, 1);
    snprintf(c.path, sizeof c.path, "%s", o->param ? o->param : "response_format");
    mt_status st = any_nodes(&c) ? MT_OK : MT_E_NOMEM;
    uint32_t body = 0;
    if (st == MT_OK) {
        if (o->n_tools > 0)
            st = compile_calls(&c, o, &body);
        else if (o->schema)
            st = compile_value(&c, o->schema, 0, &body);
        else
            body = c.g->map_any; /* json_object */
    }
    if (st == MT_OK) {
        uint32_t parts[2], n = 0;
        if (o->prefix && *o->prefix) {
            uint32_t p = lit_one(&c, o->prefix, 0);
            if (!p)
                st = MT_E_NOMEM;
            parts[n++] = p - 1;
        }
        parts[n++] = body;
        uint32_t root = st == MT_OK ? seq_node(&c, parts, n) : 0;
        if (st == MT_OK && !root)
            st = MT_E_NOMEM;
        c.g->root = root - 1;
    }
    if (st == MT_OK && c.oom)
        st = MT_E_NOMEM;
    if (st == MT_E_NOMEM)
        st = c.too_big ? serve_reject(e, 400, c.path, "unsupported_schema",
                                      "'%s' is too large for structured outputs", c.path)
                       : serve_reject(e, 500, c.path, NULL, "out of memory compiling '%s'",
                                      c.path);
    if (st != MT_OK) {
        serve_grammar_release(c.g);
        return st;
    }
    *out = c.g;
    return MT_OK;
}

serve_grammar *serve_grammar_ref(serve_grammar *g)
{
    if (g)
        atomic_fetch_add(&g->refs, 1);
    return g;
}

void serve_grammar_release(serve_grammar *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    free(g->nodes);
    free(g->ents);
    free(g->pool);
    free(g->kids);
    free(g->props);
    free(g->slots);
    free(g);
}
