/*
 * mg_batch: the transfer batch state machine (moongate/batch.h).
 */
#include "moongate/batch.h"

int mg_req_start(mg_req_life *r)
{
    if (r->state != MG_REQ_PENDING)
        return -1;
    r->state = MG_REQ_RUNNING;
    return 0;
}

int mg_req_requeue(mg_req_life *r, unsigned cause)
{
    if (r->state != MG_REQ_RUNNING || (r->requeued & cause))
        return -1;
    r->state = MG_REQ_PENDING;
    r->requeued |= cause;
    return 0;
}

int mg_req_end(mg_req_life *r, mg_batch_counts *c, int failed)
{
    if (r->state == MG_REQ_DONE || r->state == MG_REQ_FAILED)
        return -1;
    if (!failed && r->state != MG_REQ_RUNNING) /* success needs a run */
        return -1;
    if (c->done + c->failed >= c->n)
        return -1;
    r->state = failed ? MG_REQ_FAILED : MG_REQ_DONE;
    if (failed)
        c->failed++;
    else
        c->done++;
    return 0;
}

int mg_batch_note_over(mg_batch_counts *c, int failed)
{
    if (c->notes_over >= c->notes)
        return -1;
    c->notes_over++;
    if (failed)
        c->notes_failed++;
    return 0;
}

int mg_note_req_ended(mg_note_gate *g, size_t index, int failed)
{
    if (g->state != MG_NOTE_WAITING || g->reqs_left == 0)
        return 0;
    if (failed && g->failed_req == 0)
        g->failed_req = index + 1;
    return --g->reqs_left == 0;
}

int mg_batch_over(const mg_batch_counts *c)
{
    return c->done + c->failed == c->n && c->notes_over == c->notes;
}

mg_req_state mg_batch_state(const mg_batch_counts *c)
{
    if (!mg_batch_over(c))
        return MG_REQ_RUNNING;
    return c->failed || c->notes_failed ? MG_REQ_FAILED : MG_REQ_DONE;
}
