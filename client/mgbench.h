/* mgbench's subcommands. */
#ifndef MGBENCH_H
#define MGBENCH_H

/* `mgbench transfer ...`: argv[0] is "transfer". Returns the exit status. */
int mgbench_transfer_main(int argc, char **argv);

#endif
