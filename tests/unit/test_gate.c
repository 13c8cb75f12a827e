/* test_gate.c -- the cap on a provider's calls in flight and its FIFO queue. */
#include <check.h>
#include <string.h>

#include "llm/gate.h"

#define N 8

static struct llm_gate_node nodes[N];

static void setup(struct llm_gate *g, long cap)
{
    llm_gate_init(g, cap);
    memset(nodes, 0, sizeof(nodes));
    for (int i = 0; i < N; i++)
        nodes[i].data = &nodes[i];
}

static int idx(const struct llm_gate_node *n)
{
    return n ? (int)(n - nodes) : -1;
}

/* The queue's nodes, head first, as their indices ("" when empty); checks
 * the back links and the count on the way. */
static const char *queue_of(const struct llm_gate *g)
{
    static char out[N + 1];
    const struct llm_gate_node *n, *prev = NULL;
    size_t k = 0;
    for (n = g->head; n && k < N; prev = n, n = n->next) {
        ck_assert_ptr_eq(n->prev, prev);
        ck_assert_int_eq(n->state, LLM_GATE_WAITING);
        out[k++] = (char)('0' + idx(n));
    }
    ck_assert_ptr_eq(g->tail, prev);
    ck_assert_uint_eq(g->waiting, k);
    out[k] = 0;
    return out;
}

START_TEST(test_cap_and_order)
{
    struct llm_gate g;
    setup(&g, 2);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(llm_gate_enter(&g, &nodes[i]), i < 2);
    ck_assert_int_eq(g.inflight, 2);
    ck_assert_str_eq(queue_of(&g), "234");
    ck_assert_ptr_null(llm_gate_next(&g)); /* full */
    /* 1 ends: 2 goes, then nobody until another ends */
    llm_gate_leave(&g, &nodes[1]);
    ck_assert_int_eq(nodes[1].state, LLM_GATE_OUT);
    ck_assert_int_eq(idx(llm_gate_next(&g)), 2);
    ck_assert_int_eq(nodes[2].state, LLM_GATE_IN);
    ck_assert_ptr_null(llm_gate_next(&g));
    ck_assert_int_eq(g.inflight, 2);
    /* a newcomer waits behind the queue even once there is room */
    llm_gate_leave(&g, &nodes[0]);
    ck_assert_int_eq(llm_gate_enter(&g, &nodes[5]), 0);
    ck_assert_str_eq(queue_of(&g), "345");
    ck_assert_int_eq(idx(llm_gate_next(&g)), 3);
    ck_assert_ptr_null(llm_gate_next(&g));
    /* both in flight end: the last two go, in order */
    llm_gate_leave(&g, &nodes[2]);
    llm_gate_leave(&g, &nodes[3]);
    ck_assert_int_eq(idx(llm_gate_next(&g)), 4);
    ck_assert_int_eq(idx(llm_gate_next(&g)), 5);
    ck_assert_ptr_null(llm_gate_next(&g));
    ck_assert_str_eq(queue_of(&g), "");
    ck_assert_int_eq(g.inflight, 2);
    llm_gate_leave(&g, &nodes[4]);
    llm_gate_leave(&g, &nodes[5]);
    ck_assert_int_eq(g.inflight, 0);
    /* an empty gate lets the next one straight in */
    ck_assert_int_eq(llm_gate_enter(&g, &nodes[6]), 1);
}
END_TEST

/* A call cancelled while it waits leaves the queue wherever it is, takes no
 * place, and a second leave (the call's teardown) changes nothing. */
START_TEST(test_cancel_while_waiting)
{
    struct llm_gate g;
    setup(&g, 1);
    for (int i = 0; i < 6; i++)
        llm_gate_enter(&g, &nodes[i]);
    ck_assert_str_eq(queue_of(&g), "12345");
    llm_gate_leave(&g, &nodes[3]); /* the middle */
    ck_assert_str_eq(queue_of(&g), "1245");
    llm_gate_leave(&g, &nodes[1]); /* the head */
    ck_assert_str_eq(queue_of(&g), "245");
    llm_gate_leave(&g, &nodes[5]); /* the tail */
    ck_assert_str_eq(queue_of(&g), "24");
    llm_gate_leave(&g, &nodes[5]);
    ck_assert_str_eq(queue_of(&g), "24");
    ck_assert_int_eq(nodes[5].state, LLM_GATE_OUT);
    ck_assert_int_eq(g.inflight, 1);
    ck_assert_ptr_null(llm_gate_next(&g)); /* cancelling made no room */
    llm_gate_leave(&g, &nodes[0]);
    llm_gate_leave(&g, &nodes[0]); /* twice: counted out once */
    ck_assert_int_eq(g.inflight, 0);
    ck_assert_int_eq(idx(llm_gate_next(&g)), 2);
    ck_assert_ptr_null(llm_gate_next(&g));
    llm_gate_leave(&g, &nodes[4]);
    llm_gate_leave(&g, &nodes[2]);
    ck_assert_str_eq(queue_of(&g), "");
    ck_assert_int_eq(g.inflight, 0);
    ck_assert_ptr_null(llm_gate_next(&g));
    /* a node that has left can enter again */
    ck_assert_int_eq(llm_gate_enter(&g, &nodes[3]), 1);
}
END_TEST

START_TEST(test_no_cap)
{
    struct llm_gate g;
    setup(&g, 0);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(llm_gate_enter(&g, &nodes[i]), 1);
    ck_assert_int_eq(g.inflight, N);
    ck_assert_str_eq(queue_of(&g), "");
    ck_assert_ptr_null(llm_gate_next(&g));
}
END_TEST

/* Random enters, ends and cancels against a model: never more than cap in,
 * a node in the queue only while the gate is full, starts in arrival order. */
START_TEST(test_random_against_model)
{
    struct llm_gate g;
    unsigned seed = 12345;
    int order[1 << 12], norder = 0;
    int enter_seq[N];
    int seq = 0;
    setup(&g, 3);
    for (int step = 0; step < 20000; step++) {
        int i;
        seed = seed * 1103515245u + 12345u;
        i = (int)((seed >> 16) % N);
        if (nodes[i].state == LLM_GATE_OUT) {
            enter_seq[i] = seq++;
            if (llm_gate_enter(&g, &nodes[i]))
                continue;
        } else {
            llm_gate_leave(&g, &nodes[i]);
        }
        for (struct llm_gate_node *n; (n = llm_gate_next(&g));) {
            /* each start is the oldest waiter */
            for (struct llm_gate_node *w = g.head; w; w = w->next)
                ck_assert_int_lt(enter_seq[idx(n)], enter_seq[idx(w)]);
            if (norder < (int)(sizeof(order) / sizeof(order[0])))
                order[norder++] = idx(n);
        }
        ck_assert_int_le(g.inflight, 3);
        ck_assert(g.waiting == 0 || g.inflight == 3);
        queue_of(&g);
        {
            long in = 0;
            for (int k = 0; k < N; k++)
                in += nodes[k].state == LLM_GATE_IN;
            ck_assert_int_eq(in, g.inflight);
        }
    }
    ck_assert_int_gt(norder, 100); /* the queue was exercised */
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("gate");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_cap_and_order);
    tcase_add_test(tc, test_cancel_while_waiting);
    tcase_add_test(tc, test_no_cap);
    tcase_add_test(tc, test_random_against_model);
    suite_add_tcase(s, tc);
    return s;
}
