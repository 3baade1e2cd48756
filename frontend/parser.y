/* parser.y: the grammar of the .xtf language (pure bison parser) and xtf_parse.
 *
 *   file  := stmt*
 *   stmt  := NAME '=' value
 *   value := INT | FLOAT | BOOL | STRING | None | '-' INT | '-' FLOAT
 *          | '(' ')' | '(' value ')' | '(' value ',' [value {',' value}] [','] ')'     tuple
 *          | '[' [value {',' value} [',']] ']'                            list (= tuple)
 *          | NAME '(' [NAME '=' value {',' NAME '=' value} [',']] ')'      constructor call
 *          | NAME                                    reference to an earlier statement
 *
 * '(' value ')' is the value itself, as in Python; (x,) is a one-element tuple.
 * Statements need no separator. After a syntax error the parser skips to the next token that
 * looks like the start of a statement (a name followed by '=' outside brackets, or at the start
 * of a line no further right than the statement that failed) and goes on, so one run reports
 * every broken statement. Messages name tokens as the user wrote them:
 *   gpt.xtf:4:38: error: expected ')' or ',' before 'depth'
 * Positional arguments parse (to say clearly that options are passed by name) but are dropped. */

%code top {
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
}

%code requires {
#include "xtf_internal.h"
typedef struct XtfParser XtfParser;
}

%code provides {
/* The scanner driver (lexer.l). Returns the token, 0 at the end, -1 on a fatal scanner error
 * (out of memory). text receives the token's spelling, truncated to textcap - 1 bytes. */
int xtf_lex_start(XtfLexCtx *x, const char *src, size_t len, void **scanner);
int xtf_lex_next(void *scanner, XTF_YYSTYPE *val, XtfLoc *loc, char *text, size_t textcap);
void xtf_lex_end(void *scanner);
}

%define api.pure full
%define api.prefix {xtf_yy}
%define api.location.type {XtfLoc}
%define parse.error custom
%define parse.lac full
%locations
%parse-param {XtfParser *P}
%lex-param {XtfParser *P}

%union {
    int64_t i;
    double f;
    int b;
    const char *s;
    XtfValue *v;
    XtfArg *arg;
    XtfVec vec;
}

%token <i> INT "integer"
%token <f> FLOAT "float"
%token <s> STRING "string"
%token <s> IDENT "name"
%token <b> BOOL "boolean"
%token NONE "None"

%type <v> value
%type <vec> items args opt_items
%type <arg> arg

%code {
enum { TEXT_CAP = 48, MAX_PENDING = 4, MAX_OPEN = 64 };

typedef struct {
    int kind;
    XTF_YYSTYPE val;
    XtfLoc loc;
    int first_on_line; /* no token before it on its line */
    char text[TEXT_CAP];
} Token;

struct XtfParser {
    XtfFile *file;
    XtfDiag *diag;
    XtfLexCtx lex;
    void *scanner;
    int fatal;             /* the scanner ran out of memory: stop, report once */
    XtfVec stmts;
    Token pending[MAX_PENDING]; /* read ahead, or pushed back by error recovery */
    int npending;
    Token last;            /* the token last handed to the parser (the lookahead on an error) */
    int prev_line;         /* line of the last token read from the scanner */
    XtfLoc prev_end;       /* just after the last token read: where "end of file" is shown */
    int depth;             /* bracket depth of the tokens handed out so far */
    XtfLoc open[MAX_OPEN]; /* where the open brackets are (the outermost MAX_OPEN of them) */
    char open_kind[MAX_OPEN];
    int popped;            /* the last token handed out closed a bracket */
    int stmt_col;          /* column of the name of the statement being parsed */
    const char *stmt_name; /* and the name itself (NULL between statements) */
    XtfLoc stmt_loc;
};

static int xtf_yylex(XTF_YYSTYPE *val, XtfLoc *loc, XtfParser *P);
static void xtf_yyerror(const XtfLoc *loc, XtfParser *P, const char *msg);
static void recover(XtfParser *P);
static XtfValue *node(XtfParser *P, XtfKind kind, XtfLoc loc);
static XtfValue *tuple(XtfParser *P, XtfLoc loc, XtfValue *first, const XtfVec *rest);
static XtfValue *call(XtfParser *P, const char *callee, XtfLoc loc, const XtfVec *args);
static int add_stmt(XtfParser *P, const char *name, XtfLoc loc, XtfValue *value);

/* A node's location is its first token; it extends to the last when both are on one line. */
#define YYLLOC_DEFAULT(Cur, Rhs, N)                                                   \
    do {                                                                              \
        if (N) {                                                                      \
            (Cur) = YYRHSLOC(Rhs, 1);                                                 \
            XtfLoc last_ = YYRHSLOC(Rhs, N);                                          \
            if (last_.line == (Cur).line && last_.col + last_.len > (Cur).col)        \
                (Cur).len = last_.col + last_.len - (Cur).col;                        \
        } else {                                                                      \
            (Cur) = YYRHSLOC(Rhs, 0);                                                 \
            (Cur).col += (Cur).len;                                                   \
            (Cur).len = 1;                                                            \
        }                                                                             \
    } while (0)

#define YYMAXDEPTH 3000 /* nesting of about 1000 brackets; deeper input is refused */
#ifndef YYNOMEM
#define YYNOMEM goto yyexhaustedlab
#endif
#define NEED(p) do { if (!(p)) YYNOMEM; } while (0)
}

%initial-action { @$.line = 1; @$.col = 1; @$.len = 1; }

%%

file
    : %empty
    | file stmt
    ;

stmt
    : IDENT                          { P->stmt_col = @1.col; P->stmt_name = $1; P->stmt_loc = @1; }
      '=' value                      { NEED(add_stmt(P, $1, @1, $4) == 0); P->stmt_name = NULL; }
    | error                          { recover(P); yyclearin; yyerrok; P->stmt_name = NULL; }
    ;

value
    : INT                            { NEED($$ = node(P, XV_INT, @$)); $$->i = $1; }
    | FLOAT                          { NEED($$ = node(P, XV_FLOAT, @$)); $$->f = $1; }
    | BOOL                           { NEED($$ = node(P, XV_BOOL, @$)); $$->b = $1; }
    | STRING                         { NEED($$ = node(P, XV_STRING, @$)); $$->s = $1; }
    | NONE                           { NEED($$ = node(P, XV_NONE, @$)); }
    | '-' INT                        { NEED($$ = node(P, XV_INT, @$)); $$->i = -$2; }
    | '-' FLOAT                      { NEED($$ = node(P, XV_FLOAT, @$)); $$->f = -$2; }
    | '(' ')'                        { NEED($$ = tuple(P, @$, NULL, NULL)); }
    | '(' value ')'                  { $$ = $2; }
    | '(' value ',' opt_items ')'    { NEED($$ = tuple(P, @$, $2, &$4)); }
    | '[' ']'                        { NEED($$ = tuple(P, @$, NULL, NULL)); }
    | '[' items opt_comma ']'        { NEED($$ = tuple(P, @$, NULL, &$2)); }
    | IDENT '(' ')'                  { NEED($$ = call(P, $1, @1, NULL)); }
    | IDENT '(' args opt_comma ')'   { NEED($$ = call(P, $1, @1, &$3)); }
    | IDENT                          { NEED($$ = node(P, XV_REF, @$)); $$->s = $1; }
    ;

opt_items
    : %empty                         { memset(&$$, 0, sizeof $$); }
    | items opt_comma                { $$ = $1; }
    ;

items
    : value                          {
                                         memset(&$$, 0, sizeof $$);
                                         NEED(xtf_vec_push(P->file, &$$, $1) == 0);
                                     }
    | items ',' value                { $$ = $1; NEED(xtf_vec_push(P->file, &$$, $3) == 0); }
    ;

opt_comma
    : %empty
    | ','
    ;

args
    : arg                            {
                                         memset(&$$, 0, sizeof $$);
                                         if ($1)
                                             NEED(xtf_vec_push(P->file, &$$, $1) == 0);
                                     }
    | args ',' arg                   { $$ = $1; if ($3) NEED(xtf_vec_push(P->file, &$$, $3) == 0); }
    ;

arg
    : IDENT '=' value                {
                                         NEED($$ = xtf_pool_alloc(P->file, sizeof *$$));
                                         $$->key = $1;
                                         $$->loc = @1;
                                         $$->value = $3;
                                     }
    | value                          {
                                         xtf_diag_error(P->diag, P->file, @1,
                                             "positional arguments are not supported; "
                                             "write 'name = value'");
                                         $$ = NULL;
                                     }
    ;

%%

/* ---- building the tree ---- */

static XtfValue *node(XtfParser *P, XtfKind kind, XtfLoc loc)
{
    XtfValue *v = xtf_pool_alloc(P->file, sizeof *v);
    if (v) {
        v->kind = kind;
        v->loc = loc;
    }
    return v;
}

static XtfValue *tuple(XtfParser *P, XtfLoc loc, XtfValue *first, const XtfVec *rest)
{
    XtfValue *v = node(P, XV_TUPLE, loc);
    if (!v)
        return NULL;
    int n = (first ? 1 : 0) + (rest ? rest->n : 0);
    if (n == 0)
        return v;
    v->items = xtf_pool_alloc(P->file, (size_t)n * sizeof *v->items);
    if (!v->items)
        return NULL;
    if (first)
        v->items[v->nitems++] = first;
    for (int i = 0; rest && i < rest->n; i++)
        v->items[v->nitems++] = rest->items[i];
    return v;
}

static XtfValue *call(XtfParser *P, const char *callee, XtfLoc loc, const XtfVec *args)
{
    XtfValue *v = node(P, XV_CALL, loc);
    if (!v)
        return NULL;
    v->s = callee;
    if (!args || args->n == 0)
        return v;
    v->args = xtf_pool_alloc(P->file, (size_t)args->n * sizeof *v->args);
    if (!v->args)
        return NULL;
    for (int i = 0; i < args->n; i++)
        v->args[v->nargs++] = *(const XtfArg *)args->items[i];
    return v;
}

static int add_stmt(XtfParser *P, const char *name, XtfLoc loc, XtfValue *value)
{
    XtfStmt *s = xtf_pool_alloc(P->file, sizeof *s);
    if (!s)
        return -1;
    s->name = name;
    s->loc = loc;
    s->value = value;
    return xtf_vec_push(P->file, &P->stmts, s);
}

/* ---- tokens: read ahead, push back, bracket depth ---- */

static Token scan(XtfParser *P)
{
    Token t;
    memset(&t, 0, sizeof t);
    if (!P->fatal) {
        t.kind = xtf_lex_next(P->scanner, &t.val, &t.loc, t.text, sizeof t.text);
        if (t.kind < 0 || xtf_pool_failed(P->file)) {
            P->fatal = 1;
            xtf_diag_error(P->diag, P->file, t.loc, "out of memory");
            t.kind = 0;
        }
    }
    if (t.kind == 0) {
        t.loc = P->prev_end; /* point just after the last token, not at a blank last line */
        strcpy(t.text, "end of file");
        return t;
    }
    t.first_on_line = t.loc.line != P->prev_line;
    P->prev_line = t.loc.line;
    P->prev_end = t.loc;
    P->prev_end.col += t.loc.len;
    P->prev_end.len = 1;
    return t;
}

static Token take(XtfParser *P)
{
    if (P->npending == 0)
        return scan(P);
    Token t = P->pending[0];
    memmove(P->pending, P->pending + 1, (size_t)--P->npending * sizeof *P->pending);
    return t;
}

static const Token *peek(XtfParser *P)
{
    if (P->npending == 0)
        P->pending[P->npending++] = scan(P);
    return &P->pending[0];
}

static void push_back(XtfParser *P, Token t)
{
    memmove(P->pending + 1, P->pending, (size_t)P->npending * sizeof *P->pending);
    P->pending[0] = t;
    P->npending++;
}

static void track_depth(XtfParser *P, const Token *t)
{
    P->popped = 0;
    if (t->kind == '(' || t->kind == '[') {
        if (P->depth < MAX_OPEN) {
            P->open[P->depth] = t->loc;
            P->open_kind[P->depth] = (char)t->kind;
        }
        P->depth++;
    } else if ((t->kind == ')' || t->kind == ']') && P->depth > 0) {
        P->depth--;
        P->popped = 1;
    }
}

static int xtf_yylex(XTF_YYSTYPE *val, XtfLoc *loc, XtfParser *P)
{
    Token t = take(P);
    track_depth(P, &t);
    P->last = t;
    *val = t.val;
    *loc = t.loc;
    return t.kind;
}

/* After a syntax error: skip to something that starts a statement, and hand it out again. */
static void recover(XtfParser *P)
{
    Token t = P->last;
    for (;;) {
        if (t.kind == 0)
            break;
        if (t.kind == IDENT && peek(P)->kind == '=' &&
            (P->depth == 0 || (t.first_on_line && t.loc.col <= P->stmt_col)))
            break;
        t = take(P);
        track_depth(P, &t);
    }
    P->depth = 0;
    push_back(P, t);
}

/* ---- messages ---- */

/* How a token is named in "expected ..." lists, and the order such lists are written in. */
static const char *human(yysymbol_kind_t k, int *rank)
{
    *rank = 6;
    switch (k) {
    case YYSYMBOL_YYEOF: *rank = 9; return "end of file";
    case YYSYMBOL_IDENT: *rank = 7; return "a name";
    case YYSYMBOL_INT: return "an integer";
    case YYSYMBOL_FLOAT: return "a float";
    case YYSYMBOL_STRING: return "a string";
    case YYSYMBOL_BOOL: return "true or false";
    case YYSYMBOL_NONE: return "None";
    default: break;
    }
    const char *name = yysymbol_name(k); /* "')'" for the punctuation */
    static const char *const first[] = {"')'", "']'", "','", "'='"};
    for (int i = 0; i < 4; i++)
        if (strcmp(name, first[i]) == 0)
            *rank = i + 1;
    return name;
}

static int yyreport_syntax_error(const yypcontext_t *ctx, XtfParser *P)
{
    if (P->fatal)
        return 0;
    yysymbol_kind_t exp[YYNTOKENS];
    int n = yypcontext_expected_tokens(ctx, exp, YYNTOKENS);
    if (n < 0)
        n = 0;

    /* Every token that can start a value, or just the numbers after '-', read as one item. */
    const yysymbol_kind_t starts[] = {YYSYMBOL_INT,    YYSYMBOL_FLOAT,    YYSYMBOL_STRING,
                                      YYSYMBOL_BOOL,   YYSYMBOL_NONE,     YYTRANSLATE('-'),
                                      YYTRANSLATE('('), YYTRANSLATE('['), YYSYMBOL_IDENT};
    int nstarts = (int)(sizeof starts / sizeof starts[0]), have = 0, numbers = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < nstarts; j++)
            have += exp[i] == starts[j];
        numbers += exp[i] == YYSYMBOL_INT || exp[i] == YYSYMBOL_FLOAT;
    }
    const char *names[YYNTOKENS + 1];
    int ranks[YYNTOKENS + 1], m = 0;
    for (int i = 0; i < n; i++) {
        int is_start = 0;
        for (int j = 0; j < nstarts; j++)
            is_start |= exp[i] == starts[j];
        if (have == nstarts && is_start)
            continue;
        if (numbers == 2 && n == 2)
            break;
        names[m] = human(exp[i], &ranks[m]);
        m++;
    }
    if (have == nstarts) {
        names[m] = "a value";
        ranks[m++] = 5;
    } else if (numbers == 2 && n == 2) {
        names[m] = "a number";
        ranks[m++] = 5;
    }
    for (int i = 1; i < m; i++) /* insertion sort by rank */
        for (int j = i; j > 0 && ranks[j] < ranks[j - 1]; j--) {
            int r = ranks[j];
            ranks[j] = ranks[j - 1];
            ranks[j - 1] = r;
            const char *s = names[j];
            names[j] = names[j - 1];
            names[j - 1] = s;
        }

    char list[512];
    size_t len = 0;
    list[0] = '\0';
    for (int i = 0; i < m && len < sizeof list - 64; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s",
                                i == 0 ? "" : i == m - 1 ? " or " : ", ", names[i]);

    const Token *t = &P->last;
    char what[TEXT_CAP + 8];
    if (t->kind == 0)
        snprintf(what, sizeof what, "end of file");
    else
        snprintf(what, sizeof what, "'%s%s'", t->text,
                 strlen(t->text) == TEXT_CAP - 1 ? "..." : "");
    XtfLoc loc = *yypcontext_location(ctx);
    int top_level = n == 2 && (exp[0] == YYSYMBOL_YYEOF || exp[1] == YYSYMBOL_YYEOF) &&
                    (exp[0] == YYSYMBOL_IDENT || exp[1] == YYSYMBOL_IDENT);
    int reserved = t->kind == BOOL || t->kind == NONE;
    if (top_level && reserved)
        xtf_diag_error(P->diag, P->file, loc,
                       "%s is a reserved word; a statement starts with a name", what);
    else if (top_level)
        xtf_diag_error(P->diag, P->file, loc,
                       "expected the next statement (name = value) before %s", what);
    else if (m > 0)
        xtf_diag_error(P->diag, P->file, loc, "expected %s before %s", list, what);
    else
        xtf_diag_error(P->diag, P->file, loc, "unexpected %s", what);
    /* A mismatched closing bracket, or one missing before what looks like the next statement:
     * show the bracket it should close. */
    int wants_close = 0;
    for (int i = 0; i < n; i++)
        wants_close |= exp[i] == YYTRANSLATE(')') || exp[i] == YYTRANSLATE(']');
    int inner = P->popped ? P->depth : P->depth - 1;
    int next_stmt = t->first_on_line && t->loc.col <= P->stmt_col;
    if (wants_close && inner >= 0 && inner < MAX_OPEN &&
        (P->popped || (next_stmt && P->open[inner].line != loc.line)))
        xtf_diag_note(P->diag, P->file, P->open[inner], "to match this '%c'", P->open_kind[inner]);
    int wants_equals = n == 1 && exp[0] == YYTRANSLATE('=');
    if (wants_equals && P->stmt_name && (strcmp(P->stmt_name, "import") == 0 || strcmp(P->stmt_name, "from") == 0))
        xtf_diag_note(P->diag, P->file, P->stmt_loc,
                      "Python imports are not needed: .xtf knows the x-transformers constructors");
    return 0;
}

/* Called only when the parser's own stack is full (or memory ran out). */
static void xtf_yyerror(const XtfLoc *loc, XtfParser *P, const char *msg)
{
    (void)msg;
    if (P->fatal)
        return;
    P->fatal = 1;
    if (xtf_pool_failed(P->file))
        xtf_diag_error(P->diag, P->file, *loc, "out of memory");
    else
        xtf_diag_error(P->diag, P->file, *loc, "brackets nested too deeply");
}

/* ---- entry points ---- */

XtfFile *xtf_parse(const char *path, const char *src, size_t len, XtfDiag *d)
{
    XtfFile *f = xtf_file_new(path, src ? src : "", src ? len : 0);
    if (!f) {
        xtf_diag_error(d, NULL, (XtfLoc){0, 0, 0}, "out of memory");
        return NULL;
    }
    const char *nul = len ? memchr(f->src, 0, len) : NULL;
    if (nul) { /* the text would end there for everything that reads it as a string */
        XtfLoc at = {1, 1, 1};
        for (const char *c = f->src; c < nul; c++)
            at = *c == '\n' ? (XtfLoc){at.line + 1, 1, 1} : (XtfLoc){at.line, at.col + 1, 1};
        xtf_diag_error(d, f, at, "NUL byte in the source (byte %zu); a .xtf source is text",
                       (size_t)(nul - f->src));
        return f;
    }
    XtfParser P;
    memset(&P, 0, sizeof P);
    P.file = f;
    P.diag = d;
    P.lex.file = f;
    P.lex.diag = d;
    P.lex.line = 1;
    P.lex.col = 1;
    P.prev_end = (XtfLoc){1, 1, 1};
    P.stmt_col = 1;
    if (xtf_lex_start(&P.lex, f->src, xtf_src_len(f), &P.scanner) != 0) {
        xtf_diag_error(d, f, (XtfLoc){0, 0, 0},
                       xtf_src_len(f) > 1000000000 ? "file too large" : "out of memory");
        return f;
    }
    xtf_yyparse(&P);
    xtf_lex_end(P.scanner);

    if (P.stmts.n > 0) {
        f->stmts = xtf_pool_alloc(f, (size_t)P.stmts.n * sizeof *f->stmts);
        if (!f->stmts) {
            xtf_diag_error(d, f, (XtfLoc){0, 0, 0}, "out of memory");
            return f;
        }
        for (int i = 0; i < P.stmts.n; i++)
            f->stmts[i] = *(const XtfStmt *)P.stmts.items[i];
        f->nstmts = P.stmts.n;
    }
    return f;
}

XtfFile *xtf_parse_file(const char *path, XtfDiag *d)
{
    /* O_NONBLOCK: a FIFO that nobody writes opens at once (and reads as empty) instead of
     * blocking; pipes and character devices are read up to the size cap like files */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    FILE *fp = NULL;
    if (fd >= 0) {
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0)
            fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        if (!(fp = fdopen(fd, "rb")))
            close(fd);
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int err = 0, big = 0;
    if (!fp) {
        err = errno;
    } else {
        for (;;) {
            if (len == cap) {
                size_t ncap = cap ? cap * 2 : 65536;
                if (ncap > XTF_SOURCE_MAX + 1)
                    ncap = XTF_SOURCE_MAX + 1;
                char *nbuf = ncap > cap ? realloc(buf, ncap) : NULL;
                if (!nbuf) {
                    err = ENOMEM;
                    break;
                }
                buf = nbuf;
                cap = ncap;
            }
            size_t got = fread(buf + len, 1, cap - len, fp);
            len += got;
            if (len > XTF_SOURCE_MAX) {
                big = 1;
                break;
            }
            if (got == 0) {
                if (ferror(fp))
                    err = errno ? errno : EIO;
                break;
            }
        }
        fclose(fp);
    }
    if (big) {
        XtfFile *f = xtf_parse(path, "", 0, d);
        if (f)
            xtf_diag_error(d, f, (XtfLoc){0, 0, 0}, "larger than %d MiB, the limit for a .xtf source",
                           XTF_SOURCE_MAX >> 20);
        free(buf);
        return f;
    }
    XtfFile *f;
    if (err) {
        f = xtf_parse(path, "", 0, d);
        if (f)
            xtf_diag_error(d, f, (XtfLoc){0, 0, 0}, "cannot read file: %s", strerror(err));
    } else {
        f = xtf_parse(path, buf ? buf : "", len, d);
    }
    free(buf);
    return f;
}
