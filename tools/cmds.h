/* cmds.h - the subcommands of the kvtier command, one file each. A command
 * gets the arguments after "kvtier" (argv[0] is its own name) and returns
 * the exit status: CLI_OK, CLI_FAIL or CLI_USAGE (util.h). */
#ifndef KVT_TOOLS_CMDS_H
#define KVT_TOOLS_CMDS_H

#include <stdio.h>

int cmd_demo(int argc, char **argv);  /* demo.c */
void demo_usage(FILE *f);
int cmd_bench(int argc, char **argv); /* bench.c */
void bench_usage(FILE *f);

#endif
