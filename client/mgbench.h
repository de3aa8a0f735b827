/* mgbench's subcommands. */
#ifndef MGBENCH_H
#define MGBENCH_H

/* `mgbench transfer ...`: argv[0] is "transfer". Returns the exit status. */
int mgbench_transfer_main(int argc, char **argv);

/* `mgbench vram ...`: GPU memory moved through moongate (mgbench_vram.c). */
int mgbench_vram_main(int argc, char **argv);

/* Shared by the subcommands (mgbench_transfer.c). */
#include <stdint.h>
/* Registers a daemon-made segment of `bytes` on target (h2c or unix:); its id, or 0 (said on
 * standard error). */
uint64_t mgbench_register_segment(const char *target, const char *name, uint64_t bytes, int remote);
void mgbench_unregister_segment(const char *target, uint64_t id);
/* "64M", "1G", "4096": 0, or -1 when it is no size. */
int mgbench_parse_size(const char *s, uint64_t *out);

#endif
