/* mg_ratelim: generic cell rate algorithm with the time passed in (mg_ratelim.h). */
#include "mg_ratelim.h"

void mg_ratelim_init(mg_ratelim *rl, uint64_t rate, uint64_t burst, uint64_t now_ns)
{
    if (rate == 0)
        rate = 1;
    if (rate > 1000000000ULL)
        rate = 1000000000ULL;
    if (burst == 0)
        burst = 1;
    rl->interval_ns = 1000000000ULL / rate;
    rl->tolerance_ns =
        (burst - 1) > UINT64_MAX / rl->interval_ns ? UINT64_MAX : (burst - 1) * rl->interval_ns;
    rl->tat_ns = now_ns;
}

int mg_ratelim_take(mg_ratelim *rl, uint64_t now_ns)
{
    uint64_t tat = rl->tat_ns > now_ns ? rl->tat_ns : now_ns;
    if (tat - now_ns > rl->tolerance_ns)
        return -1;
    rl->tat_ns = tat + rl->interval_ns;
    return 0;
}
