/* gate.h -- a cap on calls in flight with a FIFO queue for the rest (no I/O).
 *
 * One gate per provider with a max_connections: a call enters the gate before
 * its transfer starts; past the cap it waits in the gate's queue, in the order
 * it came, and the client starts it when llm_gate_next() hands it over after
 * another call left. The gate only counts and orders: the caller embeds a
 * node in each call, starts the transfers, and says when each one ends. Pure:
 * no clock, no allocation, no callback. */
#ifndef CR_LLM_GATE_H
#define CR_LLM_GATE_H

#include <stddef.h>

/* A call's place in a gate, embedded in the call. Zero it before its first
 * llm_gate_enter(). */
struct llm_gate_node {
    /* public */
    void *data; /* the owner's back-pointer, untouched by the gate */
    /* read-only */
    int state; /* LLM_GATE_OUT, LLM_GATE_WAITING or LLM_GATE_IN */
    /* private */
    struct llm_gate_node *next, *prev;
};

enum {
    LLM_GATE_OUT = 0,     /* neither counted nor queued */
    LLM_GATE_WAITING = 1, /* in the queue */
    LLM_GATE_IN = 2,      /* counted in inflight: its transfer may run */
};

struct llm_gate {
    /* public */
    long cap; /* calls in flight at most; <= 0: no cap (every call enters) */
    /* read-only */
    long inflight;  /* nodes LLM_GATE_IN */
    size_t waiting; /* nodes LLM_GATE_WAITING */
    /* private */
    struct llm_gate_node *head, *tail;
};

/* Zeroes g and sets its cap. */
void llm_gate_init(struct llm_gate *g, long cap);

/* n (LLM_GATE_OUT) asks to run: returns 1 when it is counted in now
 * (LLM_GATE_IN), 0 when it waits at the queue's tail (LLM_GATE_WAITING).
 * Only a queue that is empty lets a call in, so nobody overtakes. */
int llm_gate_enter(struct llm_gate *g, struct llm_gate_node *n);

/* n leaves the gate, wherever it is: out of the queue if waiting (a call
 * cancelled before it started), or uncounted if in (a call that ended).
 * Either way it is LLM_GATE_OUT after; a node already out is a no-op, so a
 * call's teardown can always call it. Does not start anyone: follow with
 * llm_gate_next() until it returns NULL. */
void llm_gate_leave(struct llm_gate *g, struct llm_gate_node *n);

/* The next waiting node, if there is room for it: taken off the queue and
 * counted in (LLM_GATE_IN), and the caller starts its transfer (or, when it
 * cannot, calls llm_gate_leave() for it). NULL when the queue is empty or the
 * gate is full. */
struct llm_gate_node *llm_gate_next(struct llm_gate *g);

#endif
