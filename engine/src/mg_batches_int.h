/* The batch set's inside, shared by mg_batches.c and mg_batch_check.c (moongate/batches.h). */
#ifndef MG_BATCHES_INT_H
#define MG_BATCHES_INT_H

#include "moongate/batches.h"

struct mg_batches {
    mg_batches_config cfg;
    mg_idmap ids;    /* the batches entered, by id */
    mg_list batches; /* the same, newest first */
    size_t n;
};

/* Takes the references a batch's fill owes (b->owed on b->owed_seg). */
void mg_batch_pay_holds(mg_batch *b);

#endif
