/* A tile-external backend in C99 with the C standard library only: an evaluator of Stripe text.
 *
 * It speaks the protocol of docs/external_protocol.md on stdin/stdout (a JSON header line, then
 * the raw little-endian bytes of the arrays it lists), announces the `stripe` stage, and runs each
 * program as docs/stripe.md specifies, for a subset: buffers of bool, int32, int64, float32 and
 * float64; loads, stores (every aggregation), load_index, constants, nested blocks, constraints,
 * local allocations, the arithmetic/comparison/select/conversion intrinsics, and the fill specials
 * (zero, agg_init_*). Anything else is answered with a `failed` error reply naming it.
 *
 *   cc -std=c99 -O2 -o stripe_backend stripe_backend.c -lm
 *   python -m tile emit f.tile --stage stripe ...      # what it is sent
 *   tile.compile(src, "external:./stripe_backend")     # what drives it
 *
 * The JSON reader/writer below handles exactly what the protocol needs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- errors and memory */
static jmp_buf on_fail;
static char fail_msg[400];
static void **allocs;
static size_t n_allocs, cap_allocs;

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fail_msg, sizeof fail_msg, fmt, ap);
    va_end(ap);
    longjmp(on_fail, 1);
}

static void *alloc(size_t n) { /* zeroed; freed all at once after each request */
    void *p = calloc(1, n ? n : 1);
    if (!p) fail("out of memory");
    if (n_allocs == cap_allocs) {
        cap_allocs = cap_allocs ? 2 * cap_allocs : 64;
        void **grown = realloc(allocs, cap_allocs * sizeof *allocs);
        if (!grown) { free(p); fail("out of memory"); }
        allocs = grown;
    }
    return allocs[n_allocs++] = p;
}

static void free_all(void) {
    while (n_allocs) free(allocs[--n_allocs]);
}

/* ---------------------------------------------------------------- JSON */
typedef struct Json {
    char type; /* o(bject) a(rray) s(tring) n(umber) b(ool) z(null) */
    double num;
    char *str;
    int n;
    char **keys;
    struct Json **items;
} Json;

static const char *jp;

static void jws(void) { while (*jp == ' ' || *jp == '\t' || *jp == '\r' || *jp == '\n') jp++; }

static void put_utf8(char **o, unsigned c) {
    if (c < 0x80) *(*o)++ = (char)c;
    else if (c < 0x800) { *(*o)++ = (char)(0xC0 | c >> 6); *(*o)++ = (char)(0x80 | (c & 63)); }
    else if (c < 0x10000) {
        *(*o)++ = (char)(0xE0 | c >> 12); *(*o)++ = (char)(0x80 | (c >> 6 & 63));
        *(*o)++ = (char)(0x80 | (c & 63));
    } else {
        *(*o)++ = (char)(0xF0 | c >> 18); *(*o)++ = (char)(0x80 | (c >> 12 & 63));
        *(*o)++ = (char)(0x80 | (c >> 6 & 63)); *(*o)++ = (char)(0x80 | (c & 63));
    }
}

static unsigned hex4(void) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++, jp++) {
        char c = *jp;
        if (c >= '0' && c <= '9') v = v * 16 + (unsigned)(c - '0');
        else if ((c | 32) >= 'a' && (c | 32) <= 'f') v = v * 16 + (unsigned)((c | 32) - 'a' + 10);
        else fail("bad \\u escape in a JSON string");
    }
    return v;
}

static char *json_string(void) { /* jp is at the opening quote */
    char *out = alloc(strlen(jp) + 1), *o = out;
    for (jp++; *jp != '"'; jp++) {
        if (!*jp) fail("unterminated JSON string");
        if (*jp != '\\') { *o++ = *jp; continue; }
        jp++;
        switch (*jp) {
        case 'n': *o++ = '\n'; break;
        case 't': *o++ = '\t'; break;
        case 'r': *o++ = '\r'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'u': {
            jp++;
            unsigned c = hex4();
            if (c >= 0xD800 && c < 0xDC00 && jp[0] == '\\' && jp[1] == 'u') {
                jp += 2;
                c = 0x10000 + ((c - 0xD800) << 10) + (hex4() - 0xDC00);
            }
            put_utf8(&o, c);
            jp--;
            break;
        }
        default: *o++ = *jp; /* \" \\ \/ */
        }
    }
    jp++;
    *o = 0;
    return out;
}

static Json *json_value(void) {
    Json *v = alloc(sizeof *v);
    jws();
    if (*jp == '{' || *jp == '[') {
        char close = *jp == '{' ? '}' : ']';
        v->type = *jp == '{' ? 'o' : 'a';
        jp++;
        int cap = 0;
        for (jws(); *jp != close; jws()) {
            if (v->n) { if (*jp != ',') fail("expected ',' in JSON"); jp++; jws(); }
            if (v->n == cap) {
                cap = cap ? 2 * cap : 8;
                Json **items = alloc(cap * sizeof *items);
                char **keys = alloc(cap * sizeof *keys);
                if (v->n) { memcpy(items, v->items, v->n * sizeof *items); memcpy(keys, v->keys, v->n * sizeof *keys); }
                v->items = items, v->keys = keys;
            }
            if (v->type == 'o') {
                if (*jp != '"') fail("expected a key in a JSON object");
                v->keys[v->n] = json_string();
                jws();
                if (*jp++ != ':') fail("expected ':' in a JSON object");
            }
            v->items[v->n++] = json_value();
        }
        jp++;
    } else if (*jp == '"') {
        v->type = 's', v->str = json_string();
    } else if (!strncmp(jp, "true", 4) || !strncmp(jp, "false", 5)) {
        v->type = 'b', v->num = *jp == 't', jp += *jp == 't' ? 4 : 5;
    } else if (!strncmp(jp, "null", 4)) {
        v->type = 'z', jp += 4;
    } else {
        char *end;
        v->type = 'n', v->num = strtod(jp, &end);
        if (end == jp) fail("bad JSON value");
        jp = end;
    }
    return v;
}

static Json *get(const Json *o, const char *key, char type) { /* a required field */
    for (int k = 0; o && o->type == 'o' && k < o->n; k++)
        if (!strcmp(o->keys[k], key)) {
            if (o->items[k]->type != type) fail("field '%s' has the wrong JSON type", key);
            return o->items[k];
        }
    fail("missing field '%s'", key);
    return NULL;
}

static void put_string(const char *s) { /* a JSON string on stdout */
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

/* ---------------------------------------------------------------- dtypes and values */
enum { BOOL, I32, I64, F32, F64, NDT };
static const char *STRIPE_NAME[NDT] = {"bool", "i32", "i64", "fp32", "fp64"};
static const char *WIRE_NAME[NDT] = {"bool", "int32", "int64", "float32", "float64"};
static const int BYTES[NDT] = {1, 4, 8, 4, 8};
static const int BITS[NDT] = {1, 32, 64, 32, 64};
#define IS_FLOAT(dt) ((dt) >= F32)

typedef struct { int dt; int64_t i; double f; } Val; /* f for floats, i otherwise */

static int64_t wrap(int64_t x, int dt) {
    return dt == BOOL ? x != 0 : dt == I32 ? (int32_t)(uint32_t)(uint64_t)x : x;
}

static Val convert(Val v, int dt) { /* docs/semantics.md §5.4 */
    Val r = {dt, 0, 0};
    if (IS_FLOAT(dt)) {
        double f = IS_FLOAT(v.dt) ? v.f : (double)v.i;
        r.f = dt == F32 ? (IS_FLOAT(v.dt) ? (double)(float)v.f : (double)(float)v.i) : f;
    } else if (dt == BOOL) {
        r.i = IS_FLOAT(v.dt) ? v.f != 0 : v.i != 0;
    } else if (IS_FLOAT(v.dt)) { /* truncate toward zero, wrap modulo 2^64; nan and inf give 0 */
        double m = isfinite(v.f) ? fmod(trunc(v.f), 18446744073709551616.0) : 0;
        if (m >= 9223372036854775808.0) m -= 18446744073709551616.0;
        if (m < -9223372036854775808.0) m += 18446744073709551616.0;
        r.i = wrap((int64_t)m, dt);
    } else {
        r.i = wrap(v.i, dt);
    }
    return r;
}

static int promote(int a, int b) { /* docs/semantics.md §4.1, for these dtypes */
    if (IS_FLOAT(a) != IS_FLOAT(b)) return IS_FLOAT(a) ? a : b;
    return BITS[b] > BITS[a] ? b : a;
}

static int is_nan(Val v) { return IS_FLOAT(v.dt) && v.f != v.f; }

static int greater(Val a, Val b) { return IS_FLOAT(a.dt) ? a.f > b.f : a.i > b.i; }

/* One intrinsic on already-typed scalars; the result has dtype dt. */
static Val intrinsic(const char *op, const Val *a, int n, int dt) {
    if (!strcmp(op, "assign") || !strcmp(op, "ident") || !strncmp(op, "as_", 3)) return convert(a[0], dt);
    if (!strncmp(op, "cmp_", 4)) {
        int common = promote(a[0].dt, a[1].dt);
        Val x = convert(a[0], common), y = convert(a[1], common);
        double p = IS_FLOAT(common) ? x.f : 0, q = IS_FLOAT(common) ? y.f : 0;
        int64_t s = x.i, t = y.i, c;
        const char *k = op + 4;
        if (!strcmp(k, "eq")) c = IS_FLOAT(common) ? p == q : s == t;
        else if (!strcmp(k, "ne")) c = IS_FLOAT(common) ? p != q : s != t;
        else if (!strcmp(k, "lt")) c = IS_FLOAT(common) ? p < q : s < t;
        else if (!strcmp(k, "gt")) c = IS_FLOAT(common) ? p > q : s > t;
        else if (!strcmp(k, "le")) c = IS_FLOAT(common) ? p <= q : s <= t;
        else if (!strcmp(k, "ge")) c = IS_FLOAT(common) ? p >= q : s >= t;
        else fail("intrinsic '%s' is not one this sample knows", op);
        Val r = {BOOL, c, 0};
        return convert(r, dt);
    }
    if (!strcmp(op, "cond")) return convert(a[0], BOOL).i ? convert(a[1], dt) : convert(a[2], dt);
    Val x = convert(a[0], dt), y = n > 1 ? convert(a[1], dt) : x, r = {dt, 0, 0};
    if (!strcmp(op, "max") || !strcmp(op, "min")) { /* nan propagates; of equal values the second */
        if (is_nan(x)) return x;
        if (is_nan(y)) return y;
        return (op[1] == 'a' ? greater(x, y) : greater(y, x)) ? x : y;
    }
    if (IS_FLOAT(dt)) {
        if (!strcmp(op, "add")) r.f = x.f + y.f;
        else if (!strcmp(op, "sub")) r.f = x.f - y.f;
        else if (!strcmp(op, "mul")) r.f = x.f * y.f;
        else if (!strcmp(op, "div")) r.f = x.f / y.f;
        else if (!strcmp(op, "mod")) r.f = fmod(x.f, y.f);
        else if (!strcmp(op, "neg")) r.f = -x.f;
        else if (!strcmp(op, "abs")) r.f = fabs(x.f);
        else if (!strcmp(op, "relu")) r.f = x.f < 0 ? 0 : x.f;
        else fail("intrinsic '%s' on %s is not one this sample knows", op, STRIPE_NAME[dt]);
        return convert(r, dt); /* exact in double, then rounded once to float32 */
    }
    uint64_t u = (uint64_t)x.i, v = (uint64_t)y.i; /* integers wrap */
    if (!strcmp(op, "add")) r.i = (int64_t)(u + v);
    else if (!strcmp(op, "sub")) r.i = (int64_t)(u - v);
    else if (!strcmp(op, "mul")) r.i = (int64_t)(u * v);
    else if (!strcmp(op, "neg")) r.i = (int64_t)(0 - u);
    else if (!strcmp(op, "div")) r.i = y.i == 0 ? 0 : y.i == -1 ? (int64_t)(0 - u) : x.i / y.i;
    else if (!strcmp(op, "mod")) r.i = y.i == 0 || y.i == -1 ? 0 : x.i % y.i;
    else if (!strcmp(op, "abs")) r.i = x.i < 0 ? (int64_t)(0 - u) : x.i;
    else if (!strcmp(op, "relu")) r.i = x.i < 0 ? 0 : x.i;
    else fail("intrinsic '%s' on %s is not one this sample knows", op, STRIPE_NAME[dt]);
    r.i = wrap(r.i, dt);
    return r;
}

/* ---------------------------------------------------------------- the Stripe IR (a subset) */
#define MAXN 16 /* indexes, constraints, dims, affine terms, arguments: at most this many each */
#define MAXR 64 /* refinements of one block */
enum { AG_NONE, AG_ASSIGN, AG_ADD, AG_MUL, AG_MAX, AG_MIN };
static const char *AGG_NAME[] = {"", "assign", "add", "mul", "max", "min"};
enum { LOAD, STORE, LOAD_INDEX, CONSTANT, INTRINSIC, SPECIAL, BLOCK };

typedef struct { int64_t c; int n; int var[MAXN]; int64_t k[MAXN]; } Aff;
typedef struct { char name[64]; int64_t range; int has_aff; Aff aff; } Idx;
typedef struct {
    char into[64];
    int dir_none, parent, is_input, is_output; /* parent: its index in the enclosing block, -1: none */
    int nd, agg, dt;
    Aff access[MAXN];
    int64_t size[MAXN], stride[MAXN];
} Ref;
typedef struct Block Block;
typedef struct {
    int kind, ref, out, dt, nin, in[MAXN], nparam;
    char name[64];
    Aff aff;
    Val value;
    Block *block;
} Stmt;
struct Block {
    Block *parent;
    int nidx, ncons, nref, nstmt, nscalar;
    Idx idx[MAXN];
    Aff cons[MAXN];
    Ref ref[MAXR];
    Stmt *stmt;
    char (*scalar)[64];
};

/* ---------------------------------------------------------------- the Stripe text (docs/stripe.md) */
static const char *sp, *text_start;

static void skip(void) {
    for (;;) {
        while (*sp == ' ' || *sp == '\t' || *sp == '\r' || *sp == '\n') sp++;
        if (sp[0] != '/' || sp[1] != '/') return;
        while (*sp && *sp != '\n') sp++;
    }
}

static void syntax(const char *what) {
    int line = 1;
    for (const char *p = text_start; p < sp; p++) line += *p == '\n';
    fail("Stripe text line %d: expected %s near '%.20s'", line, what, sp);
}

static int accept(const char *op) {
    skip();
    size_t n = strlen(op);
    if (strncmp(sp, op, n)) return 0;
    sp += n;
    return 1;
}

static void expect(const char *op) { if (!accept(op)) syntax(op); }

static int is_name_char(char c, int first) {
    return c == '_' || c == '$' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (!first && ((c >= '0' && c <= '9') || c == '\''));
}

static int peek_name(char *out) { /* a plain or `quoted` name (no escapes), without consuming it */
    skip();
    const char *p = sp;
    size_t n = 0;
    if (*p == '`') {
        for (p++; *p && *p != '`' && *p != '\\' && n < 63; p++) out[n++] = *p;
        if (*p != '`') return 0;
        p++;
    } else {
        for (; is_name_char(*p, p == sp) && n < 63; p++) out[n++] = *p;
    }
    out[n] = 0;
    return (int)(p - sp);
}

static void name(char *out) {
    int len = peek_name(out);
    if (!len) syntax("a name");
    sp += len;
}

static int at_word(const char *word) { /* the bare word `word` is next (not consumed) */
    char buf[64];
    int len = peek_name(buf);
    return len && sp[0] != '`' && !strcmp(buf, word);
}

static int keyword(const char *word) { /* the bare word `word` is next: consume it */
    if (!at_word(word)) return 0;
    sp += strlen(word);
    return 1;
}

static int64_t integer(void) {
    int neg = accept("-");
    skip();
    if (*sp < '0' || *sp > '9') syntax("an integer");
    int64_t v = strtoll(sp, (char **)&sp, 10);
    return neg ? -v : v;
}

static int dtype(void) {
    char buf[64];
    name(buf);
    for (int d = 0; d < NDT; d++)
        if (!strcmp(buf, STRIPE_NAME[d])) return d;
    fail("this sample has no element type '%s' (it takes bool, i32, i64, fp32, fp64)", buf);
    return -1;
}

static int lookup(char names[][64], int n, const char *nm, const char *what) {
    for (int k = 0; k < n; k++)
        if (!strcmp(names[k], nm)) return k;
    fail("unknown %s '%s'", what, nm);
    return -1;
}

static int index_slot(const Block *b, const char *nm) {
    for (int k = 0; b && k < b->nidx; k++)
        if (!strcmp(b->idx[k].name, nm)) return k;
    fail("'%s' is not an index of its block", nm);
    return -1;
}

static Aff affine(const Block *names) { /* ['-'] term {('+'|'-') term}; term := INT ['*' name] | name */
    Aff a = {0};
    int64_t sign = accept("-") ? -1 : 1;
    for (;;) {
        char nm[64];
        int64_t coeff = 1;
        skip();
        if (*sp >= '0' && *sp <= '9') {
            coeff = integer();
            if (accept("/")) fail("fractional affines are not Stripe after lowering");
            if (!accept("*")) { a.c += sign * coeff; goto next; }
        }
        name(nm);
        if (a.n == MAXN) fail("too many terms");
        a.var[a.n] = index_slot(names, nm), a.k[a.n++] = sign * coeff;
    next:
        if (accept("+")) sign = 1;
        else if (accept("-")) sign = -1;
        else return a;
    }
}

static int64_t eval_affine(const Aff *a, const int64_t *env) {
    int64_t v = a->c;
    for (int k = 0; k < a->n; k++) v += a->k[k] * env[a->var[k]];
    return v;
}

static void skip_location(void) { if (accept("<")) { while (*sp && *sp != '>') sp++; expect(">"); } }

static void skip_value(void) { /* an attribute's value, a plan's body: balanced, strings skipped */
    int depth = 0;
    skip();
    do {
        if (*sp == '"') { for (sp++; *sp && *sp != '"'; sp++) sp += *sp == '\\'; }
        depth += *sp == '(' || *sp == '[';
        depth -= *sp == ')' || *sp == ']';
        if (*sp) sp++;
    } while (*sp && (depth > 0 || (*sp != ',' && *sp != ')' && *sp != ' ' && *sp != '\n' && *sp != '#')));
}

static void parse_ref(Block *b) {
    if (b->nref == MAXR) fail("too many refinements");
    Ref *r = &b->ref[b->nref];
    char nm[64], from[64] = "";
    while (accept("#")) {
        name(nm);
        r->is_input |= !strcmp(nm, "input");
        r->is_output |= !strcmp(nm, "output");
    }
    r->dir_none = keyword("none");
    if (!r->dir_none && !keyword("inout") && !keyword("in") && !keyword("out")) syntax("none, in, out or inout");
    skip_location();
    keyword("const");
    if (accept("@0x")) while ((*sp >= '0' && *sp <= '9') || (*sp >= 'a' && *sp <= 'f')) sp++;
    name(r->into);
    if (accept("=")) name(from);
    expect("[");
    while (!accept("]")) {
        if (r->nd) expect(",");
        if (r->nd == MAXN) fail("too many dims");
        r->access[r->nd++] = affine(b);
    }
    r->agg = AG_NONE;
    if (accept(":")) {
        name(nm);
        while (r->agg < AG_MIN && strcmp(AGG_NAME[++r->agg], nm)) {}
        if (strcmp(AGG_NAME[r->agg], nm)) fail("unknown aggregation '%s'", nm);
    }
    r->dt = dtype();
    expect("(");
    for (int d = 0; d < r->nd; d++) {
        if (d) expect(",");
        r->size[d] = integer();
        expect(":");
        r->stride[d] = integer();
    }
    expect(")");
    const char *source = *from ? from : r->into;
    r->parent = -1;
    for (int k = 0; b->parent && k < b->parent->nref; k++)
        if (!strcmp(b->parent->ref[k].into, source)) r->parent = k;
    if (b->parent && r->parent < 0 && (*from || !r->dir_none))
        fail("refinement '%s' refines '%s', which the enclosing block does not have", r->into, source);
    if (r->parent >= 0 && b->parent->ref[r->parent].nd != r->nd) fail("refinement '%s': wrong rank", r->into);
    b->nref++;
}

static int ref_slot(const Block *b, const char *nm) {
    for (int k = 0; k < b->nref; k++)
        if (!strcmp(b->ref[k].into, nm)) return k;
    fail("'%s' is not a refinement of its block", nm);
    return -1;
}

static int arity(const char *op) {
    if (!strcmp(op, "cond")) return 3;
    const char *unary[] = {"assign", "ident", "as_float", "as_int", "as_bool", "neg", "abs", "relu"};
    for (size_t k = 0; k < sizeof unary / sizeof *unary; k++)
        if (!strcmp(op, unary[k])) return 1;
    return 2;
}

static int define(Block *b, const char *nm) {
    for (int k = 0; k < b->nscalar; k++)
        if (!strcmp(b->scalar[k], nm)) fail("scalar '%s' is assigned twice", nm);
    strcpy(b->scalar[b->nscalar], nm);
    return b->nscalar++;
}

static Block *parse_block(Block *parent);

static void parse_stmt(Block *b, Stmt *s) {
    char first[64], out[64], callee[64];
    skip();
    if (*sp == '#' || at_word("block")) {
        s->kind = BLOCK, s->block = parse_block(b);
        return;
    }
    name(first);
    int has_out = !accept("(");
    if (has_out) {
        strcpy(out, first);
        if (accept(",")) fail("a statement with several outputs is not in this sample");
        expect("=");
        if (accept("(")) { /* a constant: (DTYPE)number */
            s->kind = CONSTANT, s->dt = dtype();
            expect(")");
            skip();
            Val v = {I64, 0, 0};
            if (keyword("true")) v.i = 1;
            else if (!keyword("false")) {
                int neg = accept("-");
                skip();
                if (keyword("inf")) v.dt = F64, v.f = INFINITY;
                else if (keyword("nan")) v.dt = F64, v.f = NAN;
                else {
                    const char *p = sp;
                    while ((*p >= '0' && *p <= '9')) p++;
                    if (*p == '.' || *p == 'e' || *p == 'E') v.dt = F64, v.f = strtod(sp, (char **)&sp);
                    else v.i = strtoll(sp, (char **)&sp, 10);
                }
                if (neg) v.f = -v.f, v.i = -v.i;
            }
            s->value = convert(v, s->dt); /* a float constant stays a double (docs/stripe.md) */
            if (IS_FLOAT(s->dt)) s->value.f = IS_FLOAT(v.dt) ? v.f : (double)v.i;
            s->out = define(b, out);
            return;
        }
        name(callee);
        expect("(");
    } else {
        strcpy(callee, first);
    }
    if (has_out && (!strcmp(callee, "load") || !strcmp(callee, "store") || !strcmp(callee, "load_index"))) {
        char arg[64];
        s->kind = !strcmp(callee, "load_index") ? LOAD_INDEX : !strcmp(callee, "load") ? LOAD : STORE;
        if (s->kind == LOAD_INDEX) s->aff = affine(b);
        else name(arg);
        expect(")");
        if (s->kind == STORE) {
            s->ref = ref_slot(b, out);
            s->in[0] = lookup(b->scalar, b->nscalar, arg, "scalar");
            return;
        }
        if (s->kind == LOAD) s->ref = ref_slot(b, arg);
        s->out = define(b, out);
        return;
    }
    char args[MAXN][64];
    int nargs = 0;
    strcpy(s->name, callee);
    while (!accept(")")) { /* names, then int params (strings are not in this sample) */
        if (nargs + s->nparam) expect(",");
        skip();
        if (*sp == '-' || (*sp >= '0' && *sp <= '9')) { integer(); s->nparam++; continue; }
        if (nargs == MAXN) fail("too many arguments");
        name(args[nargs++]);
    }
    if (accept(":")) {
        s->kind = INTRINSIC, s->dt = dtype(), s->nin = nargs;
        if (!has_out || nargs != arity(callee)) fail("intrinsic '%s' takes %d input(s) and one output", callee, arity(callee));
        for (int k = 0; k < nargs; k++) s->in[k] = lookup(b->scalar, b->nscalar, args[k], "scalar");
        s->out = define(b, out);
        return;
    }
    s->kind = SPECIAL;
    if (strcmp(callee, "zero") && strncmp(callee, "agg_init_", 9))
        fail("special '%s' is not in this sample (it has zero and agg_init_*)", callee);
    if (!has_out || nargs) fail("special '%s' takes no inputs and one output", callee);
    s->ref = ref_slot(b, out);
    const char *op = callee[0] == 'z' ? "add" : callee + 9;
    for (s->dt = AG_ADD; s->dt <= AG_MIN && strcmp(AGG_NAME[s->dt], op); s->dt++) {}
    if (s->dt > AG_MIN) fail("unknown aggregation '%s'", op);
}

static Block *parse_block(Block *parent) {
    Block *b = alloc(sizeof *b);
    b->parent = parent;
    while (accept("#")) { char tag[64]; name(tag); if (accept("=")) skip_value(); }
    if (!keyword("block")) syntax("block");
    skip_location();
    expect("[");
    while (!accept("]")) {
        if (b->nidx) expect(",");
        if (b->nidx == MAXN) fail("too many indexes");
        Idx *x = &b->idx[b->nidx];
        name(x->name);
        expect(":");
        x->range = integer();
        if ((x->has_aff = accept("="))) x->aff = affine(parent);
        b->nidx++;
    }
    expect("(");
    while (!accept(")")) {
        skip();
        if (*sp == '#' || at_word("none") || at_word("inout") || at_word("in") || at_word("out")) {
            parse_ref(b);
        } else if (keyword("plan")) {
            char kind[64];
            name(kind);
            skip_value();
        } else {
            if (b->ncons == MAXN) fail("too many constraints");
            b->cons[b->ncons++] = affine(b);
            expect(">=");
            if (integer() != 0) syntax("0");
        }
    }
    expect("{");
    int cap = 0;
    while (!accept("}")) {
        if (b->nstmt == cap) {
            cap = cap ? 2 * cap : 16;
            Stmt *grown = alloc(cap * sizeof *grown);
            char (*scalars)[64] = alloc(cap * sizeof *scalars);
            if (b->nstmt) { memcpy(grown, b->stmt, b->nstmt * sizeof *grown); memcpy(scalars, b->scalar, b->nscalar * 64); }
            b->stmt = grown, b->scalar = scalars;
        }
        if (integer() != b->nstmt) syntax("the next statement number");
        expect(":");
        parse_stmt(b, &b->stmt[b->nstmt++]);
        accept(";");
    }
    return b;
}

/* ---------------------------------------------------------------- execution (docs/stripe.md) */
typedef struct { Val *v; int64_t n; int dt; } Buf;
typedef struct { Buf *buf; int64_t base; const Ref *ref; } View;

static int64_t extent(const Ref *r) {
    int64_t n = 1;
    for (int d = 0; d < r->nd; d++) {
        if (r->size[d] == 0) return 0;
        n += (r->size[d] - 1) * r->stride[d];
    }
    return n;
}

static Buf *new_buf(const Ref *r) {
    Buf *b = alloc(sizeof *b);
    b->n = extent(r), b->dt = r->dt, b->v = alloc((size_t)b->n * sizeof(Val));
    for (int64_t k = 0; k < b->n; k++) b->v[k].dt = r->dt;
    return b;
}

static Val *element(const View *w, int64_t at) {
    if (at < 0 || at >= w->buf->n) fail("an access of '%s' reaches element %lld of a buffer of %lld",
                                        w->ref->into, (long long)at, (long long)w->buf->n);
    return &w->buf->v[at];
}

static void store(const View *w, int64_t at, Val x, int agg) { /* aggregate in the buffer's dtype */
    Val *cur = element(w, at), v = convert(convert(x, w->ref->dt), w->buf->dt);
    const char *op = agg == AG_ADD ? "add" : agg == AG_MUL ? "mul" : agg == AG_MAX ? "max" : "min";
    Val pair[2] = {*cur, v};
    *cur = agg <= AG_ASSIGN ? v : intrinsic(op, pair, 2, w->buf->dt);
}

static void fill(const View *w, int agg) { /* every element of the view gets the identity */
    const Ref *r = w->ref;
    Val id = {I64, agg == AG_MUL, 0};
    if (agg == AG_MAX || agg == AG_MIN) {
        int low = agg == AG_MAX;
        if (IS_FLOAT(r->dt)) id.dt = F64, id.f = low ? -INFINITY : INFINITY;
        else id.i = r->dt == BOOL ? !low : r->dt == I32 ? (low ? INT32_MIN : INT32_MAX) : (low ? INT64_MIN : INT64_MAX);
    }
    int64_t k[MAXN] = {0}, total = 1;
    for (int d = 0; d < r->nd; d++) total *= r->size[d];
    for (int64_t n = 0; n < total; n++) {
        int64_t at = w->base;
        for (int d = 0; d < r->nd; d++) at += k[d] * r->stride[d];
        store(w, at, id, AG_ASSIGN);
        for (int d = r->nd - 1; d >= 0 && ++k[d] == r->size[d]; d--) k[d] = 0;
    }
}

static void run_block(const Block *b, const int64_t *penv, const View *pviews, View *root_views) {
    int64_t start[MAXN], env[MAXN], total = 1;
    for (int k = 0; k < b->nidx; k++) {
        start[k] = b->idx[k].has_aff ? eval_affine(&b->idx[k].aff, penv) : 0;
        env[k] = start[k], total *= b->idx[k].range;
    }
    View *views = alloc(MAXR * sizeof *views);
    Val *sc = alloc((size_t)(b->nscalar + 1) * sizeof *sc);
    for (int64_t point = 0; point < total; point++) { /* row-major: the last index fastest */
        if (point) for (int k = b->nidx - 1; k >= 0 && ++env[k] == start[k] + b->idx[k].range; k--) env[k] = start[k];
        int ok = 1;
        for (int c = 0; c < b->ncons; c++) ok &= eval_affine(&b->cons[c], env) >= 0;
        if (!ok) continue;
        size_t mark = n_allocs;
        for (int k = 0; k < b->nref; k++) {
            const Ref *r = &b->ref[k];
            if (!b->parent) { views[k] = root_views[k]; continue; }
            if (r->parent < 0) { views[k].buf = new_buf(r), views[k].base = 0, views[k].ref = r; continue; }
            const View *p = &pviews[r->parent];
            views[k].buf = p->buf, views[k].base = p->base, views[k].ref = r;
            for (int d = 0; d < r->nd; d++) views[k].base += eval_affine(&r->access[d], env) * p->ref->stride[d];
        }
        for (int j = 0; j < b->nstmt; j++) {
            const Stmt *s = &b->stmt[j];
            const View *w = &views[s->ref];
            Val args[3];
            switch (s->kind) {
            case LOAD: sc[s->out] = convert(*element(w, w->base), w->ref->dt); break;
            case STORE: store(w, w->base, sc[s->in[0]], w->ref->agg); break;
            case LOAD_INDEX: sc[s->out] = (Val){I64, eval_affine(&s->aff, env), 0}; break;
            case CONSTANT: sc[s->out] = s->value; break;
            case INTRINSIC:
                for (int k = 0; k < s->nin; k++) args[k] = sc[s->in[k]];
                sc[s->out] = intrinsic(s->name, args, s->nin, s->dt);
                break;
            case SPECIAL: fill(w, s->dt); break;
            case BLOCK: run_block(s->block, env, views, NULL); break;
            }
        }
        while (n_allocs > mark) free(allocs[--n_allocs]); /* this point's local allocations */
    }
}

/* ---------------------------------------------------------------- the protocol */
static int wire_dtype(const char *nm) {
    for (int d = 0; d < NDT; d++)
        if (!strcmp(nm, WIRE_NAME[d])) return d;
    fail("dtype '%s' is not one this backend announced", nm);
    return -1;
}

static Val decode(const unsigned char *p, int dt) { /* one little-endian element */
    uint64_t u = 0;
    for (int k = BYTES[dt] - 1; k >= 0; k--) u = u << 8 | p[k];
    Val v = {dt, 0, 0};
    if (dt == F32) { uint32_t w = (uint32_t)u; float f; memcpy(&f, &w, 4); v.f = f; }
    else if (dt == F64) memcpy(&v.f, &u, 8);
    else v.i = wrap((int64_t)u, dt);
    return v;
}

static void encode(Val v, int dt) {
    uint64_t u;
    if (dt == F32) { float f = (float)v.f; uint32_t w; memcpy(&w, &f, 4); u = w; }
    else if (dt == F64) memcpy(&u, &v.f, 8);
    else u = (uint64_t)v.i;
    for (int k = 0; k < BYTES[dt]; k++) putchar((int)(u >> 8 * k & 0xFF));
}

static int64_t elements(const Json *shape) {
    int64_t n = 1;
    for (int k = 0; k < shape->n; k++) n *= (int64_t)shape->items[k]->num;
    return n;
}

static const Ref *root_ref(const Block *root, const char *nm, int *at) {
    for (*at = 0; *at < root->nref; ++*at)
        if (!strcmp(root->ref[*at].into, nm)) return &root->ref[*at];
    fail("the program has no buffer '%s'", nm);
    return NULL;
}

static void run(const Json *h, unsigned char **bytes, int64_t id) {
    Json *inputs = get(h, "inputs", 'a'), *outputs = get(h, "outputs", 'a');
    sp = text_start = get(h, "program", 's')->str;
    skip();
    if (*sp >= '0' && *sp <= '9') integer(), expect(":"); /* the optional `0:` before the root block */
    Block *root = parse_block(NULL);
    View *views = alloc(MAXR * sizeof *views);
    for (int k = 0; k < root->nref; k++) views[k].buf = new_buf(&root->ref[k]), views[k].base = 0, views[k].ref = &root->ref[k];
    for (int k = 0; k < inputs->n; k++) {
        int at;
        const Ref *r = root_ref(root, get(inputs->items[k], "name", 's')->str, &at);
        int dt = wire_dtype(get(inputs->items[k], "dtype", 's')->str);
        if (dt != r->dt || elements(get(inputs->items[k], "shape", 'a')) != views[at].buf->n)
            fail("input '%s' does not match the program's buffer", r->into);
        for (int64_t e = 0; e < views[at].buf->n; e++) views[at].buf->v[e] = convert(decode(bytes[k] + e * BYTES[dt], dt), r->dt);
    }
    run_block(root, NULL, NULL, views);
    for (int k = 0; k < outputs->n; k++) { /* check every output before the reply starts */
        int at;
        const Ref *r = root_ref(root, get(outputs->items[k], "name", 's')->str, &at);
        if (wire_dtype(get(outputs->items[k], "dtype", 's')->str) != r->dt ||
            elements(get(outputs->items[k], "shape", 'a')) != views[at].buf->n)
            fail("output '%s' does not match the program's buffer", r->into);
    }
    printf("{\"id\":%lld,\"ok\":true,\"outputs\":[", (long long)id);
    for (int k = 0; k < outputs->n; k++) {
        Json *o = outputs->items[k], *shape = get(o, "shape", 'a');
        int dt = wire_dtype(get(o, "dtype", 's')->str);
        printf("%s{\"name\":", k ? "," : "");
        put_string(get(o, "name", 's')->str);
        printf(",\"dtype\":\"%s\",\"shape\":[", WIRE_NAME[dt]);
        for (int d = 0; d < shape->n; d++) printf("%s%lld", d ? "," : "", (long long)shape->items[d]->num);
        printf("],\"nbytes\":%lld}", (long long)(elements(shape) * BYTES[dt]));
    }
    printf("]}\n");
    for (int k = 0; k < outputs->n; k++) {
        int at;
        root_ref(root, get(outputs->items[k], "name", 's')->str, &at);
        for (int64_t e = 0; e < views[at].buf->n; e++) encode(views[at].buf->v[e], views[at].ref->dt);
    }
}

static char *read_line(void) { /* the header, up to '\n'; NULL at end of input */
    size_t n = 0, cap = 4096;
    char *line = malloc(cap);
    int c = 0;
    while (line && (c = getchar()) != EOF && c != '\n') {
        if (n + 1 == cap) { char *g = realloc(line, cap *= 2); if (!g) { free(line); return NULL; } line = g; }
        line[n++] = (char)c;
    }
    if (!line || (c == EOF && n == 0)) { free(line); return NULL; }
    line[n] = 0;
    return line;
}

int main(int argc, char **argv) { /* stripe_backend [--optimized CONFIG] */
    int optimized = argc == 3 && !strcmp(argv[1], "--optimized");
    if (argc != 1 && !optimized) {
        fprintf(stderr, "usage: %s [--optimized CONFIG]\n", argv[0]);
        return 2;
    }
    printf("{\"protocol\":\"tile-external\",\"version\":1,\"name\":\"stripe_backend.c (a C sample)\","
           "\"stage\":\"%s\",\"config\":", optimized ? "optimized" : "stripe");
    put_string(optimized ? argv[2] : "");
    printf(",\"dtypes\":[\"bool\",\"int32\",\"int64\",\"float32\",\"float64\"]}\n");
    fflush(stdout);
    static char *line; /* static: kept across longjmp */
    while ((line = read_line())) {
        volatile int64_t id = 0;
        if (setjmp(on_fail)) { /* a bad request or an unsupported program: an error reply */
            printf("{\"id\":%lld,\"ok\":false,\"error\":{\"kind\":\"failed\",\"type\":\"SampleError\",\"message\":",
                   (long long)id);
            put_string(fail_msg);
            printf("}}\n");
        } else {
            jp = line;
            Json *h = json_value();
            const char *op = get(h, "op", 's')->str;
            if (!strcmp(op, "bye")) { free(line); return 0; }
            id = (int64_t)get(h, "id", 'n')->num;
            Json *inputs = get(h, "inputs", 'a');
            unsigned char **bytes = alloc((size_t)(inputs->n + 1) * sizeof *bytes);
            for (int k = 0; k < inputs->n; k++) { /* read every array first: the stream stays in step */
                size_t n = (size_t)get(inputs->items[k], "nbytes", 'n')->num;
                bytes[k] = alloc(n);
                if (fread(bytes[k], 1, n, stdin) != n) return 2;
            }
            if (strcmp(op, "run")) fail("unknown op '%s'", op);
            run(h, bytes, id);
        }
        fflush(stdout);
        free_all();
        free(line);
    }
    return 0;
}
