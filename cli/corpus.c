/* corpus.c: a deterministic English-like text for the demo to train on without downloading
 * anything: short stories about a harbour town, sentence by sentence from a small grammar
 * (subjects, verbs in the past tense, objects, places, times, dialogue), seeded. Its structure is
 * learnable in a few hundred steps (words first, then phrases), so the demo's samples visibly go
 * from noise to sentences. */
#include <stdio.h>
#include <string.h>

#include "init.h"
#include "train.h"

#define N(a) (sizeof(a) / sizeof(a)[0])

static const char *const names[] = {"Anna", "Tom", "Mira", "Jonas", "Eva", "Paul", "Lena", "Oskar"};
static const char *const people[] = {"fisherman", "baker", "sailor", "teacher", "child", "doctor",
                                     "captain", "painter", "farmer", "old woman", "stranger", "girl"};
static const char *const things[] = {"boat", "letter", "basket", "lamp", "map", "bell", "net",
                                     "loaf of bread", "book", "coat", "key", "cup of tea", "rope"};
static const char *const places[] = {"the harbour", "the market", "the old bridge", "the church",
                                     "the lighthouse", "the bakery", "the beach", "the hill",
                                     "the station", "the garden"};
static const char *const adjs[] = {"old", "small", "red", "quiet", "heavy", "warm", "bright",
                                   "wet", "new", "broken", "tall", "strange"};
static const char *const moves[] = {"walked to", "ran to", "looked at", "went back to",
                                    "waited near", "sat down by", "hurried past"};
static const char *const takes[] = {"found", "carried", "opened", "lost", "bought", "painted",
                                    "mended", "gave away", "saw", "remembered"};
static const char *const times[] = {"In the morning", "At noon", "Later that day", "In the evening",
                                    "At night", "The next day", "After the rain", "Before dawn"};
static const char *const weather[] = {"the wind was cold", "the sea was calm", "it began to rain",
                                      "the sun came out", "the fog rolled in", "the sky was grey"};
static const char *const says[] = {"said", "asked", "whispered", "called", "answered"};
static const char *const lines[] = {"Where are you going?", "It is late", "Look at the sea!",
                                    "I will come back tomorrow", "Have you seen my key?",
                                    "The boat is ready", "We should go home", "Thank you"};

typedef struct {
    unsigned char *out;
    size_t len, at;
    RtRng rng;
} Gen;

static const char *pick(Gen *g, const char *const *list, size_t n)
{
    return list[rt_rng_next(&g->rng) % n];
}

static int chance(Gen *g, int percent) { return (int)(rt_rng_next(&g->rng) % 100) < percent; }

static void put(Gen *g, const char *s)
{
    for (; *s && g->at < g->len; s++)
        g->out[g->at++] = (unsigned char)*s;
}

static void who(Gen *g, char *buf, size_t n, int capital)
{
    if (chance(g, 35)) {
        snprintf(buf, n, "%s", pick(g, names, N(names)));
        return;
    }
    const char *adj = chance(g, 40) ? pick(g, adjs, N(adjs)) : NULL;
    snprintf(buf, n, "%s %s%s%s", capital ? "The" : "the", adj ? adj : "", adj ? " " : "",
             pick(g, people, N(people)));
}

static void what(Gen *g, char *buf, size_t n)
{
    const char *adj = chance(g, 50) ? pick(g, adjs, N(adjs)) : NULL;
    const char *art = adj ? (strchr("aeiou", adj[0]) ? "an" : "a") : "a";
    snprintf(buf, n, "%s %s%s%s", chance(g, 50) ? "the" : art, adj ? adj : "", adj ? " " : "",
             pick(g, things, N(things)));
}

static void sentence(Gen *g)
{
    char a[64], b[64], s[256];
    switch (rt_rng_next(&g->rng) % 6) {
    case 0:
        who(g, a, sizeof a, 1);
        snprintf(s, sizeof s, "%s %s %s.", a, pick(g, moves, N(moves)), pick(g, places, N(places)));
        break;
    case 1:
        who(g, a, sizeof a, 1);
        what(g, b, sizeof b);
        if (chance(g, 40))
            snprintf(s, sizeof s, "%s %s %s near %s.", a, pick(g, takes, N(takes)), b, pick(g, places, N(places)));
        else
            snprintf(s, sizeof s, "%s %s %s.", a, pick(g, takes, N(takes)), b);
        break;
    case 2:
        snprintf(s, sizeof s, "%s, %s.", pick(g, times, N(times)), pick(g, weather, N(weather)));
        break;
    case 3:
    {
        const char *line = pick(g, lines, N(lines));
        int ask = strchr("?!", line[strlen(line) - 1]) != NULL;
        who(g, a, sizeof a, 0);
        snprintf(s, sizeof s, "\"%s%s\" %s %s.", line, ask ? "" : ",", pick(g, says, N(says)), a);
        break;
    }
    case 4:
        who(g, a, sizeof a, 1);
        what(g, b, sizeof b);
        snprintf(s, sizeof s, "%s %s %s and %s %s.", a, pick(g, takes, N(takes)), b, pick(g, moves, N(moves)),
                 pick(g, places, N(places)));
        break;
    default:
        who(g, a, sizeof a, 1);
        snprintf(s, sizeof s, "%s was %s, but %s.", a, pick(g, adjs, N(adjs)), pick(g, weather, N(weather)));
        break;
    }
    put(g, s);
}

size_t cli_corpus(unsigned char *out, size_t len, uint64_t seed)
{
    Gen g = {.out = out, .len = len};
    rt_rng_seed(&g.rng, seed);
    while (g.at < g.len) {
        int n = 3 + (int)(rt_rng_next(&g.rng) % 5);
        for (int i = 0; i < n && g.at < g.len; i++) {
            if (i)
                put(&g, " ");
            sentence(&g);
        }
        put(&g, "\n\n");
    }
    return g.at;
}
