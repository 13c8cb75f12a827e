/* gate.c -- a cap on calls in flight with a FIFO queue (see gate.h). */
#include "gate.h"

#include <string.h>

void llm_gate_init(struct llm_gate *g, long cap)
{
    memset(g, 0, sizeof(*g));
    g->cap = cap;
}

static int has_room(const struct llm_gate *g)
{
    return g->cap <= 0 || g->inflight < g->cap;
}

int llm_gate_enter(struct llm_gate *g, struct llm_gate_node *n)
{
    if (!g->head && has_room(g)) {
        n->state = LLM_GATE_IN;
        g->inflight++;
        return 1;
    }
    n->next = NULL;
    n->prev = g->tail;
    if (g->tail)
        g->tail->next = n;
    else
        g->head = n;
    g->tail = n;
    n->state = LLM_GATE_WAITING;
    g->waiting++;
    return 0;
}

static void unqueue(struct llm_gate *g, struct llm_gate_node *n)
{
    if (n->prev)
        n->prev->next = n->next;
    else
        g->head = n->next;
    if (n->next)
        n->next->prev = n->prev;
    else
        g->tail = n->prev;
    n->next = n->prev = NULL;
    g->waiting--;
}

void llm_gate_leave(struct llm_gate *g, struct llm_gate_node *n)
{
    if (n->state == LLM_GATE_WAITING)
        unqueue(g, n);
    else if (n->state == LLM_GATE_IN)
        g->inflight--;
    n->state = LLM_GATE_OUT;
}

struct llm_gate_node *llm_gate_next(struct llm_gate *g)
{
    struct llm_gate_node *n = g->head;
    if (!n || !has_room(g))
        return NULL;
    unqueue(g, n);
    n->state = LLM_GATE_IN;
    g->inflight++;
    return n;
}
